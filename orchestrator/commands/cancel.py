"""`wmctl cancel RUN`: tear down every attempt of a run."""

from __future__ import annotations

import click

from .. import api


@click.command("cancel", help="Cancel a run: tear down every attempt's processes, containers or objects.")
@click.argument("run")
@click.option("--graceful", is_flag=True, help="SIGTERM first so the job can checkpoint (local and Docker).")
def command(run, graceful):

    record = api.cancel(run, graceful=graceful)
    click.echo(f"cancelled {run} ({record.status})")
