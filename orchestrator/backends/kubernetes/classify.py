"""Pure functions: Kubernetes Pod / Node / Job objects (JSON dicts) -> backend Events.

Without read access to Nodes (the built-in ``edit``/``admin`` roles grant none), a lost node
is judged from its pods alone (``pod_loss_evidence``): the taint manager's or pod GC's
DisruptionTarget, the node lifecycle controller's MarkPodsNotReady (Ready=False while the
kubelet last said ContainersReady=True), or a deletion its kubelet never confirms.

Each event comes with a *fact key*: the backend emits an event only the first time its fact is
seen, so a re-list after a dropped watch or a 410 Gone re-derives the same facts without
duplicating events, and derives any fact it missed without losing one. One pod loss is one fact
(key ``("lost", uid)``) however it is seen: Node Ready False/Unknown, a DisruptionTarget set by
the taint manager, or the pod vanishing.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

from ... import labels as L
from ..base import (
    EVICTED, FAILED, LOST, NODE_EXITED, NODE_LOST, NODE_STARTED, NODE_WAITING,
    OOM_KILLED, PENDING, RUNNING, SUCCEEDED, UNKNOWN, Event, NodeStatus)
from ..logcursor import LogCursor
from .podend import (DISRUPTION_KIND, kubelet_end, pod_uid, pull_facts,
                     true_condition as _condition)

Obj = dict[str, Any]
FactKey = tuple[str, str]

INDEX_KEY = "batch.kubernetes.io/job-completion-index"

# container terminated reason -> event kind (anything else: NODE_EXITED)
TERMINATED_KIND = {"OOMKilled": OOM_KILLED}
# A deletion is due at deletionTimestamp (deletion time + grace period); a live kubelet kills
# the containers then and confirms within seconds. This much later, no kubelet will.
TERMINATION_SLACK_S = 15.0


def pod_index(pod: Obj) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(INDEX_KEY) or (meta.get("labels") or {}).get(INDEX_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def node_ready(node: Obj | None) -> tuple[str, str | None]:
    """(status of the Ready condition: True/False/Unknown, its reason)."""
    if node is None:
        return "Unknown", None
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") or "Unknown", c.get("reason")
    return "Unknown", None


def node_healthy(node: Obj | None) -> bool:
    return node_ready(node)[0] == "True"


def _terminated(pod: Obj) -> list[Obj]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            out.append({"container": cs.get("name"), **term})
    return out


def exit_info(pod: Obj, *, final: bool = False) -> tuple[int | None, str | None]:
    """The pod's exit code and reason once the pod ended (first failure wins).

    Judged only once the phase is terminal: pkg/kubelet/status/status_manager.go mergePodStatus
    holds the phase, its reason and message, and the DisruptionTarget condition back while
    containers could still run, and sends them together once all have stopped; the containers'
    terminated states may arrive a status update earlier. An eviction's exit 137 read before its
    reason (Evicted, "Usage of EmptyDir volume ...") would pass for a SIGKILL from outside.
    ``final``: the pod object is gone and this is its last state (an old kubelet deleted it
    without a terminal phase): the containers' states are all there will be."""
    terms = _terminated(pod)
    containers = (pod.get("spec") or {}).get("containers") or []
    terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    if not terms or not terminal and not (final and len(terms) >= len(containers)):
        return None, None
    bad = [t for t in terms if t.get("exitCode") or t.get("reason") == "OOMKilled"]
    t = bad[0] if bad else terms[0]
    return int(t.get("exitCode") or 0), t.get("reason")


def _rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_loss_evidence(pod: Obj, now: float, *,
                      slack_s: float = TERMINATION_SLACK_S) -> tuple[str, str] | None:
    """(reason, message) when the pod itself shows that its node is lost, else None. What a
    watcher without access to Nodes goes by; it arrives no earlier than the Node's own
    condition (the node lifecycle controller marks pods on its next pass, every 5 s)."""
    if exit_info(pod)[0] is not None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    host = (pod.get("spec") or {}).get("nodeName")
    if not host:
        return None
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None and DISRUPTION_KIND.get(disruption.get("reason") or "") == NODE_LOST:
        return disruption.get("reason") or "DisruptionTarget", disruption.get("message") or ""
    conds = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    ready, containers = conds.get("Ready") or {}, conds.get("ContainersReady") or {}
    # pkg/controller/util/node/controller_utils.go MarkPodsNotReady flips only Ready to False,
    # keeping no reason; the kubelet (pkg/kubelet/status/generate.go) never sets Ready=False
    # without a reason, and flips ContainersReady with it.
    if ready.get("status") == "False" and not ready.get("reason") and containers.get("status") == "True":
        return "NodeNotReady", f"pod marked not ready by the node lifecycle controller: node {host} is not ready"
    due = _rfc3339((pod.get("metadata") or {}).get("deletionTimestamp"))
    if due is not None and now > due + slack_s:
        return "TerminationUnconfirmed", (f"pod still terminating {now - due:.0f} s past its grace period: "
                                          f"no kubelet on {host} confirms it")
    return None


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def not_ready_tolerated(pod: Obj, node: Obj, now: float | None) -> bool:
    """Is the node's Ready=False (its live kubelet's own report: PLEG, a container runtime
    restart) still within the pod's not-ready toleration (render.py: restart.node_loss_timeout)?
    The taint manager (pkg/controller/tainteviction/taint_eviction.go) evicts the pod only once
    the NoExecute not-ready taint outlasts tolerationSeconds; a blip shorter than that is no
    loss, and the node is not excluded for it. Ready=Unknown (a silent kubelet) is not judged here."""
    if now is None:
        return False
    seconds: float | None = None
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") in (None, "", "NoExecute") and (t.get("key") == NOT_READY_TAINT
                                                          or t.get("operator") == "Exists" and not t.get("key")):
            if t.get("tolerationSeconds") is None:
                return True                 # tolerated for ever: the taint manager never evicts it
            seconds = max(seconds or 0.0, float(t["tolerationSeconds"]))
    if seconds is None:
        return False
    cond: Obj = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    since = _rfc3339(cond.get("lastTransitionTime"))
    return since is not None and now - since < seconds


# The conditions the kubelet itself reports; any other condition a node carries with status True
# is a problem a node-problem-detector found (its kernel monitor's KernelDeadlock and
# ReadonlyFilesystem, config/kernel-monitor.json and readonly-monitor.json; a custom plugin's GPU
# or Xid condition): NPD sets a condition True while the problem lasts.
KUBELET_CONDITIONS = {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"}


def node_problem(node: Obj | None) -> str | None:
    """A problem condition on the node (node-problem-detector's), as evidence; else None."""
    for c in ((node or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") not in KUBELET_CONDITIONS and c.get("status") == "True":
            what = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return f"node condition {c.get('type')}=True" + (f" ({what})" if what else "")
    return None


def _end_facts(pod: Obj, kw: dict[str, Any], node: Obj | None = None) -> list[tuple[FactKey, Event]]:
    """How the pod ended, once it did: the kubelet's or a controller's own words first
    (kubelet_end), then its container's exit. A failed exit on a node with a problem condition
    is the node's fault (NodeProblem)."""
    said = kubelet_end(pod, kw)
    if said:
        return said
    uid = pod_uid(pod)
    code, reason = exit_info(pod)
    problem = node_problem(node) if code and reason != "OOMKilled" else None
    if problem is not None:
        return [(("exited", uid), Event(NODE_EXITED, exit_code=code, reason="NodeProblem",
                                        message=f"container exited with code {code}; device fault, decided by "
                                                f"node {kw.get('host')}'s {problem}", **kw))]
    if code is not None:
        kind = TERMINATED_KIND.get(reason or "", NODE_EXITED)
        return [(("exited", uid), Event(kind, exit_code=code, reason=reason,
                                        message=f"container exited with code {code}"
                                        + (f" ({reason})" if reason else ""), **kw))]
    return []


# Resources every node has; anything else a pod requests (nvidia.com/gpu, amd.com/gpu,
# huawei.com/Ascend910, ...) is a device plugin's.
_BUILTIN_RESOURCES = ("cpu", "memory", "pods", "ephemeral-storage")


def device_counts(pod: Obj, node: Obj | None) -> dict[str, int]:
    """The node's allocatable count of each device resource the pod requests. The device manager
    (pkg/kubelet/cm/devicemanager) sets allocatable to the healthy devices, capacity to all."""
    wanted = {k for c in (pod.get("spec") or {}).get("containers") or []
              for part in ("limits", "requests") for k in ((c.get("resources") or {}).get(part) or {})
              if k not in _BUILTIN_RESOURCES and not k.startswith("hugepages-")}
    alloc = ((node or {}).get("status") or {}).get("allocatable") or {}
    out = {}
    for k in sorted(wanted):
        try:
            out[k] = int(str(alloc.get(k, "0")))
        except ValueError:
            continue
    return out


def device_loss(pod: Obj, first: dict[str, int], now: dict[str, int]) -> str | None:
    """A device of the pod's node turned unhealthy: its allocatable count fell below what it was
    when the pod was first seen there, and the pod held all of them or holds more than remain
    (then one of the failed devices is the pod's). The evidence, or None."""
    if (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
        return None
    held: dict[str, int] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("limits") or {}).items():
            try:
                held[k] = held.get(k, 0) + int(str(v))
            except ValueError:
                continue
    for res, before in first.items():
        after = now.get(res, before)
        if after < before and (held.get(res, 0) >= before or after < held.get(res, 0)):
            return (f"device fault, decided by node {(pod.get('spec') or {}).get('nodeName')}'s allocatable "
                    f"{res}: {before} -> {after} (its device plugin reports a device unhealthy)")
    return None


def pod_events(pod: Obj, node: Obj | None, *, nodes_known: bool = True, node_access: bool = True,
               now: float | None = None, suspended: str | None = None) -> list[tuple[FactKey, Event]]:
    """Every fact the pod's current state (and its node's) implies, as (key, event).

    ``node_access`` False: Nodes cannot be read (403), so the pod's own evidence decides.
    ``suspended``: why the Job was suspended under the running attempt by someone else (Kueue
    evicting its Workload, job_suspended_by): its pods' deletions and SIGTERM exits are that."""
    uid, idx = pod_uid(pod), pod_index(pod)
    host = (pod.get("spec") or {}).get("nodeName")
    status = pod.get("status") or {}
    phase = status.get("phase")
    kw: dict[str, Any] = {"node": idx, "host": host}
    if now is not None:
        kw["time"] = now
    out: list[tuple[FactKey, Event]] = []

    if phase in ("Running", "Succeeded", "Failed") or any(
            "running" in ((cs.get("state") or {})) for cs in status.get("containerStatuses") or []):
        out.append((("started", uid), Event(NODE_STARTED, **kw)))
    out += pull_facts(pod, kw)
    unplaced = unschedulable(pod)
    if unplaced is not None:
        out.append((("waiting", f"{uid}|{unplaced}"), Event(NODE_WAITING, reason="Unschedulable", message=unplaced,
                                                            **kw)))
    code = exit_info(pod)[0]
    ended = _end_facts(pod, kw, node)
    if suspended is not None and (ended or (pod.get("metadata") or {}).get("deletionTimestamp")):
        # the Job controller deletes a suspended Job's pods (no DisruptionTarget); torchrun exits 1
        # on their SIGTERM: the suspension, not the job, ended them
        ended = [(k, e) for k, e in ended if e.kind == NODE_EXITED and not e.exit_code]
        meta = pod.get("metadata") or {}
        due = _rfc3339(meta.get("deletionTimestamp"))
        # the deletion came first (deletionTimestamp is it plus the grace period): seen late, it is
        # still ordered before the SIGTERM exits it caused (failures.root_cause)
        since = due - float(meta.get("deletionGracePeriodSeconds") or 0) if due is not None else None
        out.append((("evicted", uid), Event(EVICTED, reason="JobSuspended", message=suspended, since=since, **kw)))
    out += ended
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None and code is None and not ended:
        kind = DISRUPTION_KIND.get(disruption.get("reason") or "", EVICTED)
        key = ("lost", uid) if kind == NODE_LOST else ("evicted", uid)
        out.append((key, Event(kind, reason=disruption.get("reason"),
                               message=disruption.get("message") or "", **kw)))
    if host and code is None and phase not in ("Succeeded", "Failed"):
        ready, why = node_ready(node)
        if node is None and nodes_known:
            out.append((("lost", uid), Event(NODE_LOST, reason="NodeDeleted",
                                             message=f"node {host} no longer exists", **kw)))
        elif node is not None and ready != "True" and not (ready == "False" and not_ready_tolerated(pod, node, now)):
            out.append((("lost", uid), Event(
                NODE_LOST, reason=why or ("NodeStatusUnknown" if ready == "Unknown" else "NodeNotReady"),
                message=f"node {host} Ready={ready}", **kw)))
        elif not node_access and now is not None:
            evidence = pod_loss_evidence(pod, now)
            if evidence is not None:
                out.append((("lost", uid), Event(NODE_LOST, reason=evidence[0], message=evidence[1], **kw)))
    first: dict[FactKey, Event] = {}
    for key, ev in out:
        first.setdefault(key, ev)      # one event per fact: the most specific comes first
    return list(first.items())


def job_suspended_by(job: Obj | None, queue: str | None) -> str | None:
    """Why the attempt's Job is suspended while it runs, when wmctl did not do it: Kueue evicted
    its Workload (kubernetes-sigs/kueue pkg/controller/jobframework/reconciler.go: a Workload
    with Evicted=True, reason Preempted, InactiveWorkload, PodsReadyTimeout..., has its Job
    stopped: spec.suspend true; the Job controller (job_controller.go manageJob) then deletes
    the active pods with their grace period, setting no condition on them). None otherwise."""
    if not job or not (job.get("spec") or {}).get("suspend") or job_finished(job):
        return None
    if L.CANCEL_REQUESTED in ((job.get("metadata") or {}).get("annotations") or {}):
        return None          # wmctl's own graceful cancel
    if queue:
        return (f"Kueue suspended the Job under the running attempt (it evicted the Workload from LocalQueue "
                f"{queue!r}: preempted by a higher-priority workload, or its ClusterQueue stopped); the next "
                "attempt waits in the queue for readmission")
    return "the Job was suspended under the running attempt (spec.suspend: true, set outside wmctl)"


def unschedulable(pod: Obj) -> str | None:
    """The scheduler's message while it cannot place the pod: pkg/scheduler/schedule_one.go
    handleSchedulingFailure sets PodScheduled=False, reason Unschedulable, with the FitError's
    text ("0/N nodes are available: ..."); None once placed or for another reason."""
    if (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get("phase") != "Pending":
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or "no node fits the pod"
    return None


# pkg/controller/controller_utils.go: a pod the Job controller could not create (a ResourceQuota,
# a PodSecurity level refusing hostPath volumes, a missing PriorityClass or ServiceAccount) is a
# Warning "FailedCreate" Event on the Job, "Error creating: <the API server's refusal>";
# client-go's EventCorrelator may prefix "(combined from similar events): ".
_COMBINED = "(combined from similar events): "
_POD_NAME = re.compile(r'pods "[^"]*"')


def failed_create(events: list[Obj]) -> str | None:
    """The newest refusal of the Job's pods, from its Events (None when there is none), with
    the generated pod name taken out so a repeat reads the same."""
    found = [e for e in events if e.get("reason") == "FailedCreate" and e.get("type") == "Warning"]
    if not found:
        return None
    last = max(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    text = (last.get("message") or "").removeprefix(_COMBINED).removeprefix("Error creating: ")
    return _POD_NAME.sub("the pod", text, count=1)


# Why Kueue holds a Job (created suspended, labelled with a LocalQueue), from the Workload it
# creates for it (pkg/controller/jobframework/reconciler.go; found by the kueue.x-k8s.io/job-uid
# label, pkg/controller/constants). The scheduler's "no" (pkg/scheduler/scheduler.go
# requeueAndUpdate) is QuotaReserved=False, reason Pending, with the flavor assigner's message
# ("couldn't assign flavors to pod set main: insufficient unused quota for ...", also a Warning
# Event "Pending"): the queue is full, and it clears by itself as other workloads finish. The
# workload controller's (pkg/controller/core/workload_controller.go Reconcile) is reason
# Inadmissible: "LocalQueue q doesn't exist", "ClusterQueue c is inactive": nothing admits the
# Job until a person acts. Kueue before 0.5 said the same on its Admitted condition.
KUEUE_NEEDS_A_PERSON = {"Inadmissible"}


def kueue_wait(workloads: list[Obj]) -> tuple[bool, str, str] | None:
    """(needs a person, reason, message) while the Job's newest Workload is not admitted; None
    once it is, or while Kueue has not created one yet."""
    if not workloads:
        return None
    wl = max(workloads, key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "")
    conds = {c.get("type"): c for c in (wl.get("status") or {}).get("conditions") or []}
    cond = conds.get("QuotaReserved") or conds.get("Admitted")
    if (conds.get("Admitted") or {}).get("status") == "True" or cond is None or cond.get("status") != "False":
        return None
    reason = cond.get("reason") or ""
    return reason in KUEUE_NEEDS_A_PERSON, reason, cond.get("message") or ""


def pod_deleted_event(pod: Obj, *, cancelled: bool, job_finished: str | None, failure_seen: bool,
                      now: float | None = None) -> tuple[FactKey, Event] | None:
    """The pod object is gone: a loss unless we cancelled, it had exited, or the Job's end
    explains it. A Complete Job's pods go with its TTL; a Failed Job's controller deletes the
    pods still running, a consequence only when some failure was already seen. The Job watch
    and the pod watch are separate streams, so a Failed Job can arrive before the deletion
    that failed it (a pod deleted by hand or drained): that deletion is the root cause."""
    if cancelled or exit_info(pod, final=True)[0] is not None or kubelet_end(pod, {}):
        return None
    if job_finished == "Complete" or (job_finished == "Failed" and failure_seen):
        return None
    kw: dict[str, Any] = {"node": pod_index(pod), "host": (pod.get("spec") or {}).get("nodeName")}
    if now is not None:
        kw["time"] = now
    return (("lost", pod_uid(pod)), Event(NODE_LOST, reason="PodDeleted",
                                          message="pod was deleted", **kw))


# Since 1.31 (pkg/controller/job/job_controller.go delayTerminalCondition) the controller first
# sets the interim FailureTarget / SuccessCriteriaMet and deletes the remaining pods; Failed /
# Complete follow once no pod is terminating (a pod stuck on a dead node holds them off). The
# interim condition already decides the Job's end.
JOB_END_CONDITIONS = {"Complete": "Complete", "SuccessCriteriaMet": "Complete",
                      "Failed": "Failed", "FailureTarget": "Failed"}


def job_finished(job: Obj | None) -> str | None:
    """'Complete' / 'Failed' once the Job has that condition or its interim one, else None."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") in JOB_END_CONDITIONS and c.get("status") == "True":
            return JOB_END_CONDITIONS[c["type"]]
    return None


# pkg/controller/job/job_controller.go recordJobFinished: "Completed" (Normal) on success, else a
# Warning with the Failed condition's reason.
JOB_FAILED_REASONS = {"BackoffLimitExceeded", "DeadlineExceeded", "PodFailurePolicy", "FailedIndexes",
                      "MaxFailedIndexesExceeded"}


def job_end_event(events: list[Obj]) -> tuple[str, str, str] | None:
    """('Complete' | 'Failed', reason, message) from the Job controller's Events on a Job, the
    newest first; None when none says how it ended."""
    ends = [e for e in events if e.get("reason") == "Completed" and e.get("type") == "Normal"
            or e.get("reason") in JOB_FAILED_REASONS and e.get("type") == "Warning"]
    if not ends:
        return None
    last = max(ends, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return ("Complete" if last["reason"] == "Completed" else "Failed"), last["reason"], last.get("message") or ""


def _created(pod: Obj) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return meta.get("creationTimestamp") or "", meta.get("name") or ""


def newest_per_index(pods: list[Obj]) -> dict[int, Obj]:
    """The newest pod of each completion index (a replaced pod keeps its index)."""
    newest: dict[int, Obj] = {}
    for p in pods:
        idx = pod_index(p)
        if idx is None:
            continue
        if idx not in newest or _created(p) > _created(newest[idx]):
            newest[idx] = p
    return newest


def node_statuses(pods: list[Obj], completions: int, lost: set[str],
                  gone: dict[int, Obj] | None = None) -> list[NodeStatus]:
    """One NodeStatus per completion index, from the newest pod of each index.

    ``lost``: uids of pods with a loss fact. ``gone``: last state of deleted pods per index."""
    newest = newest_per_index(pods)
    out = []
    for idx in range(completions):
        p = newest.get(idx) or (gone or {}).get(idx)
        if p is None:
            out.append(NodeStatus(idx, PENDING))
            continue
        host = (p.get("spec") or {}).get("nodeName")
        code, reason = exit_info(p)
        phase = (p.get("status") or {}).get("phase")
        if pod_uid(p) in lost and code is None:
            out.append(NodeStatus(idx, LOST, host, None, reason))
        elif phase == "Succeeded":
            out.append(NodeStatus(idx, SUCCEEDED, host, code if code is not None else 0, reason))
        elif phase == "Failed":
            out.append(NodeStatus(idx, FAILED, host, code, reason or (p.get("status") or {}).get("reason")))
        elif phase == "Running":
            out.append(NodeStatus(idx, RUNNING, host))
        elif phase == "Pending":
            why = unschedulable(p)
            out.append(NodeStatus(idx, PENDING, host, None, f"Unschedulable: {why}" if why else None))
        else:
            out.append(NodeStatus(idx, UNKNOWN, host))
    return out


# --- a followed log (rank 0's, the witness's), across dropped streams and kubelet log rotation --
# After a rotation the kubelet serves only the newest file (pkg/kubelet/kuberuntime/logs/logs.go
# reads the container's current log path; pkg/kubelet/logs/container_log_manager.go renames the
# old one away), so counting lines to skip what was already read skips new lines instead. The
# stream is resumed by time: ``timestamps`` prefixes each line with the runtime's RFC3339Nano
# timestamp, ``since_seconds`` asks for the lines from a little before the newest one read, and
# the lines read already are dropped (backends/logcursor.py: the runtime's stamps are not in file
# order, so "older than the newest" is not "read"). Margin: ``since_seconds`` is measured on this
# machine's clock against the node's, so a skew under SINCE_MARGIN_S costs a few repeated (and
# dropped) lines, never a lost one.
SINCE_MARGIN_S = 10


def since_seconds(cursor: LogCursor, now: float) -> int | None:
    """The ``since_seconds`` of a resumed read (None: read from the start)."""
    start = cursor.resume_from_ns()
    if start is None:
        return None
    return max(1, math.ceil(now - start / 1e9) + SINCE_MARGIN_S)
