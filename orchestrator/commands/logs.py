"""`wmctl logs RUN [--node I | --all-nodes] [--attempt N] [-f] [--tail N] [--since DUR] [--timestamps] [--raw]
[--watcher]`: a run's output (kubectl logs and docker logs habits)."""

from __future__ import annotations

import collections
import time

import click

from .. import logview
from ._params import Duration, run_argument


@click.command("logs", help="Print (or follow) the output of a run's nodes, or of its detached watcher. "
                            "WMCTL-PROGRESS lines are hidden unless --raw.")
@run_argument
@click.option("--node", type=click.IntRange(min=0), default=None,
              help="Which node (0-based). Default: the node holding global rank 0 (said on stderr).")
@click.option("--all-nodes", is_flag=True, help="Every node, each line led by [node I].")
@click.option("--attempt", type=click.IntRange(min=0), default=None,
              help="Default: the latest attempt (and, with -f, the ones after it).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as lines come, into the run's next attempts.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N", help="Only the last N lines.")
@click.option("--since", type=Duration(), default=None, help="Only lines of the last DUR (10m, 2h).")
@click.option("--timestamps", is_flag=True, help="Lead each line with its time (RFC 3339, UTC).")
@click.option("--raw", is_flag=True, help="Keep the WMCTL-PROGRESS lines.")
@click.option("--watcher", is_flag=True, help="The detached watcher's lines (`submit --detach --auto-resume`).")
def command(run, node, all_nodes, attempt, follow, tail, since, timestamps, raw, watcher):
    if watcher:
        extra = [flag for flag, used in (("--since", since is not None), ("--timestamps", timestamps),
                                         ("--all-nodes", all_nodes), ("-f", follow)) if used]
        if extra:
            raise click.UsageError(f"{', '.join(extra)}: not with --watcher (its log is one file; --tail N works)")
        lines = logview.watcher_log(run)
        for line in (lines if tail is None else collections.deque(lines, maxlen=tail)):
            click.echo(line)
        return
    def shown(attempt: int, node: int, why: str) -> None:
        click.echo(f"wmctl: attempt {attempt}: node {node} ({why}); --node I or --all-nodes for others", err=True)

    lines = logview.logs(run, node=node, attempt=attempt, follow=follow, all_nodes=all_nodes, tail=tail,
                         since=None if since is None else time.time() - since, timestamps=timestamps, raw=raw,
                         shown=shown)
    for line in lines:
        click.echo(line)
