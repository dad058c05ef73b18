"""`wmctl watch RUN [--auto-resume]`: supervise a run; resubmit from the latest checkpoint."""

from __future__ import annotations

import time

import click

from .. import api
from ..errors import RunExists
from ..state import LEASE_BEAT_S
from ._common import display_for, interrupted_watch, plain_option
from ._params import run_argument


@click.command("watch", help="Supervise a run. With --auto-resume, a failed node's attempt is torn down at "
                             "once and resubmitted from the latest complete checkpoint, away from that node.")
@run_argument
@click.option("--auto-resume/--no-auto-resume", "auto_resume", default=None,
              help="Resubmit on retryable failures (default: as chosen at submit).")
@plain_option
def command(run, auto_resume, plain):

    with interrupted_watch(run), display_for(True, plain) as display:
        while True:
            try:
                code = api.watch(run, auto_resume=auto_resume, view=display)
                break
            except RunExists as exc:
                # A watcher pod of `submit --in-cluster` that replaced one on a dead node: the dead
                # one's lease is still fresh. Wait for it to go stale (exiting would only put the
                # pod into CrashLoopBackOff, whose growing delays outlast the lease).
                if not api.in_cluster_watcher():
                    raise
                display(f"waiting to take over: {exc.message}")
                time.sleep(LEASE_BEAT_S)
        note = api.retire_cluster_watcher(run)      # a watcher pod of `submit --in-cluster`: not restarted
        if note:
            display(note)
    raise SystemExit(code)
