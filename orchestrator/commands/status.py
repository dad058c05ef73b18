"""`wmctl status RUN`: attempts, failures, last step and checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from .. import api
from ..supervisor import steps_redone, summary


@click.command("status", help="Show a run's attempts, failures, last step and checkpoint.")
@click.argument("run")
@click.option("-o", "--output", type=click.Choice(["text", "yaml", "json"]), default="text", show_default=True)
def command(run, output):
    record = api.status(run)
    if output == "text":
        click.echo(summary(record))
        return
    data = {**asdict(record), "steps_redone": steps_redone(record)}
    data.pop("spec", None)      # the resolved spec is for watchers; `wmctl render` shows a plan
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        import yaml
        click.echo(yaml.safe_dump(data, sort_keys=False))
