"""`wmctl list`: the runs this machine knows, reconciled with where they run.

``-o json`` and ``-o yaml`` print a list of rows with a fixed schema (README, "wmctl list -o
json"): run, backend, status, attempts, step, watcher {state, pid, host, beat_age_s}, problem.
An unknown value is null there and ``-`` in the table; never ``None``."""

from __future__ import annotations

from typing import Any

import click

from .. import runs
from ..serialize import dump
from .status import watcher_data

COLUMNS = ("RUN", "BACKEND", "STATUS", "ATTEMPTS", "STEP", "WATCHER")


def row(item: runs.RunView) -> dict[str, Any]:
    """One run in list's schema."""
    rec = item.record
    if rec is None:
        return {"run": item.run, "backend": None, "status": "damaged", "attempts": None, "step": None,
                "watcher": watcher_data(item), "problem": item.problem}
    last = rec.attempts[-1] if rec.attempts else None
    return {"run": rec.run, "backend": rec.backend, "status": rec.status, "attempts": len(rec.attempts),
            "step": None if last is None else last.last_step, "watcher": watcher_data(item), "problem": None}


@click.command("list", help="List runs recorded on this machine.")
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
def command(output):
    items = runs.runs()
    if output != "table":
        rows = [row(item) for item in items]
        click.echo(dump(rows, output, stream=False), nl=False)
        return
    table: list[tuple[str, ...]] = [tuple(COLUMNS)]
    for item in items:
        data = row(item)
        watcher = item.problem or "-" if item.record is None else item.watcher
        table.append(tuple("-" if v is None else str(v)
                           for v in (data["run"], data["backend"], data["status"], data["attempts"], data["step"]))
                     + (watcher,))
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS) - 1)]
    for line in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1])
