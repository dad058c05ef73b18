"""Draw PlotData to an image file (PNG, SVG or PDF) with matplotlib, written atomically.

Two panels sharing the step axis: loss above, throughput below. Each attempt has its own colour;
a dashed line marks where an attempt started (the step it resumed from), a red line and cross
where one failed (with its class), orange shading the steps redone after a resume, and small
grey triangles along the bottom the committed checkpoints."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..adaptors import matplotlib as mpl
from .data import PlotData, Series, exactness

FORMATS = ("png", "svg", "pdf")
REDONE_COLOUR = "tab:orange"
FAILURE_COLOUR = "tab:red"
LOG_SCALE_RATIO = 20


def colour(attempt: int) -> str:
    # C3 is matplotlib's red: kept for failures, so attempts skip it.
    return f"C{[0, 2, 4, 1, 5, 6, 7, 8, 9][attempt % 9]}"


def _loss_at(series: list[Series], attempt: int, step: int) -> float | None:
    for s in series:
        if s.attempt == attempt and step in s.steps:
            return s.loss[s.steps.index(step)]
    return None


def draw(data: PlotData) -> Any:
    """The matplotlib Figure of ``data``."""
    fig = mpl.figure(10, 6)
    ax_loss, ax_rate = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    for i, s in enumerate(data.series):
        # Later attempts thinner: where an exact resume redoes the same losses, both stay visible.
        kw = {"color": colour(s.attempt), "label": f"attempt {s.attempt}", "linewidth": max(1.0, 3.0 - 1.1 * i)}
        ax_loss.plot(s.steps, s.loss, marker="." if len(s.steps) <= 60 else None, **kw)
        ax_rate.plot(s.rate_steps, s.rate, **kw)
    for i, r in enumerate(data.redone):
        for ax in (ax_loss, ax_rate):
            ax.axvspan(r.first - 1, r.last, color=REDONE_COLOUR, alpha=0.22, linewidth=0,
                       label="steps redone" if i == 0 and ax is ax_loss else None)
    for b in data.boundaries:
        for ax in (ax_loss, ax_rate):
            ax.axvline(b.step, color=colour(b.attempt), linestyle="--", linewidth=1.2)
        how = f"resumes @ {b.step}" + exactness(b) if b.resumed else "starts from 0"
        ax_loss.annotate(f"attempt {b.attempt}\n{how}", (b.step, 1.0), xycoords=ax_loss.get_xaxis_transform(),
                         xytext=(4, -4), textcoords="offset points", va="top", fontsize=8, color=colour(b.attempt))
    for f in data.failures:
        if f.step is None:
            continue
        for ax in (ax_loss, ax_rate):
            ax.axvline(f.step, color=FAILURE_COLOUR, linewidth=1.2)
        y = _loss_at(data.series, f.attempt, f.step)
        if y is not None:
            ax_loss.plot([f.step], [y], marker="X", markersize=11, color=FAILURE_COLOUR, linestyle="none")
        ax_loss.annotate(f"attempt {f.attempt} failed\n{f.kind} @ {f.step}", (f.step, 0.5),
                         xycoords=ax_loss.get_xaxis_transform(), xytext=(-4, 0), textcoords="offset points",
                         ha="right", fontsize=8, color=FAILURE_COLOUR)
    if data.checkpoints:
        steps = [s for _, s in data.checkpoints]
        ax_loss.plot(steps, [0.03] * len(steps), transform=ax_loss.get_xaxis_transform(), marker="^",
                     markersize=7, linestyle="none", color="0.4", label="checkpoint", clip_on=False)
    losses = [v for s in data.series for v in s.loss]
    if losses and min(losses) > 0 and max(losses) / min(losses) >= LOG_SCALE_RATIO:
        ax_loss.set_yscale("log")        # a loss that falls by decades: the late steps stay readable
    ax_loss.set_title(data.title())
    ax_loss.set_ylabel("loss")
    ax_rate.set_ylabel(data.rate_unit)
    ax_rate.set_xlabel("step")
    ax_rate.locator_params(axis="x", integer=True)
    for ax in (ax_loss, ax_rate):
        ax.grid(True, alpha=0.3)
    ax_loss.legend(loc="upper right", fontsize=8)
    return fig


def save(data: PlotData, path: Path) -> Path:
    """Draw ``data`` to ``path`` (its suffix picks the format), atomically: a reader never sees a
    half-written picture, and a failed draw leaves an older one in place."""
    fmt = path.suffix.lower().lstrip(".")
    fig = draw(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=110)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), _new_file_mode())     # mkstemp's 0600 would hide it from others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _new_file_mode() -> int:
    """The mode open() would give a new file: 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
