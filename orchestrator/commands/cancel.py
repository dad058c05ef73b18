"""`wmctl cancel RUN`: tear down every attempt of a run. ``-o json|yaml``: the run afterwards, in
`wmctl list`'s row schema."""

from __future__ import annotations

import click

from .. import runs
from ._output import FORMATS, emit, run_result
from .list_runs import COLUMNS
from ._params import run_argument


@click.command("cancel", help="Cancel a run: tear down every attempt's processes, containers or objects.")
@run_argument
@click.option("--graceful", is_flag=True, help="SIGTERM first so the job can checkpoint (local and Docker).")
@click.option("-o", "--output", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: one line; json or yaml: the run in `wmctl list`'s schema.")
def command(run, graceful, output):

    record = runs.cancel(run, graceful=graceful)
    if output == "table":
        click.echo(f"cancelled {run} ({record.status})")
        return
    emit(run_result(run), output, columns=[c.lower() for c in COLUMNS])
