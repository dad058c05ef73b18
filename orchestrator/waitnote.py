"""What `wmctl status` and the panel say of a running attempt while the watcher waits on something
that is not the job's doing: its backend's API away (an outage ridden out), or a placed node not
started yet (its image being pulled, its container created). The note is the attempt's evidence
while it lasts (the panel's "waiting" row, status's attempt line), as the cluster's reason for an
unplaced node is; it is cleared when the wait ends.
"""

from __future__ import annotations

import time

from .backends import base as b
from .tracker import AttemptTracker

OUTAGE_MARK = "API unavailable, retrying"
PULL_MARK = "starting (pulling the image or creating the container): "
PULL_STEP_S = 5.0        # the note's "for N s" moves in steps of this: the record is not rewritten every poll


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def seconds(s: float) -> str:
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def outage(backend: str, since: float, budget_s: float, what: str | None = None) -> str:
    """The note while ``backend``'s API is away (since ``since``), ridden out for ``budget_s``."""
    doing = f" while {what}" if what else ""
    return f"{backend} {OUTAGE_MARK}{doing} (since {clock(since)}, budget {seconds(budget_s)})"


def pulling(tracker: AttemptTracker, now: float, timeout_s: float) -> str | None:
    """The note while placed nodes have not started (before every node runs): which node on which
    host, for how long, against restart.image_pull_timeout, and the last failed pull's cause."""
    if tracker.all_started_at is not None or tracker.starting_since is None:
        return None
    nodes = [n for n in tracker.nodes if n.phase == b.PENDING and n.host]
    if not nodes:
        return None
    waited = (now - tracker.starting_since) // PULL_STEP_S * PULL_STEP_S
    who = ", ".join(f"node {n.node} on {n.host}" for n in nodes)
    cause = f"; last failed pull: {tracker.pull_cause.message}" if tracker.pull_cause is not None else ""
    return f"{PULL_MARK}{who} for {seconds(waited)} of restart.image_pull_timeout {seconds(timeout_s)}{cause}"


def is_note(evidence: str | None) -> bool:
    """Whether a running attempt's evidence is one of these notes (so it may be replaced or cleared)."""
    return bool(evidence) and (OUTAGE_MARK in (evidence or "") or (evidence or "").startswith(PULL_MARK))
