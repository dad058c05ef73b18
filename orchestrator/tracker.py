"""What an attempt's observations add up to: the fold the supervisor decides on.

``AttemptTracker`` takes each ``Observation`` a backend's ``poll`` returns and keeps what a root
cause can be found in (failure evidence, the heartbeat, the newest step and checkpoint, the
cluster's reason for waiting), then says whether the attempt failed and why. It decides nothing
and touches no backend: the supervisor acts on its verdict, and reconcile reads a run nobody
watches through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from . import failures as F
from .backends import base as b
from .display import step_text
from .silence import Silence
from .stragglers import Straggler, Stragglers

# What a node whose end was found benign (endgame.benign_exit: shutdown noise, a crash on the way
# out, a loss or a freeze after the job completed) may still report; none of it is a failure.
AFTER_BENIGN = (b.NODE_EXITED, b.EVICTED, b.NODE_LOST, b.NODE_PAUSED)


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
    resume_not_exact: str | None = None     # the resume line's reason when it said "exact": false
    first_progress_at: float | None = None
    first_step_at: float | None = None
    preempted: bool = False
    completed_step: int | None = None       # the job's own `exit` event said completed, at this step
    crash_held: dict[int, float] = field(default_factory=dict)   # node -> since when its signal death waits on rank 0
    done_at: float | None = None            # since when the job is done: it completed, a node's exit was benign
    all_started_at: float | None = None
    warned: set[str] = field(default_factory=set)     # timing advice already shown
    # node -> why its end is not the job's failure: its agent failed only on its way out after its
    # workers succeeded (failures.shutdown_noise), or it ended after the job completed (a crash
    # on the way out, a scheduler's signal); None: the job as a whole (Slurm's TIMEOUT)
    benign: dict[int | None, str] = field(default_factory=dict)
    tails: dict[int, list[str]] = field(default_factory=dict)   # node -> the end of its output, once read
    waiting: b.Event | None = None          # the cluster's newest reason for nodes not created / not placed
    waiting_since: float | None = None      # since when some node waits with a reason
    queued: b.Event | None = None           # the queue's newest reason for holding the job (no timeout)
    # placed nodes not started yet (pulling the image, creating the container): since when, and
    # the newest cause a failed pull gave (a back-off names none)
    starting_since: float | None = None
    pull_cause: b.Event | None = None
    silence: Silence | None = None                    # the runtime's per-node beat (silence.py)
    in_place: bool = False      # a later round of the attempt (spare nodes): its resume keeps the attempt's own
    stragglers: Stragglers | None = None              # the ranks' step pace (stragglers.py)
    paced: bool = False                               # a pace event arrived
    # news for the supervisor to tell: nodes newly declared stragglers, group ranks no longer one
    straggler_news: list[Straggler] = field(default_factory=list)
    straggler_cleared: list[int] = field(default_factory=list)

    def next_round(self, now: float, silence: Silence | None,
                   stragglers: Stragglers | None = None) -> "AttemptTracker":
        """The tracker of the attempt's next round after an in-place recovery: what the attempt
        did so far stays (its newest step and checkpoint, where it resumed from), its nodes and
        failure evidence start over."""
        return AttemptTracker(started_at=now, silence=silence, last_step=self.last_step,
                              last_checkpoint_step=self.last_checkpoint_step,
                              resumed_from_step=self.resumed_from_step, resume_not_exact=self.resume_not_exact,
                              in_place=True, stragglers=stragglers, paced=self.paced)

    def __post_init__(self) -> None:
        self.last_heartbeat = self.started_at

    def feed(self, obs: b.Observation, now: float) -> list[b.Event]:
        # Only evidence a root cause can be found in is kept (a failure: few, one per node at most
        # before teardown). Output lines are only a heartbeat, and progress lines are folded into
        # the fields below and streamed to the run store: keeping them would grow with the run
        # (issue 22: 100k steps took the watcher from 26 to 143 MB).
        self.events += [ev for ev in obs.events if F.classify_event(ev) is not None]
        self.nodes = obs.nodes
        if self.all_started_at is None and obs.nodes and all(n.phase != b.PENDING for n in obs.nodes):
            # The heartbeat clock starts when every node runs: time spent queued (Kueue, Volcano),
            # scheduling or pulling a large image is not a hang.
            self.all_started_at = now
            self.last_heartbeat = max(self.last_heartbeat, now)
        self._fold_waits(obs, now)
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
                if not (self.in_place and self.resumed_from_step is not None):
                    self.resumed_from_step = p["step"]
                # A later line may say so after all (a resume amended to not exact).
                self.resume_not_exact = not_exact_reason(p) or self.resume_not_exact
            if p.get("event") == "preempted":
                self.preempted = True
            if p.get("event") == "exit" and p.get("status") == "completed":
                self.completed_step = p["step"] if isinstance(p.get("step"), int) else self.last_step
            if self.silence is not None:
                self.silence.feed(p, now)
            if self.stragglers is not None and p.get("event") == "pace":
                self.paced = True
                new, cleared = self.stragglers.feed(p, now)
                self.straggler_news += new
                self.straggler_cleared += cleared
        return obs.events

    def _fold_waits(self, obs: b.Observation, now: float) -> None:
        """Why nodes are not running yet, while they are not: not placed or not created (the
        cluster's reason: restart.pending_timeout), queued (no timeout), placed and not started
        (pulling the image: restart.image_pull_timeout, with the last failed pull's cause)."""
        if self.all_started_at is not None:
            self.waiting = self.waiting_since = self.queued = None
            self.starting_since = self.pull_cause = None
            return
        if any(n.phase == b.PENDING and n.host for n in obs.nodes):
            self.starting_since = self.starting_since if self.starting_since is not None else now
        for ev in obs.events:
            if ev.kind == b.NODE_WAITING and ev.reason in F.PULL_REASONS:
                if ev.reason == "ErrImagePull" or self.pull_cause is None:   # a back-off names no cause
                    self.pull_cause = ev
            elif ev.kind == b.NODE_WAITING:
                self.waiting = ev
                self.waiting_since = self.waiting_since if self.waiting_since is not None else now
            elif ev.kind == b.NODE_QUEUED:
                self.queued = ev

    @property
    def succeeded(self) -> bool:
        # An end found benign (endgame.benign_exit) is a failed node's or, after the job completed,
        # a lost one's.
        return bool(self.nodes) and all(
            n.phase == b.SUCCEEDED or n.phase in (b.FAILED, b.LOST) and n.node in self.benign for n in self.nodes)

    def failure(self, now: float, heartbeat_timeout: float, pending_timeout: float = float("inf"),
                image_pull_timeout: float = float("inf")) -> F.Failure | None:
        for ev in self.silence.lost(now) if self.silence is not None else []:
            node = next((n.node for n in self.nodes if ev.host and n.host == ev.host), None)
            self.events.append(replace(ev, node=node))
        found = F.root_cause([ev for ev in self.events
                              if not (ev.kind in AFTER_BENIGN and ev.node in self.benign)])
        if found is None and self.waiting is not None and self.waiting_since is not None:
            found = F.pending_failure(self.waiting, self.waiting_since, now, pending_timeout)
        if found is None and self.starting_since is not None and self.all_started_at is None:
            found = F.start_failure(self.pull_cause, [n for n in self.nodes if n.phase == b.PENDING and n.host],
                                    self.starting_since, now, image_pull_timeout)
        if found is not None and found.kind == F.APP_ERROR and self.preempted:
            # torchrun's agent exits 1 whatever its workers' codes: the job's own `preempted`
            # line says the exit was the graceful, checkpointed stop.
            return F.Failure(F.PREEMPTED, found.node, found.host, found.time,
                              f"checkpointed and stopped on SIGTERM at step {step_text(self.last_step)} "
                              f"({found.evidence})")
        if found is not None:
            return found
        if self.succeeded or (self.all_started_at is None and self.first_progress_at is None):
            return None
        if self.done_at is not None:
            return None     # a done job's silence is its nodes' exit barrier (Supervisor._left_in_barrier)
        return F.hang_failure(self.last_heartbeat, now, heartbeat_timeout, self.nodes)



def not_exact_reason(resume: dict[str, Any]) -> str | None:
    """Why a resume line says it is not exact; None when it does not say so."""
    return str(resume.get("reason") or "reason not given") if resume.get("exact") is False else None
