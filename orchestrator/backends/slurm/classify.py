"""Slurm's evidence -> events: pure. Here, the records a job leaves in its attempt folder (the
node script and the batch script of render.py): how each node ended, and how srun ended. They
outlive Slurm's memory of the job (MinJobAge, 300 s by default), so a watcher that was away for
longer still learns the end. And Slurm's own words (tables, below): job states, pending reasons,
node states and sbatch's refusals, each made the event every backend reports.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from ... import failures as F
from ...runtime.protocol import PREEMPTED_EXIT_CODE
from .. import base as b

KILLED_EXIT = 128 + 9    # what bash reports for a process SIGKILLed (128 + the signal's number)


@dataclass(frozen=True)
class NodeEnd:
    """A node's exit record: what its torchrun exited with, as the node script saw it."""

    node: int
    host: str
    exit_code: int
    job_id: str
    time: float
    signalled: bool = False     # a SIGTERM/SIGINT/SIGHUP reached the node's script before its end


@dataclass(frozen=True)
class JobEnd:
    """The job's exit record: srun's exit status (the highest of its tasks')."""

    job_id: str
    exit_code: int
    time: float


def node_end(text: str) -> NodeEnd | None:
    """The record's content, or None while it is not a whole, well-formed record (the script
    writes it to a temporary name and renames it, so a partial one means another writer)."""
    data = _object(text)
    if data is None or not _ints(data, "node", "exit_code") or not isinstance(data.get("host"), str):
        return None
    when = data.get("time")
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return None
    return NodeEnd(data["node"], data["host"], data["exit_code"], str(data.get("job_id") or ""), float(when),
                   data.get("signalled") in (1, True))


def job_end(text: str) -> JobEnd | None:
    data = _object(text)
    if data is None or not _ints(data, "exit_code") or not isinstance(data.get("time"), (int, float)):
        return None
    return JobEnd(str(data.get("job_id") or ""), data["exit_code"], float(data["time"]))


def node_exited(end: NodeEnd) -> b.Event:
    """The NODE_EXITED event a node's exit record makes (exit code 137: SIGKILLed, as bash says).
    A node that failed after Slurm's signal reached it (the time limit's checkpoint signal, a
    preemption, `scancel --signal=TERM`) without its job saving (exit 83, or the `preempted`
    line torchrun's exit 1 follows) ended by the scheduler's hand: evicted, as a preemption, not
    the job's own error. It happens when the signal lands inside torch's import, before the
    runtime's handler is installed."""
    if end.signalled and end.exit_code not in (0, PREEMPTED_EXIT_CODE, KILLED_EXIT):
        return b.Event(b.EVICTED, time=end.time, node=end.node, host=end.host, exit_code=end.exit_code,
                       reason="Signalled", message=f"torchrun exited with {end.exit_code} on {end.host} after "
                       "Slurm's signal (the time limit's, slurm.signal_lead, or a preemption) reached it")
    reason = "SIGKILL" if end.exit_code == KILLED_EXIT else None
    how = " (SIGKILL)" if reason else ""
    return b.Event(b.NODE_EXITED, time=end.time, node=end.node, host=end.host, exit_code=end.exit_code,
                   reason=reason, message=f"torchrun exited with {end.exit_code}{how} on {end.host}")


def peer_broke(exit_code: int, lines: list[str]) -> bool:
    """Did a node fail (not 0, not the preemption's 83) because a peer's connection broke? Its
    words are read as every backend reads them (failures.peer_broke)."""
    return exit_code not in (0, PREEMPTED_EXIT_CODE) and F.peer_broke(lines)


def _object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _ints(data: dict[str, Any], *keys: str) -> bool:
    return all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) for k in keys)


# ---- Slurm's own words: job states, pending reasons, node states, sbatch's refusals ------------

# Job states (man squeue, "JOB STATE CODES") that are still alive, and what each ended one means.
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                         "RESV_DEL_HOLD"})
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                            "RESV_DEL_HOLD"})

# Pending reasons (man squeue, "JOB REASON CODES"). A queue's ordinary wait: it clears by itself,
# as long as it takes (no restart.pending_timeout).
QUEUE_WAIT = frozenset({"None", "Resources", "Priority", "Dependency", "BeginTime", "JobHeldUser", "Licenses",
                        "Prolog", "Reservation", "NodeDown", "PowerUpNode", "Nodes_required_for_job_are_DOWN",
                        "BurstBufferResources", "BurstBufferStageIn", "Cleaning", "FrontEndDown", "JobArrayTaskLimit"})
# Reasons that need a person (an admin's hold, a partition down, a node asked for unavailable, a
# group limit reached): waited for restart.pending_timeout, then the run stops with the reason.
NEEDS_PERSON_PREFIXES = ("ReqNodeNotAvail", "PartitionDown", "PartitionInactive", "JobHeldAdmin", "QOSGrp",
                         "AssocGrp", "QOSMaxJobsPerUser", "QOSMaxSubmitJobPerUser", "AssocMaxJobs",
                         "QOSResourceLimit", "AssocResourceLimit", "QOSJobLimit", "QOSUsageThreshold",
                         "InactiveLimit", "SystemFailure")
# Reasons that can never clear for this request as it stands: the run stops at once, with the fix
# (the field to change). A per-job limit of the partition, QOS or association stays what it is.
NEVER_CLEARS: dict[str, str] = {
    "PartitionNodeLimit": "nodes: ask for no more nodes than the partition holds{room}, or choose another partition "
                          "(slurm.partition)",
    "PartitionTimeLimit": "slurm.time_limit: the partition's MaxTime is shorter; shorten the time limit or choose "
                          "another partition (slurm.partition)",
    "PartitionConfig": "slurm.partition: the request does not fit the partition's configuration (its nodes' CPUs, "
                       "memory or GRES); check resources and slurm.gres against `scontrol show partition`",
    "BadConstraints": "slurm.constraint / resources: no node has the features, CPUs, memory or GRES asked for; "
                      "check them against `sinfo -o '%N %f %c %m %G'`",
    "InvalidQOS": "slurm.qos: the QOS does not exist or this account may not use it (`sacctmgr show assoc`)",
    "InvalidAccount": "slurm.account: the account does not exist or this user may not use it (`sacctmgr show assoc`)",
    "AccountNotAllowed": "slurm.account: the partition does not take this account; choose another partition or account",
    "QOSNotAllowed": "slurm.qos: the partition does not take this QOS",
    "DependencyNeverSatisfied": "slurm.extra_options: the --dependency can never be satisfied",
}
# Reasons a request too big for its partition is given (22.05 here: PartitionConfig first, with
# --exclusive; PartitionNodeLimit otherwise): the node count is named when it is the cause.
SIZE_REASONS = frozenset({"PartitionNodeLimit", "PartitionConfig"})
# Per-job maximums (of a QOS or association): the same request never fits them.
_PER_JOB_LIMIT = ("QOSMax", "AssocMax", "MaxCpuPerAccount", "MaxGRESPerAccount")
_PER_JOB_SUFFIXES = ("PerJobLimit", "PerJob", "MiniJobLimit", "PerNodeLimit")


def reason_word(reason: str) -> str:
    """The code of a pending reason, without what follows it (``ReqNodeNotAvail,_UnavailableNodes:n2``,
    ``ReqNodeNotAvail, UnavailableNodes:n2``)."""
    return reason.strip().split(",", 1)[0].split(" ", 1)[0]


def pending_event(reason: str, *, nodes: int, partition_nodes: int | None = None) -> b.Event | None:
    """The event a pending job's reason makes: NODE_QUEUED (a queue's wait, no timeout),
    NODE_WAITING (needs a person: restart.pending_timeout), or NODE_UNPLACEABLE (never clears:
    the run stops at once, the fix in its message)."""
    word = reason_word(reason)
    if word in SIZE_REASONS and partition_nodes and nodes > partition_nodes:
        return b.Event(b.NODE_UNPLACEABLE, reason=word,
                       message=f"Slurm will never start it as asked (pending reason {reason}): nodes: {nodes} nodes "
                               f"asked, the partition holds {partition_nodes}; ask for no more nodes than the "
                               f"partition holds ({partition_nodes}), or choose another partition (slurm.partition)")
    if word in NEVER_CLEARS or (word.startswith(_PER_JOB_LIMIT) and word.endswith(_PER_JOB_SUFFIXES)):
        room = f" ({partition_nodes})" if partition_nodes else ""
        fix = NEVER_CLEARS.get(word, "a per-job limit of the QOS or association: ask for less (nodes, "
                                     "resources, slurm.time_limit) or use another slurm.qos / slurm.account")
        return b.Event(b.NODE_UNPLACEABLE, reason=word,
                       message=f"Slurm will never start it as asked (pending reason {reason}, {nodes} node(s)): "
                               f"{fix.format(room=room)}")
    if word in QUEUE_WAIT:
        return b.Event(b.NODE_QUEUED, reason=f"Slurm {word}", message=f"pending in Slurm's queue ({reason})")
    if word.startswith(NEEDS_PERSON_PREFIXES) or word:
        return b.Event(b.NODE_WAITING, reason=word, message=f"pending: Slurm says {reason}")
    return None


def lost_node_event(node: int | None, host: str | None, what: str, state: str = "", why: str = "",
                    at: float | None = None) -> b.Event:
    said = f"; Slurm has it {state}" + (f" ({why})" if why and why != "none" else "") if state else ""
    return b.Event(b.NODE_LOST, time.time() if at is None else at, node=node, host=host, reason="NodeDown",
                   message=f"{what}{said}")


def ended_events(state: str, *, job_id: str, exit_code: int | None, reason: str, hosts: list[str],
                 down: dict[str, tuple[str, str]], recorded: set[int], now: float) -> list[b.Event]:
    """What an ended job (``state``, man squeue's codes) says about the nodes that left no exit
    record of their own (``recorded``: those that did). ``down``: the allocation's nodes Slurm has
    down or not responding, name -> (state, reason)."""
    missing = [i for i in range(len(hosts) or 1) if i not in recorded]
    host_of = dict(enumerate(hosts))
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        what = "the job ended NODE_FAIL (a node failed)" if state == "NODE_FAIL" else \
            "the job ended BOOT_FAIL (a node failed to boot)"
        named = [(i, h) for i, h in host_of.items() if h in down]
        if not named:
            return [lost_node_event(None, None, f"Slurm: {what}; no node of {', '.join(hosts) or 'it'} is down now",
                                    at=now)]
        return [lost_node_event(i, h, f"Slurm: {what}: {h}", *down[h], at=now) for i, h in named]
    if state == "TIMEOUT":
        return [b.Event(b.EVICTED, now, reason="TimeLimit", message=f"Slurm: job {job_id} reached its time limit "
                        "(slurm.time_limit) without the checkpoint signal's save ending it (slurm.signal_lead)")]
    if state == "PREEMPTED":
        return [b.Event(b.EVICTED, now, reason="Preempted", message=f"Slurm: job {job_id} was preempted")]
    if state == "OUT_OF_MEMORY":
        return [b.Event(b.OOM_KILLED, now, node=i, host=host_of.get(i), reason="OutOfMemory",
                        message=f"Slurm: job {job_id} ran out of memory (resources.memory is its --mem)")
                for i in missing[:1]]
    if state in ("CANCELLED", "DEADLINE", "REVOKED"):
        who = f" {reason}" if reason.startswith("by ") else ""
        what = "its deadline passed" if state == "DEADLINE" else f"cancelled{who} outside wmctl (scancel)"
        return [b.Event(b.CANCELLED, now, reason=state, message=f"Slurm: job {job_id} {what}")]
    if state in ("FAILED", "SPECIAL_EXIT") and not recorded:
        code = exit_code if exit_code is not None else 1
        return [b.Event(b.NODE_EXITED, now, node=0, host=host_of.get(0), exit_code=code, reason="BatchScript",
                        message=f"Slurm: job {job_id} FAILED ({reason}) before its nodes recorded an end: the batch "
                                f"script exited {code} (see batch.log in the attempt folder)")]
    return []


# sbatch's refusals at submit (stderr, exit 1): the field to fix.
SBATCH_REFUSALS: list[tuple[str, str, str]] = [
    (r"invalid partition", "slurm.partition", "name a partition `sinfo -s` lists"),
    (r"Invalid generic resource|gres", "slurm.gres", "give a GRES name the nodes have (`scontrol show node` lists "
                                                     "Gres=), or none"),
    (r"Memory specification can not be satisfied", "resources.memory",
     "ask for no more memory per node than the nodes have (`sinfo -o '%N %m'`, in MB)"),
    (r"Invalid account|invalid account", "slurm.account", "name an account you may use (`sacctmgr show assoc "
                                                          "user=$USER`)"),
    (r"Invalid qos|invalid qos", "slurm.qos", "name a QOS you may use"),
    (r"Requested time limit is invalid|time limit", "slurm.time_limit", "shorten it to the partition's MaxTime"),
    (r"Requested node configuration is not available", "nodes",
     "no set of nodes fits the request (node count, resources.cpu, resources.memory, slurm.constraint, the "
     "excluded nodes)"),
    (r"Invalid feature specification", "slurm.constraint", "name features the nodes have (`sinfo -o '%N %f'`)"),
    (r"reservation", "slurm.reservation", "name a reservation `scontrol show reservation` lists"),
    (r"Node count specification invalid", "nodes", "ask for no more nodes than the partition holds"),
]


def sbatch_refusal(stderr: str) -> tuple[str, str]:
    """(field, what sbatch said and the fix) for an sbatch that refused the job."""
    said = " ".join(line.strip() for line in stderr.strip().splitlines() if line.strip())[-300:] or "no message"
    for pattern, fname, fix in SBATCH_REFUSALS:
        if re.search(pattern, stderr, re.I):
            return fname, f"sbatch refused the job: {said}; {fix}"
    return "slurm", f"sbatch refused the job: {said}"
