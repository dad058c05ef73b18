"""The one owner of retries: watch an attempt, classify what went wrong, tear it down at
once, and resubmit from the latest complete checkpoint away from the failed node.

Why tear down at once: survivors of a lost peer block in their collective for 10 (NCCL) to
30 (gloo) minutes and a live torchrun agent does not notice a vanished node, so waiting for
the job to fail on its own wastes the cluster.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import exclusions as X
from . import failures as F
from . import stragglerwatch, waitnote
from .backends import base as b
from .display import step_line, step_text, summary
from .errors import EngineUnavailable, RunCancelled, RunFailed, WmctlError
from .inplace import STRAGGLER, lost_hosts, recover_in_place, replenish
from .endgame import benign_exit, left_in_barrier
from .joberror import with_job_error
from .keptmetrics import adopted_metrics, metric_key
from .layout import run_dir
from .plan import AttemptContext, Plan
from .runtime.protocol import ENV_TEST_PAUSE_AT
from .silence import SILENT, Silence
from .spec import JobSpec
from .state import AttemptRecord, RunRecord, RunStore
from .tracker import AttemptTracker
from .vendors import VendorProfile
from .watchview import News, WatchView, interruptible_sleep

POLL_INTERVAL_S = 0.25
WAITING_PREFIX = "waiting to be placed: "   # a running attempt's evidence while the cluster says why it waits
QUEUED_PREFIX = "queued: "                  # ... while a queue (Kueue) holds it and says why
# A submission or teardown the engine's outage interrupted is tried again after these delays,
# doubling (Supervisor._ride_out); each try is itself a few retries (backends/kubernetes/client.py).
OUTAGE_RETRY_MIN_S = 1.0
OUTAGE_RETRY_MAX_S = 15.0

# The phases a test can hold open (WMCTL_TEST_PAUSE_AT=<phase>) to cancel a run inside them.
SUBMITTING, STARTING, TEARDOWN = "submitting", "starting", "teardown"
PAUSE_LIMIT_S = 300.0


def pause_point(run: str, phase: str, sleep: Callable[[float], None] = time.sleep) -> None:
    """Test hook: with WMCTL_TEST_PAUSE_AT=<phase>, create ``pause-<phase>`` in the run folder and
    wait while it exists (a test removes it to let the watcher go on). A no-op otherwise."""
    if os.environ.get(ENV_TEST_PAUSE_AT) != phase:
        return
    marker = run_dir(run) / f"pause-{phase}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while marker.exists() and time.monotonic() < deadline:
        sleep(0.05)


def never_started(rec: AttemptRecord) -> bool:
    """Was attempt ``rec`` recorded (``Supervisor._submit`` saves it before submitting, so a
    restarted watcher adopts rather than duplicates) but never handed to its backend? Its
    ``submit_s`` is written only once the backend took it. (The caller also asks the backend.)"""
    return rec.outcome is None and "submit_s" not in rec.timings


@dataclass
class Outcome:
    status: str          # succeeded | failed
    report: str
    exit_code: int


@dataclass(frozen=True)
class SupervisorOptions:
    """How a supervisor watches: whether it resubmits after a retryable failure, and its clock
    (a test drives a fake one)."""

    auto_resume: bool = False
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = interruptible_sleep
    poll_interval: float = POLL_INTERVAL_S


class Supervisor:
    """Watches the run ``record`` of ``spec`` on ``backend`` to its end, keeping ``store`` up to
    date; every line and every change goes to ``view``. ``first_plan``: the plan a dry run
    already made for attempt 0, submitted as printed."""

    def __init__(self, spec: JobSpec, profile: VendorProfile, backend: b.Backend[Any], store: RunStore,
                 record: RunRecord, view: WatchView, options: SupervisorOptions | None = None, *,
                 first_plan: Plan[Any] | None = None):
        options = options or SupervisorOptions()
        self.spec, self.profile, self.backend = spec, profile, backend
        self.store, self.record = store, record
        self.auto_resume = options.auto_resume
        self._first_plan = first_plan
        self.clock, self.sleep, self.poll_interval = options.clock, options.sleep, options.poll_interval
        # The view takes every line (with the event's own time where there is one) and the news.
        self.view = view
        self.echo: Callable[[str], None] = view.line
        self._outage_since: float | None = None
        self._told_history = False

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        rec = self.current_or_new_attempt()
        prev: AttemptTracker | None = None
        while True:
            ref = b.AttemptRef(self.backend.name, self.spec.name, rec.attempt, self.backend.namespace_of(self.spec))
            tracker, failure = self._watch(ref, rec, prev)
            # A cancel tears the attempt down, which looks like a lost node: the intent, written
            # before the teardown, says what it was.
            failure = self._cancelled() or failure
            if failure is not None and failure.kind == STRAGGLER:
                prev = tracker           # a straggler swapped for a spare in _watch: the attempt's new round
                continue
            if failure is not None and self._recover_in_place(ref, rec, tracker, failure):
                prev = tracker           # the same attempt, watched again from its new round
                continue
            prev = None
            if failure is None:
                self.backend.release(ref)
                return self._finish(rec, tracker, "succeeded", f"run {self.spec.name} succeeded on attempt "
                                    f"{rec.attempt} at step {step_text(tracker.last_step)}", 0)
            failure, error = with_job_error(self.backend, ref, failure,
                                            tracker.tails.get(failure.node) if failure.node is not None else None,
                                            self.profile)
            teardown_started = self.clock()
            if failure.kind == F.NODE_LOST:      # no survivor can finish a collective (or its checkpoint)
                self.backend.cut_grace(ref, [failure.host] if failure.host else [])
            self._ride_out(f"tearing down attempt {rec.attempt}", functools.partial(self.backend.cancel, ref), rec)
            rec.timings["teardown_s"] = round(self.clock() - teardown_started, 3)
            for note in self.backend.teardown_notes(ref):
                self.echo(f"attempt {rec.attempt} teardown went on without a step: {note}")
            pause_point(self.spec.name, TEARDOWN)
            rec.timings["detect_s"] = round(max(0.0, teardown_started - failure.time), 3)
            # A backend on one host (local, Docker) retries in place: "elsewhere" would be a promise it cannot keep.
            decision = F.decide(failure, retry_on_oom=self.spec.restart.retry_on_oom,
                                exclude_failed_nodes=self.spec.restart.exclude_failed_nodes
                                and self.backend.places_nodes, excluded=bool(rec.excluded_nodes))
            rec.error = list(error.lines) if error else []
            self._record_failure(rec, tracker, failure, decision)
            if decision == F.RETRY_ELSEWHERE:
                self._remember(rec, failure)
            if failure.kind != F.CANCELLED and self._cancelled() is not None:
                self.echo(f"attempt {rec.attempt} failed: {failure.describe()} -> torn down; a cancel arrived "
                          "meanwhile: nothing more is submitted")
                late_cancel = self._cancelled()
                assert late_cancel is not None
                return self._finish(rec, tracker, "cancelled", f"run {self.spec.name} {late_cancel.evidence}",
                                    RunCancelled.exit_code)
            ended = "was cancelled" if failure.kind == F.CANCELLED else f"failed: {failure.describe()}"
            self.echo(f"attempt {rec.attempt} {ended} -> torn down in {rec.timings['teardown_s']:.2f} s; "
                      f"decision: {decision}")
            if failure.kind == F.CANCELLED:
                kept = (f"; its newest checkpoint is step {tracker.last_checkpoint_step}"
                        if tracker.last_checkpoint_step is not None else "")
                return self._finish(rec, tracker, "cancelled", f"run {self.spec.name} {failure.evidence}{kept}",
                                    RunCancelled.exit_code)
            stop = self._why_stop(rec, failure, decision)
            if stop:
                return self._finish(rec, tracker, "failed", stop, RunFailed.exit_code)
            backoff, skipped = self._backoff_s(failure, decision)
            if skipped and self.spec.restart.backoff_s:
                self.echo(f"no backoff: {skipped}, so attempt {rec.attempt + 1} starts now")
            if backoff:
                self.echo(f"backing off {backoff:.0f} s before attempt {rec.attempt + 1}")
                self._tell(rec, tracker, backoff_until=self.clock() + backoff)
                self._wait(backoff)
            late = self._cancelled()
            if late is not None:      # cancelled while backing off: nothing more is submitted
                return self._finish(rec, tracker, "cancelled", f"run {self.spec.name} {late.evidence}",
                                    RunCancelled.exit_code)
            rec = self._submit(rec.attempt + 1, parent=rec)

    def _backoff_s(self, failure: F.Failure, decision: str) -> tuple[float, str | None]:
        """restart.backoff, for failures that may repeat where they happened, or 0 and why it is
        skipped. A preemption checkpointed and stopped on purpose (said elsewhere: None); a node
        that failed (lost, a device fault, hung) and is excluded from the next attempt is left
        behind: waiting would only lengthen the outage."""
        if failure.kind == F.PREEMPTED:
            return 0.0, None
        if decision == F.RETRY_ELSEWHERE and failure.host and self.backend.places_nodes:
            return 0.0, f"{failure.host} is excluded, the next attempt goes elsewhere"
        return self.spec.restart.backoff_s, None

    def _cancelled(self) -> F.Failure | None:
        intent = self.store.cancel_intent()
        if intent is None:
            return None
        how = " gracefully" if intent.get("graceful") else ""
        return F.Failure(F.CANCELLED, None, None, float(intent.get("time") or self.clock()),
                         f"cancelled{how} by {intent.get('by') or 'the user'}")

    def _graceful_wait(self, cancelled: F.Failure, tracker: AttemptTracker, now: float) -> bool:
        """A graceful cancel sent SIGTERM: keep watching (the job saves its checkpoint and exits)
        until every node has ended or the grace period is over; then the teardown is final."""
        intent = self.store.cancel_intent() or {}
        if not intent.get("graceful"):
            return False
        if tracker.nodes and b.Observation([], tracker.nodes).finished:
            return False
        grace = float(self.spec.kubernetes.termination_grace_period_s)
        return now < cancelled.time + grace

    def _wait(self, seconds: float) -> None:
        """Sleep, waking early for a cancel."""
        deadline = self.clock() + seconds
        while self.clock() < deadline and self.store.cancel_intent() is None:
            self.store.beat()
            self.sleep(min(self.poll_interval, deadline - self.clock()))

    def _why_stop(self, rec: AttemptRecord, failure: F.Failure, decision: str) -> str | None:
        # A preemption (SIGTERM and a saved checkpoint: a spot node reclaimed, a queue's
        # preemption, Slurm's time limit reached after its checkpoint signal) is not the job's
        # failure and spends no retry: only attempts that failed count against max_attempts.
        # A preemption that saved nothing new still stops the loop (made_progress below).
        used = sum(1 for a in self.record.attempts
                   if a.attempt < rec.attempt and a.outcome not in (F.PREEMPTED, None, "succeeded"))
        used += failure.kind != F.PREEMPTED
        if decision == F.STOP:
            return f"stopped: {failure.describe()} is not retried ({failure.kind})"
        if not self.auto_resume:
            return f"stopped: {failure.describe()}; run with --auto-resume to resubmit from the latest checkpoint"
        if used >= self.spec.restart.max_attempts:
            return (f"stopped: retry budget spent ({used} of restart.max_attempts={self.spec.restart.max_attempts} "
                    f"failed attempts); last failure: {failure.describe()}")
        made_progress = rec.last_checkpoint_step is not None and (
            rec.resumed_from_step is None or rec.last_checkpoint_step > rec.resumed_from_step)
        if rec.attempt > 0 and not made_progress and failure.kind != F.UNSCHEDULABLE:   # nothing of it ran
            return (f"stopped: attempt {rec.attempt} committed no new checkpoint (resumed from step "
                    f"{rec.resumed_from_step}); retrying would loop. Last failure: {failure.describe()}")
        return None

    def _recover_in_place(self, ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker,
                          failure: F.Failure) -> bool:
        """A lost node replaced by a warm spare inside the attempt (inplace.py): no teardown, no
        new attempt, no retry spent."""
        self._sync(rec, tracker)
        done, line = recover_in_place(self.spec, self.backend, ref, rec, tracker, failure, self.clock)
        if line:
            self.echo(line)
        if done and self.spec.restart.exclude_failed_nodes and self.backend.places_nodes:
            self._remember(rec, failure)     # a machine lost in place is as lost for the next runs
        if done:
            self.store.save(self.record)
            self.store.append_metric({"event": "recovery", "by": "watcher", "attempt": rec.attempt,
                                      **rec.recoveries[-1]})
        return done

    def _replenish(self, ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker, now: float) -> None:
        """New spares for the ones in-place recoveries used, once the run resumed (inplace.py)."""
        tended = replenish(self.spec, self.backend, ref, rec, tracker, now)
        if not tended:
            return
        self.store.save(self.record)
        for got, _ in tended:
            self.store.append_metric({"event": "spare_replenished", "by": "watcher", "attempt": rec.attempt,
                                      "round": got["round"], "slot": got["replenished"], "seen": round(now, 3)})
        for _, line in tended:
            self.echo(line)

    def _stragglers(self, ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker,
                    pending: stragglerwatch.Pending, now: float) -> F.Failure | None:
        """The image pull's note, then straggler news told and recorded (stragglerwatch.py); the
        STRAGGLER 'failure' when a slow node was just swapped for a spare (restart.stragglers=replace):
        the round is over."""
        if tracker.waiting is None and tracker.queued is None:
            self._note(rec, waitnote.pulling(tracker, now, self.spec.restart.image_pull_timeout_s))
        slow = stragglerwatch.tend(self.spec, self.backend, rec, tracker, self.store, self.record, pending,
                                   self.echo, now)
        if slow is None:
            return None
        done = self._recover_in_place(ref, rec, tracker, slow)
        stragglerwatch.settle(rec, slow.host, done)
        self.store.save(self.record)
        return slow if done else None

    def _watch(self, ref: b.AttemptRef, rec: AttemptRecord,
               prev: AttemptTracker | None = None) -> tuple[AttemptTracker, F.Failure | None]:
        silence = Silence(self.spec.restart.node_silence_timeout_s)
        # After an in-place recovery the attempt goes on: its steps and checkpoints so far stay.
        slow = stragglerwatch.detector(self.spec)
        tracker = (AttemptTracker(started_at=rec.submitted_at, silence=silence, stragglers=slow) if prev is None else
                   prev.next_round(self.clock(), silence, slow))
        pending = stragglerwatch.Pending()
        timeout = self.spec.restart.heartbeat_timeout_s
        # A watcher adopting a running attempt reads its output from the start: the events an
        # earlier watcher kept are shown again (at their own times) but kept once.
        kept, history = adopted_metrics(self.store.iter_metrics(), rec.attempt, history=not self._told_history)
        self._told_history = True
        self._tell(rec, tracker, history=history)
        pause_point(self.spec.name, STARTING)
        while True:
            now = self.clock()
            self.store.beat()
            cancelled = self._cancelled()
            if cancelled is not None and not self._graceful_wait(cancelled, tracker, now):
                return tracker, cancelled
            obs = self._poll(ref, rec, tracker, now)
            if obs is None:
                self.sleep(self.poll_interval)
                continue
            before = tracker.nodes
            waited = (tracker.waiting, tracker.queued)
            events = tracker.feed(obs, now)
            for ev in events:
                self._show(rec, ev, tracker, now)
                if ev.kind == b.PROGRESS and ev.progress and kept.first(metric_key(ev.progress)):
                    self.store.append_metric({**ev.progress, "attempt": rec.attempt, "seen": round(now, 3)})
            self._replenish(ref, rec, tracker, now)
            replaced = self._stragglers(ref, rec, tracker, pending, now)
            if replaced is not None:
                return tracker, replaced
            if (tracker.waiting, tracker.queued) != waited:
                # Saved after the lines are shown: whoever reads the record's reason has been told it.
                # `wmctl status` reads the record: the cluster's reason for the wait is said there
                # until every node runs (or the wait ends the attempt); a reason that needs a person
                # before a full queue's
                why, prefix = ((tracker.waiting, WAITING_PREFIX) if tracker.waiting is not None
                               else (tracker.queued, QUEUED_PREFIX))
                rec.evidence = (f"{prefix}{why.reason + ': ' if why.reason else ''}{why.message}"
                                if why is not None else None)
                self.store.save(self.record)
            if events or tracker.nodes != before:
                rec.last_step, rec.last_checkpoint_step = tracker.last_step, tracker.last_checkpoint_step
                rec.resumed_from_step = tracker.resumed_from_step
                rec.resume_not_exact = tracker.resume_not_exact
                self._tell(rec, tracker, events)
            if tracker.first_step_at and "first_step_s" not in rec.timings:
                rec.timings["first_step_s"] = round(tracker.first_step_at - rec.submitted_at, 3)
                self._sync(rec, tracker)
            if cancelled is not None:     # a graceful cancel: only the nodes' end (or the grace period's) counts
                self.sleep(self.poll_interval)
                continue
            failure = tracker.failure(now, timeout, self.spec.restart.pending_timeout_s,
                                      self.spec.restart.image_pull_timeout_s)
            if failure is not None and failure.kind == F.CANCELLED and cancelled is None and self._cancelled():
                # The backend saw the cancel (a Job's annotation) after this round read no intent
                # here: the next round reads it, and a graceful one waits for the checkpoint.
                continue
            if failure is not None and benign_exit(self.backend, ref, rec, tracker, failure, self.echo, self.clock):
                self.sleep(self.poll_interval)     # the other nodes' ends decide (or rank 0's words)
                continue
            if failure is not None:
                return tracker, failure
            if tracker.succeeded or left_in_barrier(self.backend, ref, rec, tracker, now, self.echo):
                return tracker, None
            self.sleep(self.poll_interval)

    def _note(self, rec: AttemptRecord, note: str | None) -> None:
        """Say ``note`` (waitnote.py: the API away, a node's image pulled) as the running attempt's
        evidence, where `wmctl status` and the panel read it; None clears a note said before."""
        if note != rec.evidence and (note is not None or waitnote.is_note(rec.evidence)):
            rec.evidence = note
            self.store.save(self.record)

    def _poll(self, ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker,
              now: float) -> b.Observation | None:
        """The backend's news, or None while its engine (Docker, the Kubernetes API) is out of
        reach. The run itself is untouched by an outage (a control-plane upgrade, a dockerd
        restart), so the watcher waits it out for up to heartbeat_timeout; time out of contact
        does not count against the job's heartbeat."""
        try:
            obs = self.backend.poll(ref)
        except EngineUnavailable as exc:
            if self._outage_since is None:
                self._outage_since = now
                self.echo(f"lost contact with {self.backend.name} ({exc.message}); retrying, the run is not touched")
                self._note(rec, waitnote.outage(self.backend.name, now, self.spec.restart.heartbeat_timeout_s))
            if now - self._outage_since > self.spec.restart.heartbeat_timeout_s:
                raise
            return None
        if self._outage_since is not None:
            gap = now - self._outage_since
            self.echo(f"contact with {self.backend.name} restored after {gap:.0f} s")
            tracker.last_heartbeat += gap
            self._outage_since = None
            self._note(rec, None)
        return obs

    def _ride_out(self, what: str, step: Callable[[], Any], rec: AttemptRecord | None = None) -> None:
        """``step`` (a submission or a teardown, each idempotent: an existing attempt is adopted, a
        deleted object is done), tried again while the backend's engine is unavailable (a
        control-plane upgrade answers 503 or refuses connections for minutes; an expired
        credential is renewed by a person), with backoff, for up to restart.heartbeat_timeout:
        the budget poll() has for the same outage. Past it the EngineUnavailable is raised."""
        started = self.clock()
        delay, told = OUTAGE_RETRY_MIN_S, False
        while True:
            try:
                step()
            except EngineUnavailable as exc:
                waited = self.clock() - started
                if not told:
                    told = True
                    self.echo(f"{self.backend.name} API unavailable while {what} ({exc.message}); retrying for up "
                              f"to {self.spec.restart.heartbeat_timeout_s:.0f} s, nothing is marked failed")
                    if rec is not None:
                        self._note(rec, waitnote.outage(self.backend.name, started,
                                                        self.spec.restart.heartbeat_timeout_s, what))
                if waited + delay > self.spec.restart.heartbeat_timeout_s:
                    raise
                self.sleep(delay)
                delay = min(delay * 2, OUTAGE_RETRY_MAX_S)
                continue
            if told:
                self.echo(f"{self.backend.name} API back: {what} done after {self.clock() - started:.0f} s")
                if rec is not None:
                    self._note(rec, None)
            return

    def _show(self, rec: AttemptRecord, ev: b.Event, tracker: AttemptTracker, now: float) -> None:
        # Each line carries the time of what it reports: a watcher attaching to a running attempt
        # reads its output from the start, and those lines say when they happened, not when read.
        if ev.kind == b.PROGRESS and ev.progress:
            p = ev.progress
            kind = p.get("event")
            at = float(p["time"]) if isinstance(p.get("time"), (int, float)) else ev.time
            if kind == "checkpoint":
                self._say(f"attempt {rec.attempt}: checkpoint committed at step {p.get('step')}", at)
                self._sync(rec, tracker)
            elif kind == "resume":
                # A resume the runtime could not make exact (another world size) says why.
                how = f" (not exact: {p.get('reason') or 'reason not given'})" if p.get("exact") is False else ""
                self._say(f"attempt {rec.attempt}: resumed from step {p.get('step')}{how}", at)
                self._sync(rec, tracker)
            elif kind == "checkpoint_damaged":
                # The job says it on stderr, which the watcher stops showing once progress lines
                # flow: a resume past a damaged checkpoint is never silent here either.
                self._say(f"attempt {rec.attempt}: damaged checkpoint {p.get('path')} skipped: "
                          f"{p.get('reason') or 'reason not given'}", at)
            elif kind == "step":
                self._say(f"attempt {rec.attempt}: {step_line(p)}", at)
                for warning in (p.get("timing") or {}).get("warnings") or []:
                    # The same advice every ten steps is noise: each kind ("data wait is 31% ...",
                    # "communication is ...") is said once an attempt.
                    kind = warning.split(" is ", 1)[0]
                    if kind not in tracker.warned:
                        tracker.warned.add(kind)
                        self._say(f"attempt {rec.attempt}: {warning}", at)
            elif kind in ("start", "exit", "preempted", SILENT):
                self._say(f"attempt {rec.attempt}: {kind} " + ", ".join(f"{k}={v}" for k, v in p.items()
                                                                        if k not in ("event", "time")), at)
        elif ev.kind == b.OUTPUT:
            if tracker.first_progress_at is None:     # the job's own progress, one line a second
                self._say(f"attempt {rec.attempt}: node {ev.node} | {ev.message}", ev.time)
        elif ev.kind != b.PROGRESS:
            detail = f" exit {ev.exit_code}" if ev.exit_code is not None else ""
            why = f" ({ev.message})" if ev.message else ""
            who = f"node {ev.node} " if ev.node is not None else ""    # a Job-level fact names no node
            self._say(f"attempt {rec.attempt}: {who}{ev.kind}{detail}{why}", ev.time)

    # -- attempts ------------------------------------------------------------------------------
    def current_or_new_attempt(self) -> AttemptRecord:
        known = {r.attempt for r in self.backend.attempts(self.spec.name)}
        if self.record.attempts:
            last = self.record.attempts[-1]
            newer = sorted(a for a in known if a > last.attempt)
            if newer:   # a watcher died between submitting and saving: adopt what exists
                return self._submit(newer[-1], parent=last)
            if never_started(last) and last.attempt not in known:
                # A watcher stopped between recording this attempt and submitting it: submitted
                # now under its own number, so no retry is spent on what never ran.
                self.echo(f"attempt {last.attempt} of {self.spec.name} was recorded but never started "
                          "(its watcher stopped before submitting it): submitting it now")
                last.submitted_at = self.clock()
                parent = self.record.attempts[-2] if len(self.record.attempts) > 1 else None
                return self._submit(last.attempt, parent=parent)
            if last.outcome is None:
                self.echo(f"adopting attempt {last.attempt} of {self.spec.name}")
                return last
            if last.decision in (F.RETRY, F.RETRY_ELSEWHERE) and self.auto_resume:
                if last.decision == F.RETRY_ELSEWHERE and last.outcome and last.failed_host:
                    # failed while nobody watched it (or before its watcher could say so): the
                    # node is remembered now (again, at worst: the newest evidence stands)
                    self._remember(last, F.Failure(last.outcome, last.failed_node, last.failed_host,
                                                   last.ended_at or self.clock(), last.evidence or ""))
                if last.attempt in known:
                    # It failed while nobody watched it (or its watcher stopped before the
                    # teardown): what is left of it (a node blocked on the lost peer, exited
                    # containers) goes first, its output kept as a teardown keeps it.
                    self.backend.cancel(b.AttemptRef(self.backend.name, self.spec.name, last.attempt,
                                                     self.backend.namespace_of(self.spec)))
                return self._submit(last.attempt + 1, parent=last)
            raise RuntimeError("nothing to watch: the run already ended")  # callers check status first
        return self._submit(0, parent=None)

    def _remember(self, rec: AttemptRecord, failure: F.Failure) -> None:
        """A node left for a lost node, a device fault or a hang is remembered for the next runs
        on the same cluster too (restart.remember_exclusions), where nodes are machines."""
        ttl = self.spec.restart.remember_exclusions_s
        if not (failure.host and self.backend.remembers_exclusions and ttl > 0 and X.remembered(failure.kind)):
            return
        cluster = self.backend.cluster_key()
        if not cluster:
            return
        try:
            kept = X.remember(node=failure.host, cluster=cluster, kind=failure.kind, evidence=failure.evidence,
                              run=self.spec.name, attempt=rec.attempt, ttl_s=ttl, now=self.clock())
        except WmctlError as exc:     # a damaged or locked file: the run goes on, unremembered
            self.echo(f"attempt {rec.attempt}: {failure.host} not remembered: {exc.message}")
            return
        if kept is not None:
            self.echo(f"attempt {rec.attempt}: {failure.host} remembered as excluded on {cluster} for "
                      f"{ttl / 3600:g} h ({failure.kind}); `wmctl nodes forgive {failure.host}` clears it")

    def _submit(self, attempt: int, parent: AttemptRecord | None) -> AttemptRecord:
        # the run's own exclusions; the remembered ones are read again (one may have been forgiven)
        own = [n for n in parent.excluded_nodes if n not in parent.remembered_nodes] if parent else []
        room: int | None = None
        if parent and parent.outcome == F.UNSCHEDULABLE and parent.excluded_nodes:
            # never exclude so many nodes that the job cannot be placed: the exclusions go
            self.echo(f"attempt {attempt}: attempt {parent.attempt} could not be placed with "
                      f"{', '.join(parent.excluded_nodes)} excluded; excluding none")
            own, room = [], 0
        if (parent and parent.decision == F.RETRY_ELSEWHERE and parent.failed_host
                and parent.failed_host not in own and self.backend.places_nodes):
            own.append(parent.failed_host)
        if parent and self.spec.restart.exclude_failed_nodes and self.backend.places_nodes:
            # machines the parent lost and replaced in place with spares: as failed as its last
            own += [h for h in dict.fromkeys(lost_hosts(parent)) if h not in own]
        applied = X.for_attempt(own, remembers=self.backend.remembers_exclusions, cluster=self.backend.cluster_key,
                                ttl_s=self.spec.restart.remember_exclusions_s, room=room, now=self.clock(),
                                usable=functools.partial(self.backend.placeable_hosts, self.spec),
                                needed=self.spec.nodes + self.spec.restart.spares)
        for note in applied.notes:
            self.echo(f"attempt {attempt}: {note}")
        excluded = list(applied.nodes)
        existing = next((r for r in self.record.attempts if r.attempt == attempt), None)
        rec = existing or AttemptRecord(attempt=attempt, submitted_at=self.clock(), excluded_nodes=excluded,
                                        remembered_nodes=[e.node for e in applied.remembered])
        if existing is None:
            self.record.attempts.append(rec)
            self.store.save(self.record)      # recorded before submitting: a restart adopts, never duplicates
        ctx = AttemptContext(attempt=attempt, excluded_nodes=tuple(excluded),
                             remembered_nodes=tuple(e.node for e in applied.remembered),
                             resume=attempt > 0 or self.auto_resume or self.record.resume_from is not None,
                             parent=parent.attempt if parent else None, resume_from=self.record.resume_from)
        pause_point(self.spec.name, SUBMITTING)
        if self._cancelled() is not None:
            self.echo(f"attempt {attempt} not submitted: the run was cancelled")
            return rec
        started = self.clock()
        plan, self._first_plan = self._first_plan, None
        if plan is None or plan.attempt != attempt or plan.context != ctx:
            plan = self.backend.plan(self.spec, self.profile, ctx)
        try:
            if parent is None:       # the first: an engine out of reach is said at once, to the user at hand
                self.backend.submit(plan)
            else:                    # a resubmission rides out an outage (a control-plane upgrade)
                self._ride_out(f"submitting attempt {attempt}", lambda: self.backend.submit(plan), rec)
        except WmctlError as exc:
            if parent is not None and isinstance(exc, EngineUnavailable):
                # Away past the budget: nothing was refused, so nothing is marked failed. The attempt
                # stays recorded unsubmitted; the next `wmctl watch` submits it under its own number
                # (current_or_new_attempt: never_started).
                self.echo(f"attempt {attempt} not submitted: {self.backend.name} stayed unavailable for "
                          f"{self.spec.restart.heartbeat_timeout_s:.0f} s (restart.heartbeat_timeout); the run is "
                          f"not failed: `wmctl watch {self.spec.name}` submits it once the API answers")
                raise
            # Refused before anything ran (a program missing from the image, a quota, a bad
            # mount): the run has ended, and its record says so and why.
            rec.outcome, rec.ended_at, rec.evidence = "not_submitted", self.clock(), exc.message
            self.record.status = "failed"
            self.record.final_report = (f"run {self.spec.name} failed: attempt {attempt} could not be submitted: "
                                        f"{exc.message}\n" + summary(self.record))
            self.store.save(self.record)
            raise
        rec.timings["submit_s"] = round(self.clock() - started, 3)
        self.store.save(self.record)
        where = f", excluding {', '.join(excluded)}" if excluded else ""
        spares = f" + {self.spec.restart.spares} spare(s)" if self.spec.restart.spares and self.backend.spares else ""
        self.echo(f"attempt {attempt} submitted on {self.backend.name} ({self.spec.nodes} node(s){spares}{where})")
        return rec

    def _record_failure(self, rec: AttemptRecord, tracker: AttemptTracker, failure: F.Failure, decision: str) -> None:
        self._sync(rec, tracker)
        rec.ended_at = self.clock()
        rec.outcome, rec.evidence, rec.decision = failure.kind, failure.evidence, decision
        rec.failed_node, rec.failed_host = failure.node, failure.host
        self.store.save(self.record)
        # Kept beside the job's own progress events (marked as the watcher's), so a metrics
        # consumer sees where each attempt ended and why without reading the record.
        self.store.append_metric({"event": "failure", "by": "watcher", "time": round(rec.ended_at, 3),
                                  "attempt": rec.attempt, "step": rec.last_step, "kind": failure.kind,
                                  "decision": decision, "node": failure.node, "host": failure.host})

    def _sync(self, rec: AttemptRecord, tracker: AttemptTracker) -> None:
        rec.last_step = tracker.last_step
        rec.last_checkpoint_step = tracker.last_checkpoint_step
        rec.resumed_from_step = tracker.resumed_from_step
        rec.resume_not_exact = tracker.resume_not_exact
        self.store.save(self.record)

    def _finish(self, rec: AttemptRecord, tracker: AttemptTracker, status: str, report: str, code: int) -> Outcome:
        self._sync(rec, tracker)
        if status == "succeeded":
            rec.outcome, rec.ended_at = "succeeded", self.clock()
        self.record.status = status
        self.record.final_report = report + "\n" + summary(self.record)
        self.store.save(self.record)
        self._tell(rec, tracker)
        self.echo(self.record.final_report)
        return Outcome(status, self.record.final_report, code)

    def _tell(self, rec: AttemptRecord, tracker: AttemptTracker, events: list[b.Event] | None = None,
              backoff_until: float | None = None, history: list[dict[str, Any]] | None = None) -> None:
        # The hang clock runs once every node runs or the job reported progress (AttemptTracker.failure).
        ticking = tracker.all_started_at is not None or tracker.first_progress_at is not None
        self.view.news(News(self.record, rec, list(tracker.nodes), list(events or []),
                            tracker.last_heartbeat if ticking else None,
                            self.spec.restart.heartbeat_timeout_s, backoff_until, list(history or [])))

    def _say(self, text: str, at: float | None) -> None:
        """A line about an event, stamped with the event's time when a view shows times."""
        self.view.line(text, at)
