"""The backend protocol: what local, Docker and Kubernetes backends all provide.

A backend turns a Plan (pure data, printable with --dry-run) into a running attempt and
reports what happens to it. It never retries on its own: the supervisor owns retries.
Observation is poll-based (``poll`` returns what is new since the last call) so the
supervisor can enforce heartbeat timeouts and tests can drive it step by step; backends
with push APIs (Docker events, Kubernetes watches) buffer into a queue that ``poll`` drains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, runtime_checkable

# Node phases as the supervisor sees them, whatever the backend.
PENDING, RUNNING, SUCCEEDED, FAILED, LOST, PAUSED, UNKNOWN = (
    "pending", "running", "succeeded", "failed", "lost", "paused", "unknown")

# Event kinds.
NODE_STARTED = "node_started"          # a node's process/container/pod is running
NODE_EXITED = "node_exited"            # it ended; exit_code set (0 = success)
NODE_LOST = "node_lost"                # the machine/container vanished or became unreachable
NODE_PAUSED = "node_paused"            # frozen (docker pause, SIGSTOP): no exit will come
OOM_KILLED = "oom_killed"              # the kernel/kubelet killed it for memory
EVICTED = "evicted"                    # preempted / evicted / DisruptionTarget (graceful)
IMAGE_PULL_FAILED = "image_pull_failed"
PROGRESS = "progress"                  # a WMCTL-PROGRESS line from rank 0 (also the heartbeat)
CANCELLED = "cancelled"


@dataclass(frozen=True)
class AttemptRef:
    """Identifies one attempt of a run on one backend (state lives where the run lives)."""

    backend: str
    run: str
    attempt: int
    namespace: str | None = None   # Kubernetes namespace; Docker/local: None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def attempt_name(self) -> str:
        return attempt_name(self.run, self.attempt)


def attempt_name(run: str, attempt: int) -> str:
    """Deterministic per-attempt name: a second submit of the same attempt is a conflict."""
    return f"{run}-a{attempt}"


@dataclass(frozen=True)
class Event:
    kind: str
    time: float = field(default_factory=time.time)
    node: int | None = None            # node index within the attempt
    host: str | None = None            # physical node/host name, for exclusion
    exit_code: int | None = None
    reason: str | None = None          # e.g. OOMKilled, DeletionByTaintManager, NodeNotReady
    message: str = ""
    progress: dict[str, Any] | None = None


@dataclass(frozen=True)
class NodeStatus:
    node: int
    phase: str
    host: str | None = None
    exit_code: int | None = None
    reason: str | None = None


@dataclass
class Observation:
    """What ``poll`` returns: events since the last poll and every node's current state."""

    events: list[Event]
    nodes: list[NodeStatus]

    @property
    def finished(self) -> bool:
        return bool(self.nodes) and all(n.phase in (SUCCEEDED, FAILED, LOST) for n in self.nodes)


@runtime_checkable
class Backend(Protocol):
    name: str
    places_nodes: bool    # can an attempt be kept off named hosts (exclude_failed_nodes)?

    def submit(self, plan: Any) -> AttemptRef:
        """Start the attempt the plan describes. Idempotent per attempt name: an existing
        attempt with that name is adopted, never duplicated."""

    def poll(self, ref: AttemptRef) -> Observation:
        """New events since the last poll plus the state of every node."""

    def logs(self, ref: AttemptRef, node: int = 0, follow: bool = False) -> Iterator[str]:
        """Lines of one node's output."""

    def cancel(self, ref: AttemptRef) -> None:
        """Tear down everything of the attempt at once. Idempotent."""

    def release(self, ref: AttemptRef) -> None:
        """The attempt ended well: free what still holds its name (finished containers) while
        keeping its logs readable. Idempotent."""

    def attempts(self, run: str) -> list[AttemptRef]:
        """Every attempt of ``run`` this backend still knows, oldest first."""

    def close(self) -> None:
        """Stop this object's background threads (watches, log followers); the attempts
        themselves are left as they are. A process must not exit with them still reading."""
