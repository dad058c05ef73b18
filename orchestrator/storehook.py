"""Which module keeps run state for a WMCTL_RUN_STORE name: the backend registry answers (a
backend declares its ``run_store``) and sets the answer here when it loads; ``state.open_store``
asks. It sits under both, so state never imports the backends, and loading the registry (a dry
run does) does not load state (a dry run records nothing).
"""

from __future__ import annotations

from typing import Callable

Resolver = Callable[[str], "tuple[str | None, list[str]]"]

_resolver: Resolver | None = None


def set_store_resolver(resolver: Resolver) -> None:
    """``resolver(name)`` -> (module path or None, every name that offers a store)."""
    global _resolver
    _resolver = resolver


def resolve(name: str) -> tuple[str | None, list[str]]:
    """(the module keeping run state for ``name``, or None; every name that offers a store)."""
    return _resolver(name) if _resolver is not None else (None, [])
