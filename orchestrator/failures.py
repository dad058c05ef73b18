"""What went wrong with an attempt, and what to do about it: pure and table-driven.

The root cause is the first failure in time. Ranks that crash because a peer vanished are
consequences: a node lost (or frozen) shortly after another node's app-looking exit wins
over that exit, because survivors of a lost peer die with ordinary error codes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backends import base as b
from .runtime.protocol import PREEMPTED_EXIT_CODE

# Failure classes.
NODE_LOST = "node_lost"
PREEMPTED = "preempted"
OOM = "oom"
IMAGE_PULL = "image_pull"
APP_ERROR = "app_error"
HANG = "hang"
CANCELLED = "cancelled"

# Decisions.
RETRY = "retry"                    # same placement is fine
RETRY_ELSEWHERE = "retry_elsewhere"  # exclude the failed node
STOP = "stop"

DEFAULT_DECISIONS = {
    NODE_LOST: RETRY_ELSEWHERE,
    HANG: RETRY_ELSEWHERE,
    PREEMPTED: RETRY,
    OOM: STOP,          # the same job on the same shape OOMs again; retry_on_oom opts in
    IMAGE_PULL: STOP,   # a wrong tag or missing credentials do not fix themselves
    APP_ERROR: STOP,    # a bug in the job: retrying burns the budget and hides it
    CANCELLED: STOP,
}

SIGKILL_EXIT = 137
SIGTERM_EXIT = 143
# A peer's loss reaches survivors within seconds as connection errors; their own exits inside
# this window after a loss, or before a loss that follows quickly, are consequences.
CONSEQUENCE_WINDOW_S = 10.0


@dataclass(frozen=True)
class Failure:
    kind: str
    node: int | None
    host: str | None
    time: float
    evidence: str

    def describe(self) -> str:
        where = f" on node {self.node}" + (f" ({self.host})" if self.host else "") if self.node is not None else ""
        return f"{self.kind}{where}: {self.evidence}"


def classify_event(ev: b.Event) -> Failure | None:
    """One event -> the failure it shows, or None for a healthy event."""
    k = ev.kind
    if k == b.NODE_LOST:
        return Failure(NODE_LOST, ev.node, ev.host, ev.time, ev.message or ev.reason or "node lost")
    if k == b.NODE_PAUSED:
        return Failure(HANG, ev.node, ev.host, ev.time, ev.message or "node frozen (paused)")
    if k == b.OOM_KILLED:
        return Failure(OOM, ev.node, ev.host, ev.time, ev.message or "killed for memory (OOMKilled)")
    if k == b.IMAGE_PULL_FAILED:
        return Failure(IMAGE_PULL, ev.node, ev.host, ev.time, ev.message or ev.reason or "image pull failed")
    if k == b.EVICTED:
        return Failure(PREEMPTED, ev.node, ev.host, ev.time, ev.message or ev.reason or "evicted")
    if k == b.CANCELLED:
        return Failure(CANCELLED, ev.node, ev.host, ev.time, ev.message or "cancelled")
    if k == b.NODE_EXITED:
        code = ev.exit_code
        if code == 0:
            return None
        if code == PREEMPTED_EXIT_CODE:
            return Failure(PREEMPTED, ev.node, ev.host, ev.time, f"exit {code}: checkpointed and stopped on SIGTERM")
        if ev.reason == "OOMKilled":
            return Failure(OOM, ev.node, ev.host, ev.time, f"exit {code}, OOMKilled")
        if code in (SIGKILL_EXIT, -9) or ev.reason == "SIGKILL":
            return Failure(NODE_LOST, ev.node, ev.host, ev.time, f"exit {code}: killed (SIGKILL) from outside the job")
        if code in (SIGTERM_EXIT, -15):
            return Failure(PREEMPTED, ev.node, ev.host, ev.time,
                           f"exit {code}: terminated (SIGTERM) without a checkpoint")
        return Failure(APP_ERROR, ev.node, ev.host, ev.time, f"exit {code}" + (f" ({ev.reason})" if ev.reason else ""))
    return None


_PRIORITY = {NODE_LOST: 0, HANG: 1, OOM: 2, IMAGE_PULL: 3, PREEMPTED: 4, APP_ERROR: 5, CANCELLED: 6}


def root_cause(events: list[b.Event]) -> Failure | None:
    """The first failure in time; an app-looking exit yields to a nearby infrastructure failure."""
    failures = sorted((f for f in map(classify_event, events) if f is not None), key=lambda f: f.time)
    if not failures:
        return None
    first = failures[0]
    if first.kind in (APP_ERROR, PREEMPTED) and not first.evidence.startswith("exit 83"):
        for other in failures[1:]:
            if other.time - first.time > CONSEQUENCE_WINDOW_S:
                break
            if _PRIORITY[other.kind] < _PRIORITY[first.kind] and other.kind in (NODE_LOST, HANG, OOM):
                return other
    return first


def hang_failure(last_heartbeat: float, now: float, timeout: float) -> Failure | None:
    if now - last_heartbeat > timeout:
        return Failure(HANG, None, None, now, f"no progress line for {now - last_heartbeat:.0f} s "
                       f"(heartbeat timeout {timeout:.0f} s): a frozen node or a stuck collective")
    return None


def decide(failure: Failure, *, retry_on_oom: bool = False, exclude_failed_nodes: bool = True) -> str:
    decision = DEFAULT_DECISIONS[failure.kind]
    if failure.kind == OOM and retry_on_oom:
        decision = RETRY
    if decision == RETRY_ELSEWHERE and not exclude_failed_nodes:
        decision = RETRY
    return decision
