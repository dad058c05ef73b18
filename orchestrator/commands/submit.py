"""`wmctl submit SPEC`: start a run (local by default); --dry-run prints the exact plan."""

from __future__ import annotations

import click

from ._common import BACKEND_CHOICE, overrides_from, plan_document, spec_options


@click.command("submit", help="Submit a job spec as a run. --dry-run prints what would be submitted.")
@spec_options
@click.option("-b", "--backend", type=BACKEND_CHOICE, default="local", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the plan (same output as `wmctl render`) and exit.")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--watch/--no-watch", "watch", default=None,
              help="Supervise the run after submitting (default: on with --auto-resume).")
@click.option("--auto-resume", is_flag=True, help="On node failure, resubmit from the latest checkpoint.")
@click.option("--context", "kube_context", default=None, help="Kubernetes context (kubeconfig).")
@click.option("--detach", is_flag=True, help="Return after submitting; watch later with `wmctl watch RUN`.")
def command(spec_path, set_flags, nodes, image_tag, vendor, namespace, backend, dry_run, output, watch,
            auto_resume, kube_context, detach):
    from .render import render_for

    overrides = overrides_from(set_flags, nodes, image_tag, vendor, namespace)
    if dry_run:
        plan = render_for(spec_path, overrides, backend, resume=auto_resume)
        click.echo(plan_document(plan, output), nl=False)
        return
    from ..submit import submit_and_maybe_watch

    code = submit_and_maybe_watch(spec_path, overrides, backend=backend, auto_resume=auto_resume,
                                  watch=(auto_resume if watch is None else watch) and not detach,
                                  kube_context=kube_context)
    raise SystemExit(code)
