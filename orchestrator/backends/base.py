"""The backend base class: what every backend provides, and the capability flags that say
what it cannot do.

A backend turns a Plan (pure data, printable with --dry-run) into a running attempt and
reports what happens to it. It never retries on its own: the supervisor owns retries.
Observation is poll-based (``poll`` returns what is new since the last call) so the
supervisor can enforce heartbeat timeouts and tests can drive it step by step; backends
with push APIs (Docker events, Kubernetes watches) buffer into a queue that ``poll`` drains.
"""

from __future__ import annotations

import re
import time
from dataclasses import field
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Generic, Iterator

from ..layout import attempt_name
from ..runtime.protocol import parse_progress, run_checkpoint_dir
from ..runtime.records import record
from ..plan import AttemptContext, HostFacts, Plan, R
from ..serialize import dump
from ..spec import JobSpec
from ..vendors import VendorProfile

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
NODE_WAITING = "node_waiting"          # not created or not placed yet; the cluster says why (no failure alone)
NODE_QUEUED = "node_queued"            # held by a queue until it admits the job (Kueue): waits as long as it takes
NODE_UNPLACEABLE = "node_unplaceable"  # the cluster says it can never place the request as asked: stop, no waiting
PROGRESS = "progress"                  # a WMCTL-PROGRESS line from rank 0 (also the heartbeat)
OUTPUT = "output"                      # any other line: the heartbeat of a job that prints no progress lines
CANCELLED = "cancelled"

# What teardown keeps of a node whose output goes with it (containers, pods): the end, where the
# cause is. `wmctl logs` of a failed attempt is the first thing a user asks for.
ARCHIVE_TAIL_LINES = 20000

# A job that never imports orchestrator.runtime prints no progress lines; its own output is its
# sign of life. One line per node per second is enough for that and keeps a chatty job cheap.
OUTPUT_EVERY_S = 1.0


# The node that keeps the runtime's witness (runtime/liveness.py WITNESS: group rank 1, which is
# node 1 wherever ranks follow the sorted host names, Kubernetes and Docker) reports group rank
# 0's node when it goes silent, on its own output. Backends that read only node 0's output follow
# node 1's as well, for these lines alone: one more stream per attempt, whatever the job's size.
WITNESS_NODE = 1
WITNESS_EVENTS = ("node_silent", "node_beat")


def witness_progress(payload: dict[str, Any]) -> bool:
    """Is this progress line from the witness stream one to keep (about group rank 0)?"""
    g = payload.get("group_rank")
    return payload.get("event") in WITNESS_EVENTS and isinstance(g, int) and not isinstance(g, bool) and g == 0


# The longest line the watcher reads whole (bytes). A longer one (a job dumping a tensor, a
# progress bar redrawn for hours without a newline) is cut here with CUT_MARKER, never dropped: the
# watcher's memory stays bounded whatever a job prints. A progress line is a few hundred bytes.
MAX_LINE_BYTES = 64 * 1024
CUT_MARKER = f" [wmctl: line cut at {MAX_LINE_BYTES} bytes]".encode()
# What ends a line: a newline, and a carriage return (tqdm and other progress bars redraw their
# line with '\r' and print no newline for as long as they run).
_LINE_END = re.compile(rb"\r\n|\r|\n")
# A log an engine stamps line by line (Docker's, the kubelet's): a newline ends a stamped line, and
# a '\r' inside one is a redraw within it (output_event shows its last).
NEWLINE = re.compile(rb"\n")


class LineSplitter:
    """Bytes of a node's output -> its lines, as they complete. '\r' ends a line like '\n' (a
    progress bar's redraw is its sign of life); a line longer than ``limit`` comes out cut to
    ``limit`` bytes plus CUT_MARKER as soon as it passes the limit, and the rest of it, up to its
    end, is skipped. What is held between feeds is at most ``limit`` bytes."""

    def __init__(self, limit: int = MAX_LINE_BYTES, ends: "re.Pattern[bytes]" = _LINE_END):
        if limit < 1:
            raise ValueError(f"LineSplitter limit must be at least 1 byte, got {limit}")
        self.limit, self.ends = limit, ends
        self.pending = b""
        self.cutting = False        # inside a line already given out cut: skip to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        parts = self.ends.split(self.pending + chunk)
        self.pending = parts.pop()
        out = []
        for part in parts:
            if self.cutting:
                self.cutting = False        # the end of the line already given out
                continue
            out.append(part[:self.limit] + CUT_MARKER if len(part) > self.limit else part)
        if len(self.pending) > self.limit:
            if not self.cutting:
                out.append(self.pending[:self.limit] + CUT_MARKER)
            self.cutting, self.pending = True, b""
        return out

    def flush(self) -> list[bytes]:
        """The unfinished last line (a stream's end), if any."""
        rest, self.pending = self.pending, b""
        return [] if self.cutting or not rest else [rest]


def cut_line(text: str, limit: int = MAX_LINE_BYTES) -> str:
    """``text`` cut to ``limit`` characters plus CUT_MARKER when longer (a line read whole by a
    client library): the watcher keeps no longer line."""
    return text if len(text) <= limit else text[:limit] + CUT_MARKER.decode()


def output_event(last: dict[int, float], node: int, host: str | None, line: str,
                 now: float | None = None) -> "Event | None":
    """An OUTPUT event for ``line`` unless ``node`` had one less than OUTPUT_EVERY_S ago. Of a
    line a progress bar redrew with '\r', what a terminal shows: its last redraw."""
    now = time.time() if now is None else now
    text = next((seg for seg in reversed(line.split("\r")) if seg.strip()), "").rstrip()
    if not text or now - last.get(node, float("-inf")) < OUTPUT_EVERY_S:
        return None
    last[node] = now
    return Event(OUTPUT, now, node, host, message=text[-200:])


def line_event(line: str, node: int, host: str | None, output_at: dict[int, float], *,
               witness: bool = False, stamp: float | None = None) -> "Event | None":
    """The event one line of a node's output makes, the same on every backend. A WMCTL-PROGRESS
    line is a PROGRESS event at the line's own time (else ``stamp``, the engine's time of the line,
    else now); any other line an OUTPUT heartbeat (``output_event``: at most one per node per
    OUTPUT_EVERY_S, remembered in ``output_at``). From the witness's stream (``witness``) only its
    reports about group rank 0 count (``witness_progress``): the rest is rank 0's to tell."""
    payload = parse_progress(line)
    if payload is None:
        return None if witness else output_event(output_at, node, host, line)
    if witness and not witness_progress(payload):
        return None
    own = payload.get("time")
    at = (float(own) if isinstance(own, (int, float)) and not isinstance(own, bool)
          else stamp if stamp is not None else time.time())
    return Event(PROGRESS, at, node, host, progress=payload)


@record(frozen=True)
class AttemptRef:
    """Identifies one attempt of a run on one backend (state lives where the run lives)."""

    backend: str
    run: str
    attempt: int
    namespace: str | None = None   # where the attempt's objects live, on a namespaced backend

    @property
    def attempt_name(self) -> str:
        return attempt_name(self.run, self.attempt)


@record(frozen=True)
class Event:
    """Something that happened to a node of an attempt (``kind``: one of the event kinds above)."""

    kind: str
    time: float = field(default_factory=time.time)
    node: int | None = None            # node index within the attempt
    host: str | None = None            # physical node/host name, for exclusion
    exit_code: int | None = None
    reason: str | None = None          # e.g. OOMKilled, DeletionByTaintManager, NodeNotReady
    message: str = ""
    progress: dict[str, Any] | None = None
    # A loss found after the fact (a node gone without an exit status, seen when someone looked):
    # the earliest it can have happened, the node's last sign of life. ``time`` is when it was seen.
    since: float | None = None


@record(frozen=True)
class NodeStatus:
    """A node's current phase as the supervisor sees it, whatever the backend."""

    node: int
    phase: str
    host: str | None = None
    exit_code: int | None = None
    reason: str | None = None


@record
class Observation:
    """What ``poll`` returns: events since the last poll and every node's current state."""

    events: list[Event]
    nodes: list[NodeStatus]
    # a node that ended reads as running until its last output lines are read (Kubernetes:
    # podlogs.hold_end): a one-look reader must not take it for a run still going
    settling: bool = False

    @property
    def finished(self) -> bool:
        return bool(self.nodes) and all(n.phase in (SUCCEEDED, FAILED, LOST) for n in self.nodes)


@record(frozen=True)
class LogQuery:
    """Which lines of a node's output ``logs`` returns, beyond following it. A backend serves the
    fields its ``log_options`` names; ``backends.check_logs`` refuses the others before asking."""

    tail: int | None = None         # only the last N lines ("tail")
    since: float | None = None      # only lines written at or after this Unix time ("since")
    timestamps: bool = False        # each line led by its RFC 3339 time and a space ("timestamps")
    #: while following: stop once this says the attempt is over, on a backend whose stream cannot
    #: tell (a local node killed with its keeper writes no exit file).
    stop: Callable[[], bool] | None = None

    def asked(self) -> list[str]:
        """The log options this query uses, by their ``log_options`` names."""
        return [name for name, used in (("tail", self.tail is not None), ("since", self.since is not None),
                                        ("timestamps", self.timestamps)) if used]


LOG_OPTION_FLAGS = {"tail": "--tail", "since": "--since", "timestamps": "--timestamps"}


def rfc3339(unix_ns: int) -> str:
    """A log line's time as ``--timestamps`` prints it on every backend: Go's RFC3339Nano in UTC
    (trailing zeros of the fraction dropped), as the kubelet and the Docker engine write it."""
    secs, frac = divmod(int(unix_ns), 1_000_000_000)
    digits = f"{frac:09d}".rstrip("0")
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + (f".{digits}Z" if digits else "Z")


def kept_lines(lines: list[str], query: "LogQuery", *, what: str) -> list[str]:
    """A kept (archived) log, which holds no times: ``tail`` applies; ``since`` and
    ``timestamps`` cannot, and say so."""
    if query.since is not None or query.timestamps:
        from ..errors import OptionError

        flag = "--since" if query.since is not None else "--timestamps"
        raise OptionError(f"{flag}: {what} was torn down and its kept log holds no times",
                          hint=f"drop {flag} (--tail N still works), or ask while the attempt runs")
    return lines if query.tail is None else lines[-query.tail:] if query.tail else []


def kept_log(ref: "AttemptRef", node: int, query: "LogQuery") -> list[str] | None:
    """The lines ``logs`` serves of a node whose attempt wmctl tore down (teardown kept its tail in
    the run folder: the containers or pods, and their output, are gone or going), narrowed by
    ``query`` (``kept_lines``); None while nothing was kept, so the engine reads the node itself."""
    from ..state import open_store

    archived = open_store(ref.run).archived_log(ref.attempt, node)
    return None if archived is None else kept_lines(archived, query, what=ref.attempt_name)


@record(frozen=True)
class BackendOptions:
    """How to reach a backend's engine: what a user gives on the command line or a record holds."""

    context: str | None = None      # Kubernetes: kubeconfig context
    kubeconfig: str | None = None   # Kubernetes: the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)
    namespace: str | None = None    # Kubernetes: default namespace of the run's objects


@record(frozen=True)
class InPlaceRecovery:
    """A lost node replaced by a warm spare inside the attempt (``Backend.recover_in_place``)."""

    round: int          # the attempt's new round (0: as submitted)
    lost: int           # the slot that was lost
    spare: int          # the spare slot that takes its place
    spares_left: int


class Backend(ABC, Generic[R]):
    """A place to run attempts: plans them (pure, from the spec and the host's facts), then
    submits, observes, tears down and lists them. It never retries on its own: the supervisor
    owns retries.

    The class attributes are what the backend can and cannot do. They are checked in one
    generic place (``backends.check``) and read by the supervisor; nothing else asks which
    backend it is talking to.
    """

    name: ClassVar[str]
    #: can an attempt be kept off named hosts (``restart.exclude_failed_nodes``)?
    places_nodes: ClassVar[bool] = False
    #: can ``cancel(graceful=True)`` send SIGTERM and wait for the job's checkpoint?
    graceful_cancel: ClassVar[bool] = False
    #: a module keeping run state where the runs live (``open_store(run)``, ``list_runs()``),
    #: chosen with WMCTL_RUN_STORE=<backend name>; None: run state stays on this machine only
    run_store: ClassVar[str | None] = None
    #: can it run a run's watcher where the runs live (``start_watcher``, ``retire_watcher``)?
    #: Only with a ``run_store``: the watcher there must find the run's state.
    cluster_watcher: ClassVar[bool] = False
    #: do nodes run ``image.tag`` (so it must be set and the command must be non-empty)?
    runs_image: ClassVar[bool] = True
    #: do checkpoints outlive a node without a volume (a local run writes to this machine's disk)?
    checkpoints_outlive_nodes: ClassVar[bool] = False
    #: are host_path volumes folders of this machine (a local engine's bind mounts), so a path in
    #: the job is named to the user as the folder here that holds it?
    host_paths_here: ClassVar[bool] = False
    #: the volume sources it can mount
    volume_sources: ClassVar[frozenset[str]] = frozenset(("pvc", "host_path", "nfs", "empty_dir",
                                                           "secret", "config_map"))
    #: do its objects live in a namespace (``kubernetes.namespace``)?
    namespaced: ClassVar[bool] = False
    #: can ``poll`` tell how an attempt ended whose objects are all gone (Kubernetes: a Job the TTL
    #: removed, from the Job controller's Event)? If not, such an attempt is a loss nobody saw.
    resolves_gone: ClassVar[bool] = False
    #: can it keep warm spare nodes (``restart.spares``) and replace a dead node in place
    #: (``recover_in_place``)? Checked in one place: ``backends.check``.
    spares: ClassVar[bool] = False
    #: can it start a new spare for one an in-place recovery used (``replenish_spare``), in the
    #: background? Not where the attempt's nodes are fixed when it starts (a Slurm allocation).
    replenishes_spares: ClassVar[bool] = False
    #: are its nodes machines, so a node excluded for a lost node, a device fault or a hang is
    #: remembered past the run (``restart.remember_exclusions``, ``cluster_key``)? Not where a
    #: "node" is a process or a container of this machine.
    remembers_exclusions: ClassVar[bool] = False
    #: which ``LogQuery`` fields ``logs`` serves ("tail", "since", "timestamps"); following and
    #: --all-nodes work everywhere. Checked in one place: ``backends.check_logs``.
    log_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def create(cls, options: BackendOptions) -> "Backend[Any]":
        """The one factory: the registry calls it with what the user or the run record gives."""
        return cls()

    # -- planning: pure renders of the spec, given the host's facts ----------------------------
    @classmethod
    def check(cls, spec: JobSpec) -> list[tuple[str, str]]:
        """Spec problems only this backend has (beyond what its capability flags imply)."""
        return []

    @classmethod
    @abstractmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, host: HostFacts) -> Plan[R]:
        """Exactly what ``submit`` will create for this attempt. Pure: no host reads."""

    def host_facts(self, spec: JobSpec) -> HostFacts:
        """The facts of the machine that plans (and, for local, runs) the attempt."""
        return HostFacts.of_this_machine()

    def plan(self, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext) -> Plan[R]:
        """The one planner: ``--dry-run`` prints it, ``submit`` hands it to ``submit``."""
        return self.render(spec, profile, ctx, self.host_facts(spec))

    @classmethod
    def document(cls, plan: Plan[R], output: str) -> str:
        """What ``render`` and ``submit --dry-run`` print for a plan."""
        return dump(plan.to_dict(), output)

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoint_root(self, spec: JobSpec) -> tuple[str, bool]:
        """Where the run of ``spec`` keeps its checkpoints, as its job sees them, and whether that
        path is on this machine (so it can be checked here). Default: inside the nodes."""
        return run_checkpoint_dir(spec.checkpoint.dir or "", spec.name), False

    # -- the host: what this machine must hold before the first attempt ----------------------
    def check_host(self, spec: JobSpec) -> list[tuple[str, str]]:
        """Problems this machine has with the spec (a read-only host folder that is missing),
        raised with the spec's own problems by the dry run, before anything is submitted.
        Default: none (the backend reads no folder of this machine)."""
        return []

    def prepare_host(self, spec: JobSpec) -> list[str]:
        """Make this machine ready for a new run (create its missing writable host folders) and
        say what was done, one note each. Called once when a run is scheduled, never by a dry run."""
        return []

    def namespace_of(self, spec: JobSpec) -> str | None:
        """Where this backend keeps the run's objects (None on a backend without namespaces)."""
        return None

    def placeable_hosts(self, spec: JobSpec) -> frozenset[str] | None:
        """The nodes that could take an attempt of ``spec`` now (up, schedulable, in its pool), so
        that exclusions never leave fewer than it needs; None when not known (nothing is capped
        then, and an attempt that cannot be placed is retried with none excluded). Asked by a
        watcher before each submission that excludes a node, never by a dry run."""
        return None

    def cluster_key(self) -> str | None:
        """Which cluster this backend places nodes on, as remembered exclusions are keyed (two
        clusters never mix); None when it cannot tell (nothing is remembered or applied then).
        Only where ``remembers_exclusions``."""
        return None

    # -- the engine --------------------------------------------------------------------------
    @abstractmethod
    def submit(self, plan: Plan[R]) -> AttemptRef:
        """Start the attempt the plan describes. Idempotent per attempt name: an existing
        attempt with that name is adopted, never duplicated."""

    @abstractmethod
    def poll(self, ref: AttemptRef) -> Observation:
        """New events since the last poll plus the state of every node."""

    @abstractmethod
    def logs(self, ref: AttemptRef, node: int = 0, follow: bool = False,
             query: LogQuery | None = None) -> Iterator[str]:
        """Lines of one node's output, narrowed by ``query`` (only fields in ``log_options``)."""

    @abstractmethod
    def cancel(self, ref: AttemptRef, graceful: bool = False) -> None:
        """Tear down everything of the attempt at once (SIGTERM first and a wait for the job's
        checkpoint with ``graceful``, where ``graceful_cancel``). Idempotent."""

    def cut_grace(self, ref: AttemptRef, dead_hosts: list[str]) -> None:
        """A peer of the attempt is known dead (node_lost): its survivors are blocked in a
        collective that cannot complete, and so is any SIGTERM checkpoint they would try. End
        them with a short grace period rather than their full one, and the pods of the dead
        hosts at once, before ``cancel``. Default: nothing (a backend whose teardown kills at
        once)."""

    def recover_in_place(self, ref: AttemptRef, node: int) -> InPlaceRecovery | None:
        """Lost ``node`` (a slot of the attempt) replaced by a warm spare without a new attempt:
        the survivors' workers restart in place and meet the spare in a new rendezvous round
        (docs/spares.md). None when the attempt has no spare left. Only where ``spares``."""
        return None

    def replenish_spare(self, ref: AttemptRef, lost: int) -> int | None:
        """Start one new spare slot for the attempt after an in-place recovery replaced slot
        ``lost`` (the new spare gets the resources the lost node freed, where that matters: its
        CPUs and devices on one machine), without waiting for it to be warm; its slot number, or
        None when it cannot be started.
        Called once the run has resumed, never on a recovery's critical path. Only where
        ``replenishes_spares``."""
        return None

    def note_cancel(self, ref: AttemptRef, intent: dict[str, Any]) -> None:
        """Write the cancel intent onto the attempt's own objects too, before the teardown, where
        the backend can (Kubernetes: an annotation on the Job, seen by a watcher on any machine).
        Docker cannot change a container's labels after creation, and local processes carry none:
        there the run store alone holds it. Best effort."""

    def teardown_notes(self, ref: AttemptRef) -> list[str]:
        """What the last ``cancel`` of ``ref`` could not do and went on without (a step the
        user's permissions forbid), one line each. Default: nothing."""
        return []

    def release(self, ref: AttemptRef) -> None:
        """The attempt ended well: free what still holds its name (finished containers) while
        keeping its logs readable. Idempotent."""

    @abstractmethod
    def attempts(self, run: str) -> list[AttemptRef]:
        """Every attempt of ``run`` this backend still knows, oldest first."""

    @classmethod
    def watcher_problems(cls, spec: JobSpec) -> list[tuple[str, str]]:
        """(field, why) for a spec whose watcher ``start_watcher`` could not start."""
        return []

    def store_environment(self, spec: JobSpec) -> dict[str, str]:
        """The environment (beyond WMCTL_RUN_STORE) under which this backend's ``run_store`` keeps
        a run where ``start_watcher``'s watcher reads it: the submitting machine must write there."""
        return {}

    def start_watcher(self, run: str, spec: JobSpec) -> str:
        """Start ``run``'s watcher where the runs live (``cluster_watcher``); returns how to
        follow it. Its state must already be in the backend's ``run_store``."""
        raise NotImplementedError(f"{self.name} runs no watcher of its own (cluster_watcher is False)")

    def retire_watcher(self, run: str) -> str | None:
        """Inside the watcher that ``start_watcher`` started, once the run has ended: remove what
        would restart it. None when this process is no such watcher."""
        return None

    def close(self) -> None:
        """Stop this object's background threads (watches, log followers); the attempts
        themselves are left as they are. A process must not exit with them still reading."""
