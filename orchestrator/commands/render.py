"""`wmctl render SPEC --backend ...`: print exactly what a backend would submit."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import BACKEND_CHOICE, load, overrides_from, plan_document, spec_options, write_out_dir


def render_for(spec_path: Path, overrides: dict, backend: str, attempt: int = 0,
               exclude: tuple[str, ...] = (), resume: bool = False):
    from ..plan import AttemptContext
    from ..render import render_plan
    from ..spec import check_backend

    spec, profile = load(spec_path, overrides)
    check_backend(spec, backend, auto_resume=spec.restart.auto_resume or resume)
    ctx = AttemptContext(attempt=attempt, excluded_nodes=tuple(exclude), resume=resume or attempt > 0,
                         parent=attempt - 1 if attempt > 0 else None)
    return render_plan(spec, profile, backend, ctx)


@click.command("render", help="Render what a backend would submit, without submitting anything.")
@spec_options
@click.option("-b", "--backend", type=BACKEND_CHOICE, default="local", show_default=True)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one file per object into DIR instead of printing.")
@click.option("--attempt", type=int, default=0, show_default=True, help="Render this attempt number.")
@click.option("--exclude-node", "exclude", multiple=True, help="Render with this node excluded (repeatable).")
@click.option("--auto-resume", "resume", is_flag=True, help="Check and render as for `--auto-resume`.")
def command(spec_path, set_flags, nodes, image_tag, vendor, namespace, backend, output, out_dir,
            attempt, exclude, resume):
    overrides = overrides_from(set_flags, nodes, image_tag, vendor, namespace)
    plan = render_for(spec_path, overrides, backend, attempt, exclude, resume)
    if out_dir is not None:
        for path in write_out_dir(plan, out_dir, output):
            click.echo(str(path))
        return
    click.echo(plan_document(plan, output), nl=False)
