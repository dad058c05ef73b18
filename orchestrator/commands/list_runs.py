"""`wmctl list`: the runs this machine knows, reconciled with where they run."""

from __future__ import annotations

import click

from .. import api

COLUMNS = ("RUN", "BACKEND", "STATUS", "ATTEMPTS", "STEP", "WATCHER")


@click.command("list", help="List runs recorded on this machine.")
def command():

    rows = [COLUMNS]
    for item in api.runs():
        rec = item.record
        if rec is None:
            rows.append((item.run, "-", "damaged", "-", "-", item.problem or "-"))
            continue
        last = rec.attempts[-1] if rec.attempts else None
        step = "-" if last is None or last.last_step is None else str(last.last_step)
        rows.append((rec.run, rec.backend, rec.status, str(len(rec.attempts)), step, item.watcher))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    for r in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1])
