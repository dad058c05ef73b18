"""`wmctl status RUN`: attempts, failures, last step and checkpoint, and who watches the run."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import click

from .. import runs
from ..display import steps_redone, summary
from ..serialize import dump
from ._params import run_argument


@click.command("status", help="Show a run's attempts, failures, last step and checkpoint.")
@run_argument
@click.option("-o", "--output", type=click.Choice(["table", "yaml", "json"]), default="table", show_default=True)
def command(run, output):
    view = runs.status(run)
    record = view.record
    assert record is not None       # status() raises RunNotFound for a run it cannot read
    if output == "table":
        click.echo(summary(record))
        click.echo(f"  watcher: {view.watcher}")
        if view.note:
            click.echo(f"  note: {view.note}")
        return
    data = {**asdict(record), "steps_redone": steps_redone(record), "watcher": watcher_data(view)}
    data.pop("spec", None)      # the resolved spec is for watchers; `wmctl render` shows a plan
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(dump(data, "yaml"), nl=False)


def watcher_data(view: runs.RunView) -> dict:
    """The watcher in a fixed shape: state, pid, host, beat_age_s (null when nobody watches)."""
    if view.lease is None:
        return {"state": "unwatched" if view.record is not None else "unknown", "pid": None, "host": None,
                "beat_age_s": None}
    return {"state": "watched", "pid": view.lease.pid, "host": view.lease.host,
            "beat_age_s": round(view.lease.age(time.time()), 1)}
