"""matplotlib, loaded on first use: the optional ``wmctl[plot]`` extra. Only `wmctl plot -o FILE`
needs it; without it that command fails in one line naming the install (MissingExtra, exit 10)."""

from __future__ import annotations

from typing import Any

from ..errors import MissingExtra

INSTALL = "pip install 'wmctl[plot]'"


def figure(width_in: float, height_in: float) -> Any:
    """A new matplotlib Figure (no pyplot: no GUI backend, no global state)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtra(f"wmctl plot needs matplotlib, which cannot be imported here ({exc}): {INSTALL}, "
                           f"or use --terminal for a text chart") from None
    return Figure(figsize=(width_in, height_in), layout="constrained")
