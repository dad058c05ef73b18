"""`wmctl submit SPEC`: start a run (local by default); --dry-run prints the exact plan."""

from __future__ import annotations

import contextlib
import gc

import click

from .. import api
from ._common import (backend_option, display_for, interrupted_watch, load, overrides_from, plain_option, plan_document,
                      spec_options)
from ._output import FORMATS, StderrLines, emit, run_result


@click.command("submit", help="Submit a job spec as a run. --dry-run prints what would be submitted.")
@spec_options
@backend_option
@click.option("--dry-run", is_flag=True, help="Print the plan (same output as `wmctl render`) and exit.")
@click.option("-o", "--output", type=click.Choice(FORMATS), default=None,
              help="With --dry-run: the plan as yaml (default) or json. Otherwise: table (default: the watcher's "
                   "lines), or json/yaml: the run at the end, in `wmctl list`'s schema (lines go to stderr).")
@click.option("--watch/--no-watch", "watch", default=None,
              help="Supervise the run after submitting (default: on with --auto-resume).")
@click.option("--auto-resume", is_flag=True, help="On node failure, resubmit from the latest checkpoint.")
@click.option("--context", "kube_context", default=None, help="Kubernetes context (kubeconfig).")
@click.option("--kubeconfig", default=None,
              help="Kubernetes config file(s), ':'-separated as in $KUBECONFIG (default: $KUBECONFIG, then "
                   "~/.kube/config); kept in the run record for later commands.")
@click.option("--resume-from", "resume_from", default=None, metavar="RUN|PATH",
              help="Start from another run's newest checkpoint (or a checkpoint folder), on purpose: fine-tuning, "
                   "a changed world size. Used until this run has a checkpoint of its own.")
@click.option("--replace", is_flag=True, help="Replace an ended run of the same name (its checkpoints are kept).")
@click.option("--detach", is_flag=True, help="Return after submitting. With --auto-resume a detached watcher "
                                             "supervises the run (`wmctl logs RUN --watcher`).")
@click.option("--in-cluster", "in_cluster", is_flag=True,
              help="Return after submitting; the run's watcher runs in the cluster (kubernetes.watcher_image) and "
                   "its state is kept there (WMCTL_RUN_STORE=kubernetes), for status/watch/cancel from any machine.")
@plain_option
def command(spec_path, set_flags, nodes, image_tag, vendor, namespace, backend, dry_run, output, watch,
            auto_resume, kube_context, kubeconfig, resume_from, replace, detach, in_cluster, plain):

    if not dry_run:
        gc.enable()      # the cli may have left collection off for what looked like a dry run
    if dry_run and output == "table":
        raise click.UsageError("-o table: a plan prints as yaml or json")
    job = load(spec_path, overrides_from(set_flags, nodes, image_tag, vendor, namespace))
    request = api.dryrun(job, backend, auto_resume=auto_resume, context=kube_context, kubeconfig=kubeconfig,
                         resume_from=resume_from)
    if dry_run:
        request.backend.close()
        click.echo(plan_document(request.plan, output or "yaml"), nl=False)
        return
    place = api.place_watcher(request, watch=watch, detach=detach, in_cluster=in_cluster)
    run = job.spec.name
    watching = place.where == api.HERE
    # An in-cluster watcher may not hold the run yet when submit returns: reading the run here
    # for -o would reconcile it under that watcher's feet, so --in-cluster prints lines only.
    structured = output in ("json", "yaml") and place.where != api.IN_CLUSTER
    shown = contextlib.nullcontext(StderrLines()) if structured else display_for(watching, plain)
    with interrupted_watch(run, submitted_here=True, watching=watching), shown as display:
        code = api.schedule(request, watch=watching, view=display, replace=replace)
        if code == 0:
            for note in api.start_watcher(run, place):
                display(note)
    if structured:
        emit(run_result(run), output)
    raise SystemExit(code)
