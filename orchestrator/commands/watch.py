"""`wmctl watch RUN [--auto-resume]`: supervise a run; resubmit from the latest checkpoint."""

from __future__ import annotations

import click

from .. import api
from ._common import display_for, interrupted_watch


@click.command("watch", help="Supervise a run. With --auto-resume, a failed node's attempt is torn down at "
                             "once and resubmitted from the latest complete checkpoint, away from that node.")
@click.argument("run")
@click.option("--auto-resume/--no-auto-resume", "auto_resume", default=None,
              help="Resubmit on retryable failures (default: as chosen at submit).")
def command(run, auto_resume):

    with interrupted_watch(run), display_for(True) as display:
        code = api.watch(run, auto_resume=auto_resume, echo=display, show_state=display.state)
    raise SystemExit(code)
