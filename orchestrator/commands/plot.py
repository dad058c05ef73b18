"""`wmctl plot RUN`: loss and throughput against step, attempt boundaries, failures (with their
class) and resumes marked, the steps redone after a resume shaded. To an image file (matplotlib,
the `wmctl[plot]` extra) or, with --terminal, as a text chart on stdout (no extra)."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import click

from .. import runs
from ..errors import OptionError, RunNotFound
from ..plot import data as plotdata
from ._params import run_argument


@click.command("plot", help="Draw a run's loss and throughput against step, with its failures, resumes and "
                            "redone steps marked.")
@run_argument
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Image file to write (.png, .svg or .pdf; default RUN.png). Needs `pip install 'wmctl[plot]'`.")
@click.option("--attempt", type=click.IntRange(min=0), default=None, help="Only this attempt.")
@click.option("--terminal", is_flag=True, help="Print a text chart instead (no extra needed; for SSH sessions).")
def command(run, output, attempt, terminal):
    if output is not None:
        _check_output(output)
    record = runs.status(run, reconcile=False).record
    events = runs.iter_metrics(run)      # read as a stream: only the plot's points are held
    attempts = [asdict(a) for a in record.attempts] if record is not None else []
    data = plotdata.build(run, events, attempts, only_attempt=attempt)
    if attempt is not None and not data.series:
        raise RunNotFound(f"--attempt {attempt}: run {run} has no attempt {attempt}",
                          hint=f"`wmctl status {run}` lists its attempts")
    if terminal:
        from ..plot import text

        width = shutil.get_terminal_size((80, 24)).columns
        click.echo(text.render(data, width=min(width, 160)), nl=False)
        if output is None:
            return
    from ..plot import image

    path = image.save(data, output if output is not None else Path(f"{run}.png"))
    note = "" if not data.empty else " (no progress lines kept yet: attempts only)"
    click.echo(f"wrote {path}{note}")


def _check_output(path: Path) -> None:
    from ..plot.image import FORMATS

    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise OptionError(f"-o {path}: unknown picture format {fmt or '(no suffix)'!r}",
                          hint=f"name the file with one of {', '.join('.' + f for f in FORMATS)}")
    if not path.parent.is_dir():
        raise OptionError(f"-o {path}: the folder {path.parent} does not exist", hint="create it, or pick another path")
