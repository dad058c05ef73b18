"""`wmctl submit SPEC`: start a run (local by default); --dry-run prints the exact plan."""

from __future__ import annotations

import click

from .. import api
from ._common import backend_option, display_for, interrupted_watch, load, overrides_from, plan_document, spec_options


@click.command("submit", help="Submit a job spec as a run. --dry-run prints what would be submitted.")
@spec_options
@backend_option
@click.option("--dry-run", is_flag=True, help="Print the plan (same output as `wmctl render`) and exit.")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--watch/--no-watch", "watch", default=None,
              help="Supervise the run after submitting (default: on with --auto-resume).")
@click.option("--auto-resume", is_flag=True, help="On node failure, resubmit from the latest checkpoint.")
@click.option("--context", "kube_context", default=None, help="Kubernetes context (kubeconfig).")
@click.option("--resume-from", "resume_from", default=None, metavar="RUN|PATH",
              help="Start from another run's newest checkpoint (or a checkpoint folder), on purpose: fine-tuning, "
                   "a changed world size. Used until this run has a checkpoint of its own.")
@click.option("--replace", is_flag=True, help="Replace an ended run of the same name (its checkpoints are kept).")
@click.option("--detach", is_flag=True, help="Return after submitting. With --auto-resume a detached watcher "
                                             "supervises the run (`wmctl logs RUN --watcher`).")
def command(spec_path, set_flags, nodes, image_tag, vendor, namespace, backend, dry_run, output, watch,
            auto_resume, kube_context, resume_from, replace, detach):

    job = load(spec_path, overrides_from(set_flags, nodes, image_tag, vendor, namespace))
    request = api.dryrun(job, backend, auto_resume=auto_resume, context=kube_context, resume_from=resume_from)
    if dry_run:
        request.backend.close()
        click.echo(plan_document(request.plan, output), nl=False)
        return
    watching = (request.auto_resume if watch is None else watch) and not detach
    run = job.spec.name
    with interrupted_watch(run), display_for(watching) as display:
        code = api.schedule(request, watch=watching, echo=display, show_state=display.state, replace=replace)
        if code == 0 and not watching:
            if request.auto_resume:
                pid = api.spawn_watcher(run, auto_resume=True)
                display(f"watcher {pid} supervises {run} with auto-resume; its lines: `wmctl logs {run} --watcher`")
            else:
                display(f"nothing will resume {run} if it fails (no watcher runs): `wmctl watch {run} --auto-resume` "
                        "starts one; `wmctl status` shows where it stands")
    raise SystemExit(code)
