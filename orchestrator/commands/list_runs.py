"""`wmctl list`: the runs this machine knows."""

from __future__ import annotations

import click


@click.command("list", help="List runs recorded on this machine.")
def command():
    from ..state import RunStore, list_runs

    for run in list_runs():
        rec = RunStore(run).load()
        last = rec.attempts[-1] if rec.attempts else None
        step = last.last_step if last else None
        click.echo(f"{run}\t{rec.backend}\t{rec.status}\tattempts={len(rec.attempts)}\tstep={step}")
