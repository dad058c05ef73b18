"""`wmctl render SPEC --backend ...`: print exactly what a backend would submit."""

from __future__ import annotations

from pathlib import Path

import click

from ..api import dryrun
from ._common import backend_option, load, overrides_from, plan_document, spec_options, write_out_dir


@click.command("render", help="Render what a backend would submit, without submitting anything.")
@spec_options
@backend_option
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one file per object into DIR instead of printing.")
@click.option("--attempt", type=click.IntRange(min=0), default=0, show_default=True,
              help="Render this attempt number.")
@click.option("--exclude-node", "exclude", multiple=True, help="Render with this node excluded (repeatable).")
@click.option("--auto-resume", "resume", is_flag=True, help="Check and render as for `--auto-resume`.")
def command(spec_path, set_flags, nodes, image_tag, vendor, namespace, backend, output, out_dir,
            attempt, exclude, resume):

    job = load(spec_path, overrides_from(set_flags, nodes, image_tag, vendor, namespace))
    plan = dryrun(job, backend, auto_resume=resume, attempt=attempt, exclude=tuple(exclude)).plan
    if out_dir is not None:
        for path in write_out_dir(plan, out_dir, output):
            click.echo(str(path))
        return
    click.echo(plan_document(plan, output), nl=False)
