"""A run nobody watches: its true state read from where it runs, and handed back to a watcher.

A record says `running` until a watcher records the end. When no watcher holds the lease (the
submitter returned, its process died, its machine went away), `status`, `list` and a log
follower ask ``reconcile`` what the backend says, and `wmctl watch RUN --auto-resume` takes up a
run that failed unwatched (``resumable_unwatched``, ``take_up_unwatched``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from . import failures as F
from .backends import base as b
from .display import step_text, summary
from .errors import EngineUnavailable
from .joberror import with_job_error
from .spec import JobSpec
from .state import AttemptRecord, RunRecord, RunStore
from .supervisor import never_started
from .tracker import AttemptTracker


# How long `status` looks at a run nobody watches before it answers with what it saw.
RECONCILE_WAIT_S = 3.0
NO_WATCHER = "none: no watcher ran"
NOT_STARTED = "not_started"     # an attempt recorded whose watcher stopped before submitting it


def reconcile(record: RunRecord, backend: b.Backend[Any], *, clock: Callable[[], float] = time.time,
              sleep: Callable[[float], None] = time.sleep, wait_s: float = RECONCILE_WAIT_S) -> bool:
    """The true state of a run that says `running` while no watcher holds its lease, read from
    where it runs (processes, containers, Kubernetes objects), folded into ``record``. Returns
    True when the record changed (the caller saves it under the store's reconcile lock, so no watcher races it).

    Nobody decided anything for an attempt that ended unwatched: its outcome is classified as a
    watcher would have, and its decision says no watcher ran, so `wmctl watch RUN --auto-resume`
    can still resume a retryable failure."""
    if record.status != "running":
        return False
    last = record.attempts[-1] if record.attempts else None
    now = clock()
    if last is None:
        record.status = "failed"
        record.final_report = (f"run {record.run} failed: no attempt was submitted (the submitting process "
                               "stopped before it could)\n" + summary(record))
        return True
    if last.outcome is not None:
        return False
    if never_started(last) and last.attempt not in {r.attempt for r in backend.attempts(record.run)}:
        # Not a lost attempt: nothing of it ever ran, so no retry is spent on it.
        last.outcome, last.ended_at, last.decision = NOT_STARTED, now, NO_WATCHER
        last.evidence = (f"recorded but never started (its watcher stopped before submitting it); "
                         f"`wmctl watch {record.run} --auto-resume` submits it, no retry spent")
        record.status = "failed"
        record.final_report = (f"run {record.run}: attempt {last.attempt} was recorded but never started (its "
                               f"watcher stopped before submitting it); nothing runs. `wmctl watch {record.run} "
                               f"--auto-resume` submits attempt {last.attempt} (no retry spent)\n" + summary(record))
        return True
    if not backend.resolves_gone and last.attempt not in {r.attempt for r in backend.attempts(record.run)}:
        gone = F.Failure(F.NODE_LOST, None, None, now,
                         f"every object of attempt {last.attempt} is gone and no watcher saw it end "
                         "(removed outside wmctl?)")
        _end_unwatched(record, last, gone, now)
        return True
    ref = b.AttemptRef(backend.name, record.run, last.attempt, record.namespace)
    tracker = AttemptTracker(started_at=last.submitted_at)
    deadline = now + wait_s
    while True:
        obs = backend.poll(ref)
        tracker.feed(obs, clock())
        done = b.Observation([], tracker.nodes).finished
        if (tracker.nodes and (done or F.root_cause(tracker.events))) or clock() >= deadline:
            break
        if tracker.nodes and not done and tracker.last_step is not None and not obs.settling:
            break               # running and reporting: that is the answer (not a node ended, its last lines unread)
        sleep(0.2)
    for name in ("last_step", "last_checkpoint_step", "resumed_from_step"):
        value = getattr(tracker, name)
        if value is not None:
            setattr(last, name, value)
    failure = F.root_cause(tracker.events)
    if failure is not None:
        failure, error = with_job_error(backend, ref, failure)
        last.error = list(error.lines) if error else []
        _end_unwatched(record, last, failure, clock())
        up = [n.node for n in tracker.nodes if n.phase not in (b.SUCCEEDED, b.FAILED, b.LOST)]
        if up:
            assert record.final_report is not None
            record.final_report += (f"\n  node(s) {', '.join(map(str, up))} of attempt {last.attempt} still up "
                                    f"(blocked on the lost peer): `wmctl cancel {record.run}` frees them")
        return True
    if tracker.succeeded:
        last.outcome, last.ended_at = "succeeded", clock()
        record.status = "succeeded"
        record.final_report = (f"run {record.run} succeeded on attempt {last.attempt} at step "
                               f"{step_text(last.last_step)} (seen by `status`: no watcher ran)\n" + summary(record))
        return True
    if not tracker.nodes or b.Observation([], tracker.nodes).finished:
        return False
    return tracker.last_step is not None


def resumable_unwatched(record: RunRecord) -> bool:
    """Did the run fail unwatched (see ``reconcile``) with a failure a watcher would have retried?"""
    last = record.attempts[-1] if record.attempts else None
    return (record.status == "failed" and last is not None and last.decision == NO_WATCHER
            and last.outcome in F.DEFAULT_DECISIONS and F.DEFAULT_DECISIONS[last.outcome] != F.STOP)


def unstarted_unwatched(record: RunRecord) -> bool:
    """Did ``reconcile`` find the run's last attempt recorded but never started?"""
    last = record.attempts[-1] if record.attempts else None
    return record.status == "failed" and last is not None and last.outcome == NOT_STARTED


def take_up_unstarted(record: RunRecord) -> None:
    """Hand a run whose last attempt never started back to a watcher: the attempt is as it was
    recorded, and the watcher submits it under its own number (``Supervisor.current_or_new_attempt``)."""
    last = record.attempts[-1]
    last.outcome = last.ended_at = last.evidence = last.decision = None
    record.status, record.final_report = "running", None


def take_up_unwatched(record: RunRecord, spec: JobSpec, places_nodes: bool) -> None:
    """Hand a run that failed unwatched back to a watcher: its last failure gets the decision a
    watcher would have taken, so the next attempt resumes from the newest checkpoint."""
    last = record.attempts[-1]
    failure = F.Failure(str(last.outcome), last.failed_node, last.failed_host, last.ended_at or 0.0,
                        last.evidence or "")
    last.decision = F.decide(failure, retry_on_oom=spec.restart.retry_on_oom,
                             exclude_failed_nodes=spec.restart.exclude_failed_nodes and places_nodes)
    record.status, record.final_report = "running", None


def _end_unwatched(record: RunRecord, last: AttemptRecord, failure: F.Failure, now: float) -> None:
    last.ended_at = now
    last.outcome, last.evidence = failure.kind, failure.evidence
    last.failed_node, last.failed_host = failure.node, failure.host
    retryable = F.DEFAULT_DECISIONS[failure.kind] != F.STOP
    last.decision = NO_WATCHER
    record.status = "failed"
    hint = (f"; `wmctl watch {record.run} --auto-resume` resumes it from its newest checkpoint" if retryable else "")
    record.final_report = (f"run {record.run} failed: {failure.describe()}; nothing resumed it: no watcher ran{hint}\n"
                           + summary(record))


def reconcile_stored(store: RunStore, record: RunRecord,
                     engine_of: Callable[[RunRecord], b.Backend[Any]]) -> tuple[RunRecord, str | None]:
    """``reconcile`` a stored run under the store's reconcile lock (never the watcher's lease: a
    watcher starting meanwhile waits for this, then reads what it saved), and save what changed.
    Returns the record as it now stands, and a note when the backend could not be asked."""
    try:
        with store.reconciling() as why_not:
            if why_not is not None:     # a watcher holds the run (its record is the truth), or a note
                return store.load(), why_not or None
            record = store.load()
            engine = engine_of(record)
            try:
                if reconcile(record, engine):
                    store.save(record)
            finally:
                engine.close()
    except EngineUnavailable as exc:
        return record, f"could not check the run on {record.backend}: {exc.message}"
    return record, None
