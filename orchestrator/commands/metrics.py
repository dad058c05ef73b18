"""`wmctl metrics RUN`: the progress events a watcher kept (run folder's metrics.jsonl), as a table,
CSV or JSON, for a spreadsheet, a plot or a dashboard.

The columns are fixed (METRICS_COLUMNS): time (when the job printed the line, else when the
watcher saw it), attempt, event, step, loss, samples, the step time split (step_s, data, compute,
comm: shares of the step), the checkpoint (path, seconds), the resume's step and exactness, and
for the watcher's own failure events (``"by": "watcher"``) the failure class and the decision.
An unknown value is empty in CSV, null in JSON and - in the table."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from typing import Any, Iterator

import click

from .. import runs
from ._params import run_argument

METRICS_COLUMNS = ("time", "attempt", "event", "step", "loss", "samples", "step_s", "data", "compute", "comm",
                   "path", "seconds", "exact", "class", "decision")


def flat(event: dict[str, Any]) -> dict[str, Any]:
    """One event in the fixed columns."""
    timing = event.get("timing") or {}     # runtime.timing.classify's fields
    return {
        "time": event.get("time", event.get("seen")), "attempt": event.get("attempt"), "event": event.get("event"),
        "step": event.get("step", event.get("damaged_step")), "loss": event.get("loss"),
        "samples": event.get("samples"), "step_s": timing.get("step_s"),
        "data": timing.get("data_share"), "compute": timing.get("compute_share"), "comm": timing.get("comm_share"),
        "path": event.get("path"), "seconds": event.get("seconds"), "exact": event.get("exact"),
        "class": event.get("kind"), "decision": event.get("decision"),      # the watcher's failure events
    }


@click.command("metrics", help="Print the progress events kept for a run (steps, loss, timing, checkpoints).")
@run_argument
@click.option("--attempt", type=click.IntRange(min=0), default=None, help="Only this attempt's events.")
@click.option("-o", "--output", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def command(run, attempt, output):
    # The events are read as a stream and printed as they come: memory stays flat however long the
    # run (a table reads them twice, its column widths first).
    rows = (flat(e) for e in runs.iter_metrics(run, attempt))
    if output == "json":
        _echo_json(rows)
        return
    if output == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=METRICS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
            click.echo(buf.getvalue(), nl=False)
            buf.seek(0)
            buf.truncate()
        click.echo(buf.getvalue(), nl=False)        # the header of a run without events
        return
    shown = ("attempt", "event", "step", "loss", "samples", "step_s", "seconds", "class")
    header = tuple(c.upper() for c in shown)
    widths = [len(c) for c in header]
    for cells in _cells(rows, shown):
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    click.echo("  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip())
    for cells in _cells((flat(e) for e in runs.iter_metrics(run, attempt)), shown):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip())


def _cells(rows: Iterator[dict[str, Any]], shown: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """A table's cells of each row."""
    for row in rows:
        yield tuple("-" if row[c] is None else (f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]))
                    for c in shown)


def _echo_json(rows: Iterator[dict[str, Any]]) -> None:
    """What ``json.dumps(list(rows), indent=2)`` prints, a row at a time."""
    first = next(rows, None)
    if first is None:
        click.echo("[]")
        return
    click.echo("[")
    prev = first
    for row in rows:
        click.echo(textwrap.indent(json.dumps(prev, indent=2), "  ") + ",")
        prev = row
    click.echo(textwrap.indent(json.dumps(prev, indent=2), "  "))
    click.echo("]")
