"""The one record the Kubernetes engine keeps per attempt (run, attempt, namespace): its shape, as
learnt from its Job (node count, container name, the Volcano PodGroup its pods join), what its last
teardown could not do, and, once it is watched, everything the watches have seen of it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ... import labels as L
from ..base import CANCELLED, AttemptRef, Event, NodeStatus
from .cluster import Obj
from .nodewatch import NodeWatch
from .watch import ResourceWatcher

# While some node has no pod, the Job's Events are read this often for the Job controller's
# FailedCreate (a quota, PodSecurity, a missing PriorityClass): the only place that refusal shows.
FAILED_CREATE_EVERY_S = 2.0

Key = tuple[str, int, str]


def spares_of(job: Obj | None) -> int:
    """How many spare nodes a Job keeps: its maxFailedIndexes, where a failed pod fails its index
    only (backoffLimitPerIndex, render.py with restart.spares); 0 for any other Job."""
    spec = (job or {}).get("spec") or {}
    if spec.get("backoffLimitPerIndex") is None:
        return 0
    return int(spec.get("maxFailedIndexes") or 0)


@dataclass
class Attempt:
    ref: AttemptRef
    completions: int = 0             # the Job's node count (0: unknown yet; the Job tells)
    container: str | None = None     # the container of its pods (None: unknown; each pod tells)
    gang: str | None = None          # the PodGroup its pods join (None: no Volcano)
    notes: list[str] = field(default_factory=list)   # what the last teardown could not do, one line each
    watching: bool = False           # its watches and log followers were started (observe.py)
    lock: threading.RLock = field(default_factory=threading.RLock)
    pods: dict[str, Obj] = field(default_factory=dict)      # uid -> latest pod
    node_watch: NodeWatch | None = None       # the Nodes of this attempt's pods (nodewatch.py)
    node_access: bool = True        # False once listing Nodes was forbidden: pods' own evidence decides
    job: Obj | None = None
    job_absent: bool = False        # the Job watch listed no Job, or saw it deleted
    gone: dict[int, Obj] = field(default_factory=dict)      # index -> last state of a deleted pod
    resolved: list[NodeStatus] | None = None   # how an attempt found gone ended (resolve_gone)
    emitted: set[tuple[str, str]] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    failure_seen: bool = False      # a fact that explains a Failed Job was emitted
    events: list[Event] = field(default_factory=list)
    cancelled: bool = False
    cancel_seen: bool = False       # the Job's cancel annotation was reported
    watchers: list[NodeWatch | ResourceWatcher] = field(default_factory=list)
    pod_watch: ResourceWatcher | None = None   # the pods' watch (poll waits for its first list)
    log_threads: dict[int, threading.Thread] = field(default_factory=dict)   # pod index -> its follower
    stop: threading.Event = field(default_factory=threading.Event)
    log_resps: dict[int, Any] = field(default_factory=dict)    # pod index -> its open log stream
    # pods whose log a follower read to its end (the container terminated, the stream ended) or
    # found gone (404): nothing more of them can come (podlogs.py)
    logs_read: set[str] = field(default_factory=set)
    # node 0's end, held back by poll until its follower has read its log to the end
    # (podlogs.hold_end): when the hold began (per pod uid), and the events it holds
    held_since: dict[str, float] = field(default_factory=dict)
    held: list[Event] = field(default_factory=list)
    # what the pods cannot tell, read at most every FAILED_CREATE_EVERY_S (_due): the Job's
    # Events for FailedCreate ("events"), its Kueue Workload ("queue"); name -> last read
    read_at: dict[str, float] = field(default_factory=dict)
    devices_seen: dict[str, dict[str, int]] = field(default_factory=dict)   # pod uid -> device counts first seen
    # spare nodes (spares.py, rounds.py): how many the Job keeps (its maxFailedIndexes), and the
    # slots of the current round (None: no spares, or the rounds not read yet); poll reports those only
    spares: int = 0
    round: int = 0
    active: list[int] | None = None
    store: Obj | None = None        # the c10d store's pod (spare nodes), as last seen
    # keepers' keeper_exit lines read before the rounds were known: (line, the output before it,
    # slot, host), judged once they are (rounds.keeper_exits_due)
    keeper_exits: list[tuple[dict[str, Any], list[str], int, str | None]] = field(default_factory=list)

    def _due(self, what: str, wanted: object) -> bool:
        """Under ``lock``: whether the rate-limited read ``what`` is wanted and due now; if so it
        counts as read."""
        now = time.monotonic()
        if not wanted or now - self.read_at.get(what, float("-inf")) < FAILED_CREATE_EVERY_S:
            return False
        self.read_at[what] = now
        return True

    def learn(self, job: Obj) -> None:
        """The attempt's shape, from its Job: node count, container name, the Volcano PodGroup."""
        spec = job.get("spec") or {}
        template = spec.get("template") or {}
        containers = (template.get("spec") or {}).get("containers") or [{}]
        if not self.watching:        # a watched attempt's Job watch sets it (and starts its log followers)
            self.completions = int(spec.get("completions") or 1)
        self.spares = spares_of(job)
        self.container = self.container or containers[0].get("name")
        # the Volcano PodGroup its pods join, if the spec asked for Volcano (render.py)
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        self.gang = (annotations.get(L.VOLCANO_GROUP)
                     if (template.get("spec") or {}).get("schedulerName") == "volcano" else None)

    def mark_cancelled(self, message: str) -> None:
        """From now on its news is a teardown's, not a failure: say so once."""
        with self.lock:
            if not self.cancelled:
                self.cancelled = True
                self.events.append(Event(CANCELLED, message=message))
