"""`wmctl describe RUN`: the run's events and decisions in order (attempts, failures with class and
evidence, the watcher's decisions, checkpoints, resumes, cancel).

``-o json|yaml``: a list of {time (ISO 8601, UTC), attempt, event, detail}; unknown values null."""

from __future__ import annotations

import click

from .. import runs
from ..timeline import DESCRIBE_KEYS
from ._output import emit, iso, output_option
from ._params import run_argument


@click.command("describe", help="Show a run's events and decisions in order: attempts, failures (class and "
                                "evidence), decisions, checkpoints, resumes, cancel.")
@run_argument
@output_option
def command(run, output):
    rows = [{**e, "time": iso(e["time"])} for e in runs.describe(run)]
    if output == "table":
        view = runs.status(run, reconcile=False)
        record = view.record
        assert record is not None   # status() raises RunNotFound for a run it cannot read
        click.echo(f"run {run}  backend {record.backend}  status {record.status}  "
                   f"watcher {view.watcher}")
    emit(rows, output, columns=DESCRIBE_KEYS)
