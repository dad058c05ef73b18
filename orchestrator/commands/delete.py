"""`wmctl delete RUN`: remove an ended run (its record and what it left on its backend)."""

from __future__ import annotations

import click

from .. import runs
from ._common import echo_line
from ._params import run_argument


@click.command("delete", help="Remove an ended run: its record, logs and leftover objects (never its checkpoints).")
@run_argument
def command(run):

    record = runs.delete(run, echo=echo_line)
    where = (record.spec or {}).get("checkpoint", {}).get("dir")
    kept = f"; its checkpoints under {where} are kept" if where else ""
    click.echo(f"deleted run {run} ({record.status}){kept}")
