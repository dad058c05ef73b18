"""`wmctl logs RUN [--node I] [--attempt N] [-f]`."""

from __future__ import annotations

import click

from .. import api


@click.command("logs", help="Print (or follow) the output of one node of a run.")
@click.argument("run")
@click.option("--node", type=int, default=0, show_default=True)
@click.option("--attempt", type=int, default=None, help="Default: the latest attempt.")
@click.option("-f", "--follow", is_flag=True)
def command(run, node, attempt, follow):

    for line in api.logs(run, node=node, attempt=attempt, follow=follow):
        click.echo(line)
