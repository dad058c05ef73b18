"""`wmctl list`: the runs this machine knows."""

from __future__ import annotations

import click

from .. import api


@click.command("list", help="List runs recorded on this machine.")
def command():

    for item in api.runs():
        rec = item.record
        if rec is None:
            click.echo(f"{item.run}\t-\tdamaged\t{item.problem}")
            continue
        last = rec.attempts[-1] if rec.attempts else None
        step = "-" if last is None or last.last_step is None else last.last_step
        click.echo(f"{item.run}\t{rec.backend}\t{rec.status}\tattempts={len(rec.attempts)}\tstep={step}")
