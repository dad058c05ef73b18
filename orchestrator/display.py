"""What a watcher shows while it supervises a run.

Two forms of one stream. Every event is a line (CI logs, `| tee`, `nohup` keep them), stamped in
ISO 8601 with date and zone, at the time of what it reports (a watcher attaching to a running
attempt replays its output: those lines keep their own times). On a terminal, a live panel under
the scrolling lines shows the state at a glance (orchestrator.panel builds its rows; this module
only draws them): a fixed width of at most 80 columns, the cursor hidden while it runs, no colour
under NO_COLOR, and plain lines on TERM=dumb or with ``--plain``. rich is imported only then.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

import click

from . import panel as P
from .state import RunRecord
from .stragglers import entry_text
from .watchview import News

DUMB_TERMS = ("dumb", "unknown")
REFRESH_PER_SECOND = 2       # ages and the backoff countdown move on their own between events


def iso_stamp(at: float | None = None) -> str:
    """ISO 8601 local time with its zone (``Z`` for UTC), to the second."""
    when = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc).astimezone()
    text = when.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class PlainDisplay:
    """Lines only: what pipes, files, CI and `--plain` get. No escape code is ever written."""

    def line(self, text: str, at: float | None = None) -> None:
        click.echo(f"{iso_stamp(at)} {text}")

    def news(self, news: News) -> None:
        """Nothing to redraw: every change already printed a line."""

    def close(self) -> None:
        pass

    # a command's own lines: display(text)
    def __call__(self, text: str) -> None:
        self.line(text)


class LiveDisplay(PlainDisplay):
    """Lines scroll above a panel that is redrawn in place (rich.live), twice a second."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console()
        self.unicode = (self.console.encoding or "").lower().startswith("utf")
        self.state = P.PanelState()
        self._lock = threading.Lock()
        # Started by the first news: a command refused before any attempt leaves no empty box behind.
        self._live = Live(console=self.console, auto_refresh=True, refresh_per_second=REFRESH_PER_SECOND,
                          transient=False, get_renderable=self._render)
        self._started = False

    def line(self, text: str, at: float | None = None) -> None:
        from rich.text import Text

        when = datetime.fromtimestamp(time.time() if at is None else at)
        # The time of day, with the date for what happened on another day (a replayed attempt).
        shown = f"{when:%H:%M:%S}" if when.date() == datetime.now().date() else f"{when:%Y-%m-%d %H:%M:%S}"
        self.console.print(Text(f"[{shown}] {text}"), soft_wrap=True, highlight=False)

    def news(self, news: News) -> None:
        with self._lock:
            self.state.fold(news)
        if not self._started:
            self._started = True
            self._live.start()
        self._live.refresh()

    def close(self) -> None:
        if self._started:
            self._live.stop()

    def _render(self) -> Any:
        with self._lock:
            return render_panel(self.state, time.time(), min(P.WIDTH, self.console.width), self.unicode)


TONES = {P.OK: "green", P.WARN: "yellow", P.BAD: "red", P.DIM: "dim", P.PLAIN: ""}


def render_panel(state: P.PanelState, now: float, width: int, unicode: bool = True) -> Any:
    """The panel as a rich renderable exactly ``width`` columns wide."""
    from rich import box
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    inner = max(10, width - 4)       # two borders, one space of padding each side
    lines = [Text(text, style=TONES.get(tone, ""), no_wrap=True, overflow="crop")
             for text, tone in P.fit(P.rows(state, now, unicode), inner, unicode)]
    title = P.clip(P.title(state, unicode), inner - 4, unicode).rstrip()
    return Panel(Group(*lines), title=title, title_align="left", width=width, padding=(0, 1),
                 box=box.ROUNDED if unicode else box.ASCII)


def wants_plain(plain: bool = False, stream: Any = None, env: Any = None) -> bool:
    """Lines instead of the panel: asked for, not a terminal, or a terminal that cannot redraw."""
    stream = sys.stdout if stream is None else stream
    env = os.environ if env is None else env
    return plain or not stream.isatty() or env.get("TERM", "") in DUMB_TERMS


def make_display(plain: bool = False) -> PlainDisplay:
    return PlainDisplay() if wants_plain(plain) else LiveDisplay()


# ---- what a run's lines and report say -----------------------------------------------------------

STEP_PARTS = ("compute", "data", "comm", "other")


def step_line(progress: dict[str, Any]) -> str:
    """One step report as a line: loss, then where the step's time went, largest part first (the
    first part is the bottleneck). At most three parts, none under 1%, so that a stamped line of a
    run up to step 99,999 fits 100 columns.

    >>> step_line({"step": 300, "loss": 0.0059, "timing": {"step_s": 0.0604, "bottleneck": "compute",
    ...     "compute_share": 0.56, "data_share": 0.27, "comm_share": 0.16, "other_share": 0.01}})
    'step 300 loss 0.0059, 60.4 ms: compute 56% data 27% comm 16%'
    """
    text = f"step {progress.get('step')}"
    loss = progress.get("loss")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        text += f" loss {loss:.4g}"
    elif isinstance(loss, str):
        text += f" loss {loss[:12]}"
    timing = progress.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("step_s"), (int, float)):
        text += f", {timing['step_s'] * 1000:.1f} ms"
        shares = [(part, timing.get(f"{part}_share")) for part in STEP_PARTS]
        measured = [(part, float(v)) for part, v in shares
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0.005]
        ranked = sorted(measured, key=lambda pv: -pv[1])[:3]
        if ranked:
            text += ":" + "".join(f" {part} {v * 100:.0f}%" for part, v in ranked)
    return text


def steps_redone(record: RunRecord) -> list[int]:
    """Per failure: steps the next attempt computed again (last step reached - resumed step)."""
    out = []
    for prev, nxt in zip(record.attempts, record.attempts[1:], strict=False):
        if prev.last_step is not None:
            out.append(max(0, prev.last_step - (nxt.resumed_from_step or 0)))
    return out


def step_text(step: int | None) -> str:
    """A step for a line a user reads: ``-`` for a job that reports none (no runtime, no progress)."""
    return "-" if step is None else str(step)


def summary(record: RunRecord) -> str:
    lines = [f"run {record.run} ({record.backend}): {record.status}, {len(record.attempts)} attempt(s)"]
    for a in record.attempts:
        parts = [f"  attempt {a.attempt}: {a.outcome or 'running'}"]
        if a.resumed_from_step is not None:
            parts.append(f"resumed from step {a.resumed_from_step}"
                         + (f" (not exact: {a.resume_not_exact})" if a.resume_not_exact else ""))
        if a.last_step is not None:
            parts.append(f"reached step {a.last_step}")
        if a.last_checkpoint_step is not None:
            parts.append(f"last checkpoint {a.last_checkpoint_step}")
        if a.evidence:
            parts.append(a.evidence)
        if a.excluded_nodes:
            parts.append(f"excluded {','.join(a.excluded_nodes)}")
        for rec in a.recoveries:      # spare nodes (docs/spares.md): inside the attempt, no new one
            parts.append(f"in place: node {rec.get('lost_node')} replaced at step {rec.get('step')} by spare node "
                         f"{rec.get('spare_node')}, resumed from checkpoint {rec.get('checkpoint_step')}"
                         + (f", new spare node {rec['replenished']}" if rec.get("replenished") is not None else ""))
        parts += [f"straggler {entry_text(s)}" for s in a.stragglers]
        lines.append("; ".join(parts))
        lines += [f"    | {text}" for text in a.error]
    redone = steps_redone(record)
    if redone:
        lines.append(f"  steps redone per failure: {redone}")
    return "\n".join(lines)
