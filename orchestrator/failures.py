"""What went wrong with an attempt, and what to do about it: pure and table-driven.

The root cause is the first failure in time. Ranks that crash because a peer vanished are
consequences: a node lost (or frozen) shortly after another node's app-looking exit wins
over that exit, because survivors of a lost peer die with ordinary error codes.
"""

from __future__ import annotations

import re
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
STORAGE_FULL = "storage_full"      # the job's disk (checkpoint folder) is full: ENOSPC
RENDEZVOUS = "rendezvous"          # a node's agent could not reach the rendezvous (c10d store): infrastructure
UNSCHEDULABLE = "unschedulable"    # pods not created or not placed for restart.pending_timeout
DEVICE_FAULT = "device_fault"      # the node's accelerator failed (ECC, lost device): the node, not the job
NODE_FAILURES = (NODE_LOST, HANG, DEVICE_FAULT)    # a node's own failure, when the failure names the node

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
    STORAGE_FULL: STOP,  # a full disk stays full: retrying would fail the same save again
    # pod 0 late (a cold image pull, pending behind the last attempt's pods), its store not yet
    # listening, a DNS record not yet served: none of it is the job's fault, and a new attempt
    # (whose nodes start together) usually joins. The no-new-checkpoint rule stops a loop.
    RENDEZVOUS: RETRY,
    # a quota, a PodSecurity level, a missing PriorityClass or no node that fits: the same request
    # waits the same way. Only an attempt that excluded nodes is retried, with none excluded.
    UNSCHEDULABLE: STOP,
    DEVICE_FAULT: RETRY_ELSEWHERE,  # the same device fails again: away from it
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
    # A loss seen after the fact: the earliest it can have happened (Event.since). It may have
    # come before anything seen meanwhile, and is ordered by this, not by when it was seen.
    since: float | None = None

    @property
    def earliest(self) -> float:
        return self.time if self.since is None else min(self.since, self.time)

    def describe(self) -> str:
        where = f" on node {self.node}" + (f" ({self.host})" if self.host else "") if self.node is not None else ""
        return f"{self.kind}{where}: {self.evidence}"


# A node-side fact that says a device failed (a backend's NODE_LOST reason): a device fault.
# DeletionByDeviceTaintManager: Kubernetes' DRA device taint eviction (a driver tainted the device).
DEVICE_REASONS = ("DeviceUnhealthy", "NodeProblem", "DeletionByDeviceTaintManager")
# A node refusing the pod for its shape, as every node configured alike would (the kubelet's
# topology manager): not a lost node, and excluding it would only move on to its twin.
PLACEMENT_REASONS = ("TopologyAffinityError",)
# An eviction for the job's own writes passing a storage limit its spec set (an emptyDir's
# sizeLimit, an ephemeral-storage limit): the same writes pass it again.
STORAGE_REASONS = ("StorageLimit",)


def _by_reason(ev: b.Event) -> Failure | None:
    """A loss or an eviction whose reason says it is something else: a node refusing the pod's
    shape (unschedulable), the job's own storage limit (storage_full), a failed device."""
    if ev.kind == b.NODE_LOST and ev.reason in PLACEMENT_REASONS:
        return Failure(UNSCHEDULABLE, ev.node, ev.host, ev.time, ev.message or ev.reason or "refused by the node")
    if ev.kind == b.EVICTED and ev.reason in STORAGE_REASONS:
        return Failure(STORAGE_FULL, ev.node, ev.host, ev.time, ev.message or ev.reason or "storage limit")
    if ev.kind == b.NODE_LOST and ev.reason in DEVICE_REASONS:
        return Failure(DEVICE_FAULT, ev.node, ev.host, ev.time, ev.message or ev.reason or "device failed")
    return None


# Event kinds that are one failure class whatever else they say: (class, the evidence when the
# event has no message, whether its reason is evidence enough).
_SIMPLE: dict[str, tuple[str, str, bool]] = {
    b.NODE_PAUSED: (HANG, "node frozen (paused)", False),
    b.OOM_KILLED: (OOM, "killed for memory (OOMKilled)", False),
    b.IMAGE_PULL_FAILED: (IMAGE_PULL, "image pull failed", True),
    b.EVICTED: (PREEMPTED, "evicted", True),
    # the cluster says no wait can help (a request bigger than the partition): stopped at once
    b.NODE_UNPLACEABLE: (UNSCHEDULABLE, "can never be placed", True),
    b.CANCELLED: (CANCELLED, "cancelled", False),
}


def classify_event(ev: b.Event) -> Failure | None:
    """One event -> the failure it shows, or None for a healthy event."""
    k = ev.kind
    by_reason = _by_reason(ev)
    if by_reason is not None:
        return by_reason
    if k == b.NODE_LOST:
        return Failure(NODE_LOST, ev.node, ev.host, ev.time, ev.message or ev.reason or "node lost", ev.since)
    simple = _SIMPLE.get(k)
    if simple is not None:
        kind, default, with_reason = simple
        return Failure(kind, ev.node, ev.host, ev.time, ev.message or (ev.reason if with_reason else None) or default)
    if k == b.NODE_EXITED:
        code = ev.exit_code
        if code == 0:
            return None
        if code == PREEMPTED_EXIT_CODE:
            return Failure(PREEMPTED, ev.node, ev.host, ev.time, f"exit {code}: checkpointed and stopped on SIGTERM")
        if ev.reason == "OOMKilled":
            return Failure(OOM, ev.node, ev.host, ev.time, f"exit {code}, OOMKilled")
        if ev.reason in DEVICE_REASONS:      # the exit, on a node whose own facts say it is at fault
            return Failure(DEVICE_FAULT, ev.node, ev.host, ev.time, ev.message or f"exit {code} ({ev.reason})")
        if code in (SIGKILL_EXIT, -9) or ev.reason == "SIGKILL":
            return Failure(NODE_LOST, ev.node, ev.host, ev.time, f"exit {code}: killed (SIGKILL) from outside the job")
        if code in (SIGTERM_EXIT, -15):
            return Failure(PREEMPTED, ev.node, ev.host, ev.time,
                           f"exit {code}: terminated (SIGTERM) without a checkpoint")
        return Failure(APP_ERROR, ev.node, ev.host, ev.time, f"exit {code}" + (f" ({ev.reason})" if ev.reason else ""))
    return None


_PRIORITY = {NODE_LOST: 0, DEVICE_FAULT: 0, HANG: 1, OOM: 2, IMAGE_PULL: 3, UNSCHEDULABLE: 3, PREEMPTED: 4,
             RENDEZVOUS: 4, STORAGE_FULL: 5, APP_ERROR: 5, CANCELLED: 6}


def root_cause(events: list[b.Event]) -> Failure | None:
    """The first failure in time; an app-looking exit yields to a nearby infrastructure failure.
    A node found gone without an exit status counts from its last sign of life (``since``), not
    from when someone looked: however late that is, a survivor that died of the lost peer in
    between is its consequence."""
    failures = sorted((f for f in map(classify_event, events) if f is not None), key=lambda f: f.earliest)
    if not failures:
        return None
    first = failures[0]
    if first.kind in (APP_ERROR, PREEMPTED) and not first.evidence.startswith("exit 83"):
        for other in failures[1:]:
            if other.earliest - first.earliest > CONSEQUENCE_WINDOW_S:
                break
            if _PRIORITY[other.kind] < _PRIORITY[first.kind] and other.kind in (NODE_LOST, HANG, OOM):
                return other
    return first


def hang_failure(last_heartbeat: float, now: float, timeout: float,
                 nodes: list[b.NodeStatus] | tuple[b.NodeStatus, ...] = ()) -> Failure | None:
    """No progress for ``timeout``. When exactly one node is in a state no live node reports
    (paused, or unknown: Kubernetes' pod phase Unknown), that is the hung node, named so the
    next attempt is placed away from it; else the node is not known."""
    if now - last_heartbeat <= timeout:
        return None
    why = (f"no progress line for {now - last_heartbeat:.0f} s (heartbeat timeout {timeout:.0f} s)")
    hung = [n for n in nodes if n.phase in (b.PAUSED, b.UNKNOWN)]
    if len(hung) == 1:
        n = hung[0]
        return Failure(HANG, n.node, n.host, now, f"{why}: node {n.node} is {n.phase}"
                       + (f" ({n.reason})" if n.reason else "") + ", the others run")
    return Failure(HANG, None, None, now, f"{why}: a frozen node or a stuck collective")


# Waiting reasons no wait cures: the cluster refuses the job as written (a Kubernetes namespace's
# PodSecurity level: backends/kubernetes/admission.py). The attempt ends at once.
REFUSED_FOR_GOOD = frozenset({"PodSecurity"})


def pending_failure(waiting: b.Event, since: float, now: float, timeout: float) -> Failure | None:
    """Nodes not created or not placed for longer than restart.pending_timeout, with the
    cluster's own reason (the scheduler's message, the Job controller's FailedCreate); at once
    when the reason is one no wait cures (REFUSED_FOR_GOOD)."""
    why = f"{waiting.reason}: {waiting.message}" if waiting.reason else waiting.message
    if waiting.reason in REFUSED_FOR_GOOD:
        return Failure(UNSCHEDULABLE, waiting.node, None, now, f"refused, not retried: {why}")
    if now - since <= timeout:
        return None
    return Failure(UNSCHEDULABLE, waiting.node, None, now,
                   f"not placed for {now - since:.0f} s (restart.pending_timeout {timeout:.0f} s): {why}")


# A backend's NODE_WAITING reasons for a pull the node keeps retrying (Kubernetes' kubelet): not
# a wait for placement (restart.pending_timeout) but a start (restart.image_pull_timeout).
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")


def start_failure(cause: b.Event | None, starting: list[b.NodeStatus], since: float, now: float,
                  timeout: float) -> Failure | None:
    """Placed nodes that have not started their container for longer than
    restart.image_pull_timeout: the image never came (or the container was never created), with
    the newest cause a failed pull gave."""
    if now - since <= timeout or not starting:
        return None
    n = next((s for s in starting if cause is not None and s.node == cause.node), starting[0])
    why = (f"the kubelet's last pull error: {cause.message}" if cause is not None and cause.message
           else "no pull error reported: still pulling the image or creating the container")
    return Failure(IMAGE_PULL, n.node, n.host, now,
                   f"not started {now - since:.0f} s after being placed (restart.image_pull_timeout "
                   f"{timeout:.0f} s): {why}")


def decide(failure: Failure, *, retry_on_oom: bool = False, exclude_failed_nodes: bool = True,
           excluded: bool = False) -> str:
    """``excluded``: the attempt ran with nodes excluded; an unschedulable one is retried
    without them (never exclude so many nodes that the job cannot be placed)."""
    decision = DEFAULT_DECISIONS[failure.kind]
    if failure.kind == UNSCHEDULABLE and excluded:
        return RETRY
    if failure.kind == OOM and retry_on_oom:
        decision = RETRY
    if decision == RETRY_ELSEWHERE and not exclude_failed_nodes:
        decision = RETRY
    return decision


# ---- the failing rank's own words ------------------------------------------------------------

# A rank killed by SIGKILL while its peers live is most often the kernel's OOM killer: where
# nothing said so (no OOMKilled, no oom_kill in a cgroup v2 memory.events), say how to check.
OOM_CHECK = ("a SIGKILL is what the kernel's OOM killer sends: check `dmesg -T | grep -i -E 'oom|killed process'` "
             "(or `journalctl -k`) and the memory limit (the cgroup's memory.max, the container's limit)")
# What an exit code means when the job said nothing (torchrun reports workers' codes; negative
# ones are signals).
EXIT_MEANINGS = {
    127: "command not found", 126: "command found but not executable",
    137: f"killed (SIGKILL) from outside the job, with no OOM evidence; {OOM_CHECK}",
    -9: f"killed (SIGKILL) from outside the job, with no OOM evidence; {OOM_CHECK}",
    139: "segmentation fault", -11: "segmentation fault", 134: "aborted (SIGABRT)",
    -6: "aborted (SIGABRT)", 135: "bus error (SIGBUS: often /dev/shm too small)", -7: "bus error (SIGBUS: often "
    "/dev/shm too small)",
}
ERROR_LINES = 8                  # traceback lines kept in the record: the last frames and the error

_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:(?: ?)")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
# The launcher's frames, never the job's: torchrun, wmctl-bind, and the spare nodes' keeper, whose
# forked torchrun's traceback starts in it (as the package module locally and on Slurm, by its
# path where Docker mounts it and a Kubernetes pod runs it: docker/spares.py KEEPER and
# kubernetes/spares.py FILES_DIR, repeated here to keep this module below the backends; a unit
# test keeps them equal).
_LAUNCHER = ("/torch/distributed/", "/orchestrator/runtime/affinity.py", "/bin/torchrun",
             "/orchestrator/runtime/keeper.py", "/wmctl-spares/keeper.py", "/opt/wmctl/keeper.py")


@dataclass(frozen=True)
class JobError:
    """The first failing rank's own error, found in its node's output."""

    summary: str                 # one line for the watch line and the report
    lines: tuple[str, ...]       # the end of its traceback (frames and the exception), or ()
    rank: int | None = None
    exit_code: int | None = None


def job_error(lines: list[str]) -> JobError | None:
    """Read a failed node's output (torchrun's and its workers'): the root-cause rank and exit
    code from torchrun's report, that rank's traceback (not the launcher's), wmctl-bind's own
    error (command not found), or the exit code's meaning. None when it holds none of these."""
    root_rank = root_exit = None
    in_root = False
    for line in lines:
        if "Root Cause (first observed failure)" in line:
            in_root = True
        elif in_root and root_rank is None and (m := _ROOT_RANK.match(line)):
            root_rank = int(m.group(1))
        elif in_root and root_exit is None and (m := _ROOT_EXIT.match(line)):
            root_exit = int(m.group(1))
    blocks = _tracebacks(lines)
    user = [blk for blk in blocks if not _launcher_only(blk[1])]
    pick = next((blk for blk in reversed(user) if root_rank is not None and blk[0] == root_rank), None)
    pick = pick or (user[-1] if user else None)
    if pick is not None:
        rank, body = pick
        frames = [i for i, text in enumerate(body) if _FRAME.match(text)]
        tail = body[frames[-3] if len(frames) >= 3 else (frames[0] if frames else 0):]
        tail = tail[-ERROR_LINES:]
        where = ""
        user_frames = [m for m in (_FRAME.match(body[i]) for i in frames)
                       if m and not _is_launcher(m.group(1)) and not _interpreter(m.group(1))]
        if user_frames:
            where = f' (File "{user_frames[-1].group(1).rsplit("/", 1)[-1]}", line {user_frames[-1].group(2)})'
        who = f"rank {rank}: " if rank is not None else (f"rank {root_rank}: " if root_rank is not None else "")
        return JobError(f"{who}{body[-1].strip()}{where}", tuple(tail), rank if rank is not None else root_rank,
                        root_exit)
    bind = [text for text in map(_strip, lines) if text.startswith("wmctl-bind: error:")]
    if bind:
        what = bind[-1].strip().removeprefix("wmctl-bind: error: ")
        code = f" (exit {root_exit})" if root_exit is not None else ""
        who = f"rank {root_rank}: " if root_rank is not None else ""
        return JobError(f"{who}{what}{code}", (), root_rank, root_exit)
    if root_exit is not None and root_exit in EXIT_MEANINGS:
        who = f"rank {root_rank} " if root_rank is not None else ""
        return JobError(f"{who}exit {root_exit}: {EXIT_MEANINGS[root_exit]}", (), root_rank, root_exit)
    said = _last_words(lines)
    if said:
        # No traceback: a worker that said why and exited (python's "can't open file" for a
        # missing script, exit 2; a job's own sys.exit("...")). Its words, not only a code.
        who = f"rank {root_rank}: " if root_rank is not None else ""
        code = f" (exit {root_exit})" if root_exit is not None else ""
        return JobError(f"{who}{said[-1]}{code}", tuple(said), root_rank, root_exit)
    return None


# torchrun's line for a failed worker (torch/distributed/elastic/multiprocessing/api.py):
# "E1207 00:48:09.645000 16828 .../api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: ...)"
_WORKER_FAILED = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+")
_LOG_RECORD = re.compile(r"^[EWIDF]\d{4} \d\d:\d\d:\d\d")     # glog-style lines of torch's own logger
LAST_WORDS = 3


def _last_words(lines: list[str]) -> list[str]:
    """What a worker printed last before torchrun reported it failed, without torchrun's, wmctl's
    or the runtime's own lines; [] when torchrun reported no failed worker or nothing came before."""
    end = next((i for i, line in enumerate(lines) if _WORKER_FAILED.search(line)), None)
    if end is None:
        return []
    said = [text.rstrip() for text in map(_strip, lines[:end])
            if text.strip() and not _LOG_RECORD.match(text) and not text.startswith(("wmctl-bind:", "*"))
            and "WMCTL-PROGRESS " not in text]
    return said[-LAST_WORDS:]


def _strip(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _tracebacks(lines: list[str]) -> list[tuple[int | None, list[str]]]:
    """Every Python traceback in the output, with the rank its lines are prefixed with."""
    out: list[tuple[int | None, list[str]]] = []
    current: list[str] | None = None
    rank: int | None = None
    for raw in lines:
        m = _PREFIX.match(raw)
        text = _strip(raw)
        if text.startswith("Traceback (most recent call last):"):
            current, rank = [], int(m.group(1)) if m else None
            continue
        if current is None:
            continue
        if text[:1] in (" ", "\t") or not text.strip():
            current.append(text)
            continue
        current.append(text)         # the exception line ends the block
        out.append((rank, current))
        current = None
    return out


def _is_launcher(path: str) -> bool:
    return any(part in path for part in _LAUNCHER)


def _interpreter(path: str) -> bool:
    """The interpreter's own frames (`python -m` runs a module through <frozen runpy>): neither
    the launcher's nor the job's."""
    return path.startswith("<frozen ")


def _launcher_only(body: list[str]) -> bool:
    """The launcher's own traceback (torchrun's ChildFailedError, wmctl-bind), not the job's."""
    files = [m.group(1) for m in map(_FRAME.match, body) if m and not _interpreter(m.group(1))]
    return "ChildFailedError" in body[-1] or (bool(files) and all(_is_launcher(f) for f in files))


_ENOSPC = re.compile(r"No space left on device|ENOSPC|\[Errno 28\]", re.I)
# Python's OSError text names the file right after the strerror: "[Errno 28] No space left on
# device: '/ckpt/x'". A path anywhere else on the line (a traceback's File "...") is not it.
_ENOSPC_PATH = re.compile(r"""No space left on device['"]?:\s*['"]?(/[^'"\s,)]+)""", re.I)


def storage_full(error: JobError) -> str | None:
    """What a full disk looks like in the failing rank's own words, or None: the path, when said."""
    text = "\n".join((error.summary, *error.lines))
    if not _ENOSPC.search(text):
        return None
    found = _ENOSPC_PATH.search(text)
    where = f" writing {found.group(1)}" if found else ""
    return f"the disk is full (ENOSPC){where}: free space there (old checkpoints, checkpoint.keep) and resubmit"


# ---- the launcher's own failures: rendezvous, and shutdown noise after success ------------------

# What torchrun's agent raises when it cannot reach the c10d store or the rendezvous never
# completes: torch/distributed/elastic/rendezvous/api.py (RendezvousConnectionError,
# RendezvousTimeoutError, RendezvousClosedError), c10d_rendezvous_backend.py (_create_tcp_store:
# "The connection to the C10d store has failed", after read_timeout), and the store client's own
# DistNetworkError / DistStoreError (torch/csrc/distributed/c10d/socket.cpp, TCPStore.cpp).
_RDZV_ERROR = re.compile(r"^(?:torch\.distributed\.(?:elastic\.rendezvous\.api\.)?)?"
                         r"(RendezvousConnectionError|RendezvousTimeoutError|RendezvousClosedError|"
                         r"DistNetworkError|DistStoreError)\b:?\s*(.*)$")
# The frames of the agent's exit path: launcher/api.py launch_agent's ``finally`` calls
# ``rdzv_handler.shutdown()`` (dynamic_rendezvous.py shutdown -> _close) only after agent.run()
# returned or raised; agent/server/api.py _invoke_run calls _exit_barrier only once the local
# worker group SUCCEEDED. A failed worker group raises ChildFailedError before either.
_EXIT_PATH = re.compile(r"^\s*File \"[^\"]*/torch/distributed/[^\"]*\", line \d+, in "
                        r"(shutdown|_close|_exit_barrier)\s*$")

# agent/server/api.py: the frames of an agent whose workers are (re)starting or running
_WHILE_RUNNING = re.compile(r"^\s*File \"[^\"]*/torch/distributed/[^\"]*\", line \d+, in "
                            r"(_invoke_run|_initialize_workers|_restart_workers|_rendezvous|next_rendezvous|"
                            r"num_nodes_waiting)\s*$")


def rendezvous_failure(lines: list[str]) -> str | None:
    """The agent's own rendezvous failure in a node's output (a launcher traceback ending in a
    rendezvous or store-connection error, no worker's traceback), as evidence; else None."""
    blocks = _tracebacks(lines)
    if not blocks or any(not _launcher_only(body) for _, body in blocks):
        return None
    last = blocks[-1][1][-1].strip()
    found = _RDZV_ERROR.match(last)
    if found is None:
        return None
    cause = next((m.group(0) for _, body in blocks for m in [_RDZV_ERROR.match(body[-1].strip())]
                  if m and m.group(1).startswith("Dist")), None)
    text = f"{found.group(1)}: {found.group(2)}".rstrip(": ")
    if cause and cause != last:
        text += f" (cause: {cause.split('.')[-1] if cause.startswith('torch.') else cause})"
    return (f"torchrun's agent could not reach the rendezvous: {text}; a node that starts long before "
            "node 0 waits rendezvous.read_timeout for its store")


def shutdown_noise(lines: list[str]) -> str | None:
    """Did this node's agent fail only on its way out, after its workers succeeded? Its every
    traceback is the launcher's, ends in a rendezvous / store error, and passes through the
    exit path (the rendezvous shutdown or the exit barrier), and no worker failed
    (no ChildFailedError). Such an exit is not the job's failure: node 0, which hosts the store,
    ended first. Returns the agent's error, or None."""
    blocks = _tracebacks(lines)
    if not blocks or any("ChildFailedError" in text or "Root Cause (first observed failure)" in text
                         for text in lines):
        return None
    exits = 0
    for _, body in blocks:
        if not _launcher_only(body) or _RDZV_ERROR.match(body[-1].strip()) is None:
            return None
        on_exit_path = any(_EXIT_PATH.match(text) for text in body)
        # an error while the workers ran (the monitor loop, a re-rendezvous), even if the shutdown
        # in ``finally`` failed after it, killed them: not noise
        if not on_exit_path and any(_WHILE_RUNNING.match(text) for text in body):
            return None
        exits += on_exit_path
    return blocks[-1][1][-1].strip() if exits else None


# Signals a worker dies of in the interpreter's or a collective library's teardown (std::terminate
# on a still-joinable C++ thread, a communicator destroyed twice), as torchrun reports them.
TEARDOWN_SIGNALS = frozenset({-6, 134, -11, 139})


def teardown_crash(lines: list[str]) -> str | None:
    """Did this node's worker die of a signal with no traceback of its own (an abort or a
    segfault in teardown)? Only meaningful once the job has said it completed: then the work is
    done and saved, and the exit is the shutdown's, not the job's. Returns the summary, or None."""
    err = job_error(lines)
    if err is None or err.lines or err.exit_code not in TEARDOWN_SIGNALS:
        return None
    return err.summary


# ---- a node's failure while its peers live: its own error, or a peer's breakage ------------------

# A worker's own words when a peer's end broke its connection (gloo's TCP pairs, NCCL's proxy, the
# c10d store): it failed because of another node, not by itself. Slurm's engine holds such an exit
# for the peer's record (slurm/engine.py PEER_WAIT_S); a Kubernetes keeper's exit is not read as the
# job's own error (own_error).
_PEER_BROKE = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|"
                         r"remote process exited or there was a network error|"
                         r"DistNetworkError|failed to recv, got 0 bytes", re.I)
# What else a peer's death or freeze can make a survivor say, beyond a broken connection: a
# collective or the store timing out, the communication library's own errors, a store refusing.
# Never read as the job's own error (own_error); deliberately broad: a job's own error that says
# one of these is only reported later (when the keeper's hold ends), while a peer's death read as
# the job's error would stop the run.
_COMMS = re.compile(r"timed out|Timeout|[Ww]atchdog|NCCL|RCCL|DistBackendError|DistStoreError|"
                    r"ProcessGroup|gloo|TCPStore|Connection refused|ECONNRESET|ECONNREFUSED|EPIPE|"
                    r"socket|Rendezvous", re.I)


def peer_broke(lines: list[str]) -> bool:
    """Does a node's output say a peer's connection broke under it (it failed because of another node)?"""
    return any(_PEER_BROKE.search(line) for line in lines)


def own_error(exit_code: int, signalled: bool, lines: list[str]) -> JobError | None:
    """The job's own error in a node's output when its torchrun failed while its peers may live
    (a Kubernetes keeper's ``keeper_exit``, runtime/keeper.py): a traceback or last words of the
    job (job_error) and nothing a peer's death or freeze could have caused. None whenever that is
    not clear: a peer's connection broke (peer_broke) or any communication error (_COMMS), the
    agent's rendezvous failed (rendezvous_failure), a signal ended torchrun (``signalled``) or its
    root-cause worker (the OOM killer, a kill from outside), the preemption's exit, no output. A
    worker that aborted (SIGABRT, SIGSEGV) after a traceback of the job's counts: a gloo worker
    that raised aborts in its teardown ("terminate called without an active exception"), while a
    communication library that aborts for a peer (NCCL's watchdog) says so first (_COMMS). Without
    a traceback such an abort is not told from a crash (job_error names only the signal): held.

    Conservative on purpose: the caller reports a None at the keeper's own end (after its hold),
    while an answer here is an application error at once, which stops the run."""
    if exit_code in (0, PREEMPTED_EXIT_CODE) or signalled or not 0 < exit_code < 128 or not lines:
        return None
    said = [line for line in lines if "WMCTL-PROGRESS " not in line]
    if peer_broke(said) or any(_COMMS.search(line) for line in said) or rendezvous_failure(said) is not None:
        return None
    error = job_error(said)
    if error is None or not error.lines:
        return None
    if error.exit_code is not None and not 0 < error.exit_code < 128 and error.exit_code not in TEARDOWN_SIGNALS:
        return None
    return error


def device_fault(lines: list[str], patterns: list[str]) -> str | None:
    """A failing node's output naming a failed device (the vendor profile's
    device_fault_patterns, case-insensitive): the evidence, the line that said it; else None."""
    wanted = [p.lower() for p in patterns if p]
    for line in reversed(lines):
        text = _strip(line).strip()
        if any(p in text.lower() for p in wanted):
            return f"device fault, decided by the node's output: {text[:300]!r}"
    return None
