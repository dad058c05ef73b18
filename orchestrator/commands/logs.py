"""`wmctl logs RUN [--node I] [--attempt N] [-f]`."""

from __future__ import annotations

import click


@click.command("logs", help="Print (or follow) the output of one node of a run.")
@click.argument("run")
@click.option("--node", type=int, default=0, show_default=True)
@click.option("--attempt", type=int, default=None, help="Default: the latest attempt.")
@click.option("-f", "--follow", is_flag=True)
def command(run, node, attempt, follow):
    from ..backends import get_backend
    from ..backends.base import AttemptRef
    from ..state import RunStore

    record = RunStore(run).load()
    if not record.attempts:
        raise click.ClickException(f"run {run} has no attempts yet")
    n = record.attempts[-1].attempt if attempt is None else attempt
    backend = get_backend(record.backend, kube_context=record.kube_context, namespace=record.namespace)
    try:
        for line in backend.logs(AttemptRef(record.backend, run, n, record.namespace), node=node, follow=follow):
            click.echo(line)
    finally:
        backend.close()
