"""`wmctl prune --older-than DUR`: delete the runs that ended more than DUR ago (`wmctl delete` on each:
record, logs and leftover objects; never checkpoints, never a running run)."""

from __future__ import annotations

import click

from .. import runs
from ._common import echo_line
from ._params import Duration


@click.command("prune", help="Delete runs that ended more than DUR ago (never a running run, never checkpoints).")
@click.option("--older-than", "older_than", type=Duration(), required=True, help="e.g. 7d, 12h, 30m.")
@click.option("--dry-run", is_flag=True, help="Only list the runs that would be deleted.")
def command(older_than, dry_run):
    done = runs.prune(older_than, echo=echo_line, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(done)} run(s)" + (f": {', '.join(done)}" if done else "")
               + ("" if dry_run or not done else "; their checkpoints are kept"))
