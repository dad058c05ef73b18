"""What a watcher shows while it supervises a run.

Two forms of one stream. Every event is a timestamped line (CI logs, `| tee`, `nohup` keep them);
on a terminal, a live panel under the scrolling lines also shows the state at a glance: attempt,
each node's phase and host, last step and checkpoint, and every failure so far with its class and
evidence. rich is imported only on a terminal, when the watch starts.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click


def stamp(line: str) -> str:
    return f"[{time.strftime('%H:%M:%S')}] {line}"


class PlainDisplay:
    """Lines only: what pipes, files and CI get."""

    def line(self, text: str) -> None:
        click.echo(stamp(text))

    def state(self, record: Any, attempt: Any, nodes: list[Any]) -> None:
        """Nothing to redraw: every change already printed a line."""

    def close(self) -> None:
        pass

    # the supervisor takes a plain callable for its lines
    __call__ = line


class LiveDisplay(PlainDisplay):
    """Lines scroll above a panel that is redrawn in place (rich.live)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self._live = Live(console=self.console, auto_refresh=False, transient=False)
        self._live.start()

    def line(self, text: str) -> None:
        from rich.markup import escape

        self.console.print(escape(stamp(text)), highlight=False, soft_wrap=True)

    __call__ = line

    def state(self, record: Any, attempt: Any, nodes: list[Any]) -> None:
        self._live.update(render_panel(record, attempt, nodes), refresh=True)

    def close(self) -> None:
        self._live.stop()


def render_panel(record: Any, attempt: Any, nodes: list[Any]):
    from rich.panel import Panel
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_row("attempt", str(attempt.attempt))
    table.add_row("step", "-" if attempt.last_step is None else str(attempt.last_step))
    table.add_row("checkpoint", "-" if attempt.last_checkpoint_step is None else str(attempt.last_checkpoint_step))
    if attempt.resumed_from_step is not None:
        table.add_row("resumed from", str(attempt.resumed_from_step))
    for n in nodes:
        table.add_row(f"node {n.node}", f"{n.phase}" + (f" on {n.host}" if n.host else "")
                      + (f" (exit {n.exit_code})" if n.exit_code is not None else ""))
    for a in record.attempts:
        if a.outcome and a.outcome != "succeeded":
            table.add_row(f"attempt {a.attempt}", f"{a.outcome}: {a.evidence or ''} -> {a.decision or ''}")
    return Panel(table, title=f"{record.run} on {record.backend}: {record.status}", expand=False)


def make_display(force_plain: bool = False) -> PlainDisplay:
    if force_plain or not sys.stdout.isatty():
        return PlainDisplay()
    return LiveDisplay()
