"""`wmctl logs RUN [--node I] [--attempt N] [-f] [--watcher]`."""

from __future__ import annotations

import click

from .. import api


@click.command("logs", help="Print (or follow) the output of one node of a run, or of its detached watcher.")
@click.argument("run")
@click.option("--node", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--attempt", type=click.IntRange(min=0), default=None, help="Default: the latest attempt.")
@click.option("-f", "--follow", is_flag=True)
@click.option("--watcher", is_flag=True, help="The detached watcher's lines (`submit --detach --auto-resume`).")
def command(run, node, attempt, follow, watcher):

    lines = api.watcher_log(run) if watcher else api.logs(run, node=node, attempt=attempt, follow=follow)
    for line in lines:
        click.echo(line)
