"""`wmctl cancel RUN`: tear down every attempt of a run."""

from __future__ import annotations

import click


@click.command("cancel", help="Cancel a run: tear down every attempt's processes, containers or objects.")
@click.argument("run")
@click.option("--graceful", is_flag=True, help="SIGTERM first so the job can checkpoint (local backend).")
def command(run, graceful):
    from ..backends import get_backend
    from ..state import RunStore

    store = RunStore(run)
    record = store.load()
    backend = get_backend(record.backend, kube_context=record.kube_context, namespace=record.namespace)
    try:
        for ref in backend.attempts(run):
            if graceful and record.backend == "local":
                backend.cancel(ref, graceful=True)
            else:
                backend.cancel(ref)
    finally:
        backend.close()
    if record.status == "running":
        record.status = "failed"
        record.final_report = f"run {run} cancelled by the user"
        if record.attempts and record.attempts[-1].outcome is None:
            record.attempts[-1].outcome = "cancelled"
        store.save(record)
    click.echo(f"cancelled {run}")
