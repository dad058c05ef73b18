"""What a run is and what can be asked of it: where it lives (``engine_of``, ``ref_of``), how it
stands (``status``, ``runs``), what it kept (``metrics``, ``describe``), and its end (``cancel``,
``delete``, ``prune``).

A run is its record in the run store plus what it left on its backend. Nothing here submits or
watches (orchestrator.api does); a run nobody watches is reconciled with its backend
(orchestrator.reconcile) before it is shown. Nothing here prints: lines go to the ``echo`` a
caller passes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import backends
from .backends.base import AttemptRef, Backend, BackendOptions
from .errors import OptionError, RunExists, RunNotFound
from .state import Lease, RunRecord, RunStore, list_runs, open_store

Echo = Callable[[str], None]


def engine_of(record: RunRecord) -> Backend[Any]:
    """The backend object a recorded run lives on."""
    return backends.create(record.backend, BackendOptions(context=record.kube_context, namespace=record.namespace,
                                                          kubeconfig=record.kubeconfig))


def ref_of(record: RunRecord, attempt: int) -> AttemptRef:
    return AttemptRef(record.backend, record.run, attempt, record.namespace)


@dataclass
class RunView:
    """A run as it is now: its record (reconciled with the backend when nobody watches it), and
    who watches it."""

    run: str
    record: RunRecord | None
    lease: Lease | None = None
    problem: str | None = None      # why the record could not be read
    note: str | None = None         # what reconciling saw, or why it could not look

    @property
    def watcher(self) -> str:
        return self.lease.describe() if self.lease else "unwatched"


def status(run: str, *, reconcile: bool = True) -> RunView:
    """The run's record and watcher. A record that says running while no watcher holds the lease
    is checked against where the run lives, and its true end recorded."""
    store = open_store(run)
    record = store.load()
    lease = store.lease()
    note = None
    if reconcile and lease is None and record.status == "running":
        from .reconcile import reconcile_stored   # the supervisor's tracker: not for a dry run

        record, note = reconcile_stored(store, record, engine_of)
        lease = store.lease()
    return RunView(run, record, lease, note=note)


def runs() -> list[RunView]:
    """Every run recorded here, reconciled like ``status``; a damaged record is listed with its
    problem, never raised."""
    out = []
    for run in list_runs():
        try:
            out.append(status(run))
        except RunNotFound as exc:
            out.append(RunView(run, None, problem=exc.message))
    return out


def metrics(run: str, attempt: int | None = None) -> list[dict[str, Any]]:
    """Every progress event a watcher kept for ``run`` (oldest first), or one attempt's."""
    return list(iter_metrics(run, attempt))


def iter_metrics(run: str, attempt: int | None = None) -> Iterator[dict[str, Any]]:
    """``metrics`` one event at a time, read as a stream: memory stays flat however long the run
    (`wmctl metrics`, `wmctl plot`). The run is looked up at once, not at the first event."""
    store = open_store(run)
    store.load()
    events = store.iter_metrics()
    return events if attempt is None else (e for e in events if e.get("attempt") == attempt)


def describe(run: str) -> list[dict[str, Any]]:
    """The run's events and decisions, oldest first (``timeline.events``)."""
    store = open_store(run)
    from . import timeline

    return timeline.events(store.load(), store)


def cancel(run: str, *, graceful: bool = False, by: str | None = None, wait_s: float = 60.0,
           sleep: Callable[[float], None] = time.sleep) -> RunRecord:
    """Cancel ``run``: the intent is recorded first (so no watcher, here or in another process,
    resubmits), then every attempt is torn down (``graceful``: SIGTERM and a wait for the job's
    checkpoint). A watcher ends the run itself; without one the record is ended here."""
    store = open_store(run)
    record = store.load()
    engine = engine_of(record)
    try:
        if graceful and not engine.graceful_cancel:
            raise OptionError(f"the {engine.name} backend cannot cancel gracefully",
                              hint="cancel without --graceful: its teardown already sends SIGTERM with the "
                                   "termination grace period")
        refs = engine.attempts(run)
        if record.status == "running":
            import socket   # only a cancel names its host: a dry run never loads it

            intent = store.request_cancel(by=by or f"pid {os.getpid()}@{socket.gethostname()}", graceful=graceful)
            for ref in refs:
                engine.note_cancel(ref, intent)
        for ref in refs:
            engine.cancel(ref, graceful=graceful)
    finally:
        engine.close()
    deadline = time.monotonic() + wait_s
    while store.watched() and time.monotonic() < deadline:
        sleep(0.2)          # the watcher sees the intent and ends the run as cancelled
    record = store.load()
    if record.status == "running" and not store.watched():
        record.status = "cancelled"
        record.final_report = f"run {run} cancelled by the user"
        if record.attempts and record.attempts[-1].outcome is None:
            record.attempts[-1].outcome = "cancelled"
            record.attempts[-1].ended_at = time.time()
        store.save(record)
    return record


def delete(run: str, *, echo: Echo) -> RunRecord:
    """Remove an ended run: what it left on its backend (finished containers, Jobs kept for their
    TTL, archived logs) and its record. Its checkpoints are the user's data and stay."""
    view = status(run)
    record = view.record
    assert record is not None
    if record.status == "running":
        raise RunExists(f"run {run!r} has not ended ({view.watcher})",
                        hint=f"`wmctl cancel {run}` first, then delete it")
    store = open_store(run)
    engine = engine_of(record)
    try:
        remove(store, engine, record, echo)
    finally:
        engine.close()
    return record


def remove(store: RunStore, engine: Backend[Any], record: RunRecord, echo: Echo) -> None:
    left = engine.attempts(store.run)
    if left:
        echo(f"removing what run {store.run} ({record.status}) left on {engine.name}: "
             + ", ".join(ref.attempt_name for ref in left))
    for ref in left:
        engine.cancel(ref)
    store.delete()


def ended_at(record: RunRecord) -> float:
    """When a run ended (its last attempt's end), or when it was submitted if no attempt says."""
    return max((a.ended_at for a in record.attempts if a.ended_at is not None), default=record.created_at)


def prune(older_than_s: float, *, echo: Echo, dry_run: bool = False, now: float | None = None) -> list[str]:
    """Delete (``delete``: record, logs, leftover objects; never checkpoints) every run that ended
    more than ``older_than_s`` ago. A running run, or one whose record cannot be read, is kept.
    Returns the runs deleted (or, with ``dry_run``, that would be)."""
    now = time.time() if now is None else now
    done = []
    for view in runs():
        record = view.record
        if record is None or record.status == "running" or now - ended_at(record) < older_than_s:
            continue
        if not dry_run:
            try:
                delete(record.run, echo=echo)
            except RunExists as exc:        # resubmitted meanwhile: it is running again
                echo(f"kept {record.run}: {exc.message}")
                continue
        done.append(record.run)
    return done
