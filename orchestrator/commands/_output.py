"""How commands print results: ``-o table`` (the human format, one name everywhere), ``json`` or
``yaml`` with a fixed schema. An unknown value is ``-`` in a table and null in JSON/YAML: never
the word None."""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Sequence

import click

from ..serialize import dump

FORMATS = ("table", "json", "yaml")


def output_option(func: Callable) -> Callable:
    return click.option("-o", "--output", type=click.Choice(FORMATS), default="table", show_default=True,
                        help="table for people; json or yaml (fixed schema, README) for scripts.")(func)


def iso(t: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC (what JSON and YAML carry), None when unknown."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """Rows under a header of ``columns`` (keys, upper-cased), the last column unpadded."""
    body = [tuple(c.upper() for c in columns)] + [tuple(cell(r.get(c)) for c in columns) for r in rows]
    widths = [max(len(r[i]) for r in body) for i in range(len(columns) - 1)]
    return "".join("  ".join([*(v.ljust(w) for v, w in zip(r, widths, strict=False)), r[-1]]).rstrip() + "\n"
                   for r in body)


def emit(data: Any, output: str, *, columns: Sequence[str] | None = None) -> None:
    """Print ``data`` (one result, or a list of rows with ``columns``) in ``output``."""
    if output == "table":
        rows = data if isinstance(data, list) else [data]
        click.echo(table(columns or list(rows[0]) if rows else columns or [], rows), nl=False)
        return
    click.echo(dump(data, output, stream=False), nl=False)


def StderrLines() -> Any:
    """The watcher's lines on stderr (ISO-stamped, as piped), when stdout carries ``-o json|yaml``."""
    from ..display import PlainDisplay, iso_stamp

    class _Lines(PlainDisplay):
        def line(self, text: str, at: float | None = None) -> None:
            click.echo(f"{iso_stamp(at)} {text}", err=True)

    return _Lines()


def run_result(run: str) -> dict[str, Any]:
    """What `submit` and `cancel` print with -o json|yaml: the run in `wmctl list`'s row schema."""
    from .. import runs
    from .list_runs import row

    return row(runs.status(run))
