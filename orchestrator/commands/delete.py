"""`wmctl delete RUN`: remove an ended run (its record and what it left on its backend)."""

from __future__ import annotations

import click

from .. import runs
from ._common import echo_line
from ._params import run_argument


@click.command("delete", help="Remove an ended run: its record, logs and leftover objects (never its checkpoints).")
@run_argument
def command(run):

    record = runs.delete(run, echo=echo_line)
    where = (record.spec or {}).get("checkpoint", {}).get("dir")
    kept = f"; its checkpoints under {_on_this_machine(record, where)} are kept" if where else ""
    click.echo(f"deleted run {run} ({record.status}){kept}")


def _on_this_machine(record, where: str) -> str:
    """A container's checkpoint folder named as the host folder that holds it (Docker host_path),
    since that is the folder a user looks for and may delete."""
    from pathlib import Path

    from ..backends import backend_class
    from ..backends.host_paths import on_host
    from ..errors import WmctlError

    try:
        here = backend_class(record.backend).host_paths_here
    except WmctlError:
        return where
    if not here or not record.spec:
        return where
    from ..errors import SpecError
    from ..specload import from_dict

    try:
        spec = from_dict(record.spec, source_dir=Path(record.source_dir or "."))
    except SpecError:
        return where
    folder = on_host(spec, where)
    return f"{folder} (the containers' {where})" if folder is not None else where
