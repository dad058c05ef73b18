"""The one owner of retries: watch an attempt, classify what went wrong, tear it down at
once, and resubmit from the latest complete checkpoint away from the failed node.

Why tear down at once: survivors of a lost peer block in their collective for 10 (NCCL) to
30 (gloo) minutes and a live torchrun agent does not notice a vanished node, so waiting for
the job to fail on its own wastes the cluster.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from . import failures as F
from .backends import base as b
from .errors import EngineUnavailable, RunCancelled, RunFailed, WmctlError
from .layout import run_dir
from .plan import AttemptContext, Plan
from .runtime.protocol import ENV_TEST_PAUSE_AT
from .state import AttemptRecord, RunRecord, RunStore

POLL_INTERVAL_S = 0.25
LOG_TAIL_LINES = 400      # of a failed node's output, searched for the failing rank's error

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


@dataclass
class AttemptTracker:
    """Folds an attempt's observations into what the supervisor decides on."""

    started_at: float
    events: list[b.Event] = field(default_factory=list)
    nodes: list[b.NodeStatus] = field(default_factory=list)
    last_heartbeat: float = 0.0
    last_step: int | None = None
    last_checkpoint_step: int | None = None
    resumed_from_step: int | None = None
    first_progress_at: float | None = None
    first_step_at: float | None = None
    preempted: bool = False
    all_started_at: float | None = None
    warned: set[str] = field(default_factory=set)     # timing advice already shown

    def __post_init__(self) -> None:
        self.last_heartbeat = self.started_at

    def feed(self, obs: b.Observation, now: float) -> list[b.Event]:
        # Output lines are only a heartbeat: kept out of the evidence a root cause is found in.
        self.events += [ev for ev in obs.events if ev.kind != b.OUTPUT]
        self.nodes = obs.nodes
        if self.all_started_at is None and obs.nodes and all(n.phase != b.PENDING for n in obs.nodes):
            # The heartbeat clock starts when every node runs: time spent queued (Kueue, Volcano),
            # scheduling or pulling a large image is not a hang.
            self.all_started_at = now
            self.last_heartbeat = max(self.last_heartbeat, now)
        for ev in obs.events:
            if ev.kind == b.OUTPUT and self.first_progress_at is None:
                # A job without orchestrator.runtime: any output is its heartbeat. Once it has
                # printed a progress line, only progress counts (a chatty job stuck in a
                # collective still logs).
                self.last_heartbeat = max(self.last_heartbeat, now)
            if ev.kind != b.PROGRESS or not ev.progress:
                continue
            self.last_heartbeat = max(self.last_heartbeat, now)
            p = ev.progress
            self.first_progress_at = self.first_progress_at or now
            if isinstance(p.get("step"), int):
                if p.get("event") == "step":
                    self.first_step_at = self.first_step_at or now
                self.last_step = max(self.last_step or 0, p["step"])
            if p.get("event") == "checkpoint" and isinstance(p.get("step"), int):
                self.last_checkpoint_step = max(self.last_checkpoint_step or 0, p["step"])
            if p.get("event") == "resume" and isinstance(p.get("step"), int):
                self.resumed_from_step = p["step"]
            if p.get("event") == "preempted":
                self.preempted = True
        return obs.events

    @property
    def succeeded(self) -> bool:
        return bool(self.nodes) and all(n.phase == b.SUCCEEDED for n in self.nodes)

    def failure(self, now: float, heartbeat_timeout: float) -> F.Failure | None:
        found = F.root_cause(self.events)
        if found is not None and found.kind == F.APP_ERROR and self.preempted:
            # torchrun's agent exits 1 whatever its workers' codes: the job's own `preempted`
            # line says the exit was the graceful, checkpointed stop.
            return F.Failure(F.PREEMPTED, found.node, found.host, found.time,
                              f"checkpointed and stopped on SIGTERM at step {self.last_step} ({found.evidence})")
        if found is not None:
            return found
        if self.succeeded or (self.all_started_at is None and self.first_progress_at is None):
            return None
        return F.hang_failure(self.last_heartbeat, now, heartbeat_timeout)


@dataclass
class Outcome:
    status: str          # succeeded | failed
    report: str
    exit_code: int


class Supervisor:
    def __init__(self, spec, profile, backend: b.Backend[Any], store: RunStore, record: RunRecord, *,
                 auto_resume: bool, first_plan: Plan[Any] | None = None,
                 echo: Callable[[str], None] = print, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, poll_interval: float = POLL_INTERVAL_S,
                 show_state: Callable[[RunRecord, AttemptRecord, list[b.NodeStatus]], None] | None = None):
        self.spec, self.profile, self.backend = spec, profile, backend
        self.store, self.record = store, record
        self.auto_resume = auto_resume
        # The plan a dry run already made for the first attempt: submitted as printed.
        self._first_plan = first_plan
        self.echo, self.clock, self.sleep = echo, clock, sleep
        self.poll_interval = poll_interval
        self.show_state = show_state or (lambda record, attempt, nodes: None)
        self._outage_since: float | None = None

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        rec = self.current_or_new_attempt()
        while True:
            ref = b.AttemptRef(self.backend.name, self.spec.name, rec.attempt, self.backend.namespace_of(self.spec))
            tracker, failure = self._watch(ref, rec)
            # A cancel tears the attempt down, which looks like a lost node: the intent, written
            # before the teardown, says what it was.
            failure = self._cancelled() or failure
            if failure is None:
                self.backend.release(ref)
                return self._finish(rec, tracker, "succeeded", f"run {self.spec.name} succeeded on attempt "
                                    f"{rec.attempt} at step {tracker.last_step}", 0)
            failure, error = self._with_job_error(ref, failure)
            teardown_started = self.clock()
            self.backend.cancel(ref)
            rec.timings["teardown_s"] = round(self.clock() - teardown_started, 3)
            for note in self.backend.teardown_notes(ref):
                self.echo(f"attempt {rec.attempt} teardown went on without a step: {note}")
            pause_point(self.spec.name, TEARDOWN)
            rec.timings["detect_s"] = round(max(0.0, teardown_started - failure.time), 3)
            # A backend on one host (local, Docker) retries in place: "elsewhere" would be a promise it cannot keep.
            decision = F.decide(failure, retry_on_oom=self.spec.restart.retry_on_oom,
                                exclude_failed_nodes=self.spec.restart.exclude_failed_nodes
                                and self.backend.places_nodes)
            rec.error = list(error.lines) if error else []
            self._record_failure(rec, tracker, failure, decision)
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
            backoff = self.spec.restart.backoff_s if failure.kind != F.PREEMPTED else 0.0
            if backoff:
                self.echo(f"backing off {backoff:.0f} s before attempt {rec.attempt + 1}")
                self._wait(backoff)
            late = self._cancelled()
            if late is not None:      # cancelled while backing off: nothing more is submitted
                return self._finish(rec, tracker, "cancelled", f"run {self.spec.name} {late.evidence}",
                                    RunCancelled.exit_code)
            rec = self._submit(rec.attempt + 1, parent=rec)

    def _with_job_error(self, ref: b.AttemptRef, failure: F.Failure) -> tuple[F.Failure, F.JobError | None]:
        return with_job_error(self.backend, ref, failure)

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
        used = rec.attempt + 1
        if decision == F.STOP:
            return f"stopped: {failure.describe()} is not retried ({failure.kind})"
        if not self.auto_resume:
            return f"stopped: {failure.describe()}; run with --auto-resume to resubmit from the latest checkpoint"
        if used >= self.spec.restart.max_attempts:
            return (f"stopped: retry budget spent ({used} of restart.max_attempts={self.spec.restart.max_attempts} "
                    f"attempts); last failure: {failure.describe()}")
        made_progress = rec.last_checkpoint_step is not None and (
            rec.resumed_from_step is None or rec.last_checkpoint_step > rec.resumed_from_step)
        if rec.attempt > 0 and not made_progress:
            return (f"stopped: attempt {rec.attempt} committed no new checkpoint (resumed from step "
                    f"{rec.resumed_from_step}); retrying would loop. Last failure: {failure.describe()}")
        return None

    def _watch(self, ref: b.AttemptRef, rec: AttemptRecord) -> tuple[AttemptTracker, F.Failure | None]:
        tracker = AttemptTracker(started_at=rec.submitted_at)
        timeout = self.spec.restart.heartbeat_timeout_s
        pause_point(self.spec.name, STARTING)
        while True:
            now = self.clock()
            self.store.beat()
            cancelled = self._cancelled()
            if cancelled is not None and not self._graceful_wait(cancelled, tracker, now):
                return tracker, cancelled
            obs = self._poll(ref, tracker, now)
            if obs is None:
                self.sleep(self.poll_interval)
                continue
            before = tracker.nodes
            events = tracker.feed(obs, now)
            for ev in events:
                self._show(rec, ev, tracker, now)
                if ev.kind == b.PROGRESS and ev.progress:
                    self.store.append_metric({**ev.progress, "attempt": rec.attempt, "seen": round(now, 3)})
            if events or tracker.nodes != before:
                rec.last_step, rec.last_checkpoint_step = tracker.last_step, tracker.last_checkpoint_step
                rec.resumed_from_step = tracker.resumed_from_step
                self.show_state(self.record, rec, tracker.nodes)
            if tracker.first_step_at and "first_step_s" not in rec.timings:
                rec.timings["first_step_s"] = round(tracker.first_step_at - rec.submitted_at, 3)
                self._sync(rec, tracker)
            if cancelled is not None:     # a graceful cancel: only the nodes' end (or the grace period's) counts
                self.sleep(self.poll_interval)
                continue
            failure = tracker.failure(now, timeout)
            if failure is not None and failure.kind == F.CANCELLED and cancelled is None and self._cancelled():
                # The backend saw the cancel (a Job's annotation) after this round read no intent
                # here: the next round reads it, and a graceful one waits for the checkpoint.
                continue
            if failure is not None:
                return tracker, failure
            if tracker.succeeded:
                return tracker, None
            self.sleep(self.poll_interval)

    def _poll(self, ref: b.AttemptRef, tracker: AttemptTracker, now: float) -> b.Observation | None:
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
            if now - self._outage_since > self.spec.restart.heartbeat_timeout_s:
                raise
            return None
        if self._outage_since is not None:
            gap = now - self._outage_since
            self.echo(f"contact with {self.backend.name} restored after {gap:.0f} s")
            tracker.last_heartbeat += gap
            self._outage_since = None
        return obs

    def _show(self, rec: AttemptRecord, ev: b.Event, tracker: AttemptTracker, now: float) -> None:
        if ev.kind == b.PROGRESS and ev.progress:
            p = ev.progress
            kind = p.get("event")
            if kind == "checkpoint":
                self.echo(f"attempt {rec.attempt}: checkpoint committed at step {p.get('step')}")
                self._sync(rec, tracker)
            elif kind == "resume":
                self.echo(f"attempt {rec.attempt}: resumed from step {p.get('step')}")
                self._sync(rec, tracker)
            elif kind == "step":
                self.echo(f"attempt {rec.attempt}: {step_line(p)}")
                for warning in (p.get("timing") or {}).get("warnings") or []:
                    # The same advice every ten steps is noise: each kind ("data wait is 31% ...",
                    # "communication is ...") is said once an attempt.
                    kind = warning.split(" is ", 1)[0]
                    if kind not in tracker.warned:
                        tracker.warned.add(kind)
                        self.echo(f"attempt {rec.attempt}: {warning}")
            elif kind in ("start", "exit", "preempted"):
                self.echo(f"attempt {rec.attempt}: {kind} " + ", ".join(f"{k}={v}" for k, v in p.items()
                                                                       if k not in ("event", "time")))
        elif ev.kind == b.OUTPUT:
            if tracker.first_progress_at is None:     # the job's own progress, one line a second
                self.echo(f"attempt {rec.attempt}: node {ev.node} | {ev.message}")
        elif ev.kind != b.PROGRESS:
            detail = f" exit {ev.exit_code}" if ev.exit_code is not None else ""
            why = f" ({ev.message})" if ev.message else ""
            self.echo(f"attempt {rec.attempt}: node {ev.node} {ev.kind}{detail}{why}")

    # -- attempts ------------------------------------------------------------------------------
    def current_or_new_attempt(self) -> AttemptRecord:
        known = {r.attempt for r in self.backend.attempts(self.spec.name)}
        if self.record.attempts:
            last = self.record.attempts[-1]
            newer = sorted(a for a in known if a > last.attempt)
            if newer:   # a watcher died between submitting and saving: adopt what exists
                return self._submit(newer[-1], parent=last)
            if last.outcome is None:
                self.echo(f"adopting attempt {last.attempt} of {self.spec.name}")
                return last
            if last.decision in (F.RETRY, F.RETRY_ELSEWHERE) and self.auto_resume:
                return self._submit(last.attempt + 1, parent=last)
            raise RuntimeError("nothing to watch: the run already ended")  # callers check status first
        return self._submit(0, parent=None)

    def _submit(self, attempt: int, parent: AttemptRecord | None) -> AttemptRecord:
        excluded = list(parent.excluded_nodes) if parent else []
        if (parent and parent.decision == F.RETRY_ELSEWHERE and parent.failed_host
                and parent.failed_host not in excluded and self.backend.places_nodes):
            excluded.append(parent.failed_host)
        existing = next((r for r in self.record.attempts if r.attempt == attempt), None)
        rec = existing or AttemptRecord(attempt=attempt, submitted_at=self.clock(), excluded_nodes=excluded)
        if existing is None:
            self.record.attempts.append(rec)
            self.store.save(self.record)      # recorded before submitting: a restart adopts, never duplicates
        ctx = AttemptContext(attempt=attempt, excluded_nodes=tuple(excluded),
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
            self.backend.submit(plan)
        except WmctlError as exc:
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
        self.echo(f"attempt {attempt} submitted on {self.backend.name} ({self.spec.nodes} node(s){where})")
        return rec

    def _record_failure(self, rec: AttemptRecord, tracker: AttemptTracker, failure: F.Failure, decision: str) -> None:
        self._sync(rec, tracker)
        rec.ended_at = self.clock()
        rec.outcome, rec.evidence, rec.decision = failure.kind, failure.evidence, decision
        rec.failed_node, rec.failed_host = failure.node, failure.host
        self.store.save(self.record)

    def _sync(self, rec: AttemptRecord, tracker: AttemptTracker) -> None:
        rec.last_step = tracker.last_step
        rec.last_checkpoint_step = tracker.last_checkpoint_step
        rec.resumed_from_step = tracker.resumed_from_step
        self.store.save(self.record)

    def _finish(self, rec: AttemptRecord, tracker: AttemptTracker, status: str, report: str, code: int) -> Outcome:
        self._sync(rec, tracker)
        if status == "succeeded":
            rec.outcome, rec.ended_at = "succeeded", self.clock()
        self.record.status = status
        self.record.final_report = report + "\n" + summary(self.record)
        self.store.save(self.record)
        self.show_state(self.record, rec, tracker.nodes)
        self.echo(self.record.final_report)
        return Outcome(status, self.record.final_report, code)


def with_job_error(backend: b.Backend[Any], ref: b.AttemptRef,
                   failure: F.Failure) -> tuple[F.Failure, F.JobError | None]:
    """An application error is reported in the failing rank's own words: its traceback's end,
    read from its node's output before a teardown takes the node away."""
    if failure.kind != F.APP_ERROR or failure.node is None:
        return failure, None
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    try:
        tail.extend(backend.logs(ref, node=failure.node, follow=False))
    except WmctlError:
        return failure, None
    error = F.job_error(list(tail))
    if error is None:
        return failure, None
    full = F.storage_full(error)
    if full is not None:
        return replace(failure, kind=F.STORAGE_FULL, evidence=f"{full}; {error.summary}"), error
    return replace(failure, evidence=f"{failure.evidence}; {error.summary}"), error


def step_line(progress: dict[str, Any]) -> str:
    """One step report as a line: loss, then where the step's time went and what bounds it.

    >>> step_line({"step": 300, "loss": 0.0059, "timing": {"step_s": 0.0604, "bottleneck": "compute",
    ...     "compute_share": 0.56, "data_share": 0.27, "comm_share": 0.16}})
    'step 300 loss 0.0059 | 60.4 ms/step: compute 56% data 27% comm 16% -> compute-bound'
    """
    text = f"step {progress.get('step')}"
    loss = progress.get("loss")
    if isinstance(loss, (int, float)):
        text += f" loss {loss:.4f}"
    timing = progress.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("step_s"), (int, float)):
        text += f" | {timing['step_s'] * 1000:.1f} ms/step:"
        for part in ("compute", "data", "comm"):
            share = timing.get(f"{part}_share")
            if isinstance(share, (int, float)):
                text += f" {part} {share * 100:.0f}%"
        if timing.get("bottleneck"):
            text += f" -> {timing['bottleneck']}-bound"
    return text


def steps_redone(record: RunRecord) -> list[int]:
    """Per failure: steps the next attempt computed again (last step reached - resumed step)."""
    out = []
    for prev, nxt in zip(record.attempts, record.attempts[1:], strict=False):
        if prev.last_step is not None:
            out.append(max(0, prev.last_step - (nxt.resumed_from_step or 0)))
    return out


def summary(record: RunRecord) -> str:
    lines = [f"run {record.run} ({record.backend}): {record.status}, {len(record.attempts)} attempt(s)"]
    for a in record.attempts:
        parts = [f"  attempt {a.attempt}: {a.outcome or 'running'}"]
        if a.resumed_from_step is not None:
            parts.append(f"resumed from step {a.resumed_from_step}")
        if a.last_step is not None:
            parts.append(f"reached step {a.last_step}")
        if a.last_checkpoint_step is not None:
            parts.append(f"last checkpoint {a.last_checkpoint_step}")
        if a.evidence:
            parts.append(a.evidence)
        if a.excluded_nodes:
            parts.append(f"excluded {','.join(a.excluded_nodes)}")
        lines.append("; ".join(parts))
        lines += [f"    | {text}" for text in a.error]
    redone = steps_redone(record)
    if redone:
        lines.append(f"  steps redone per failure: {redone}")
    return "\n".join(lines)


# How long `status` looks at a run nobody watches before it answers with what it saw.
RECONCILE_WAIT_S = 3.0
NO_WATCHER = "none: no watcher ran"


def reconcile(record: RunRecord, backend: b.Backend[Any], *, clock: Callable[[], float] = time.time,
              sleep: Callable[[float], None] = time.sleep, wait_s: float = RECONCILE_WAIT_S) -> bool:
    """The true state of a run that says `running` while no watcher holds its lease, read from
    where it runs (processes, containers, Kubernetes objects), folded into ``record``. Returns
    True when the record changed (the caller saves it, holding the lease so no watcher races it).

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
        tracker.feed(backend.poll(ref), clock())
        done = b.Observation([], tracker.nodes).finished
        if (tracker.nodes and (done or F.root_cause(tracker.events))) or clock() >= deadline:
            break
        if tracker.nodes and not done and tracker.last_step is not None:
            break               # running and reporting: that is the answer
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
        record.final_report = (f"run {record.run} succeeded on attempt {last.attempt} at step {last.last_step} "
                               "(seen by `status`: no watcher ran)\n" + summary(record))
        return True
    if not tracker.nodes or b.Observation([], tracker.nodes).finished:
        return False
    return tracker.last_step is not None


def resumable_unwatched(record: RunRecord) -> bool:
    """Did the run fail unwatched (see ``reconcile``) with a failure a watcher would have retried?"""
    last = record.attempts[-1] if record.attempts else None
    return (record.status == "failed" and last is not None and last.decision == NO_WATCHER
            and last.outcome in F.DEFAULT_DECISIONS and F.DEFAULT_DECISIONS[last.outcome] != F.STOP)


def take_up_unwatched(record: RunRecord, spec: Any, places_nodes: bool) -> None:
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
