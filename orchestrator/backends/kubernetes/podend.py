"""How a pod ended, or why its container has not started, in the words of the kubelet and the
controllers that ended it (its status's reason and message, its DisruptionTarget, its waiting
reason): read before any exit code, which after a kill only says that a signal came. Pure
functions over Pod objects (JSON dicts); classify.py turns them into the backend's facts."""

from __future__ import annotations

import re
from typing import Any

from ..base import EVICTED, IMAGE_PULL_FAILED, NODE_LOST, NODE_WAITING, Event

Obj = dict[str, Any]
FactKey = tuple[str, str]


def pod_uid(pod: Obj) -> str:
    return (pod.get("metadata") or {}).get("uid") or (pod.get("metadata") or {}).get("name", "")


def true_condition(pod: Obj, ctype: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def _waiting_reasons(pod: Obj) -> list[tuple[str, str]]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        wait = (cs.get("state") or {}).get("waiting")
        if wait and wait.get("reason"):
            out.append((wait["reason"], wait.get("message") or ""))
    return out


# waiting reasons that mean the image will not come, whatever the message
IMAGE_NEVER_REASONS = {"InvalidImageName", "ErrImageNeverPull"}
# A failed pull (pkg/kubelet/images/image_manager.go) is ErrImagePull with the runtime's error as
# its message, then ImagePullBackOff ('Back-off pulling image "x"', no cause) until the kubelet
# tries again, which it keeps doing. Only a missing image or refused credentials never fix
# themselves; a registry's 429, a 5xx or a timeout does, so those are waited out (the heartbeat
# clock has not started while a node is Pending).
PERMANENT_PULL_ERROR = re.compile(r"not found|manifest unknown|code = NotFound|unauthorized|pull access denied|"
                                  r"authentication required|denied: |401 Unauthorized|403 Forbidden|"
                                  # the node's runtime does not trust the registry's certificate
                                  # (Go's crypto/x509 UnknownAuthorityError): no retry fixes it
                                  r"x509: certificate signed by unknown authority",
                                  re.IGNORECASE)
# The node's disk cannot hold the image (containerd's "write /var/lib/containerd/...: no space left
# on device"; CRI-O's the same): the node's fault, not the image's; another node may have room.
PULL_NO_SPACE = re.compile(r"no space left on device", re.IGNORECASE)
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}


def image_pull_permanent(reason: str, message: str) -> bool:
    """Will this waiting reason and message never turn into a pulled image?"""
    if reason in IMAGE_NEVER_REASONS:
        return True
    return reason == "ErrImagePull" and bool(PERMANENT_PULL_ERROR.search(message or ""))
# DisruptionTarget reason -> event kind
DISRUPTION_KIND = {
    "DeletionByTaintManager": NODE_LOST,     # the node went unreachable / not-ready
    "DeletionByPodGC": NODE_LOST,            # the node object is gone or out of service
    # pkg/controller/devicetainteviction (DRA): a ResourceSlice's device taint with NoExecute
    # evicts the pods holding that device: the device failed, not the job (failures.DEVICE_REASONS)
    "DeletionByDeviceTaintManager": NODE_LOST,
    "EvictionByEvictionAPI": EVICTED,        # drain, descheduler, Kueue preemption
    "PreemptionByScheduler": EVICTED,        # a higher-priority pod took the place
    "TerminationByKubelet": EVICTED,         # node-pressure eviction, graceful node shutdown
}
# pkg/kubelet/kubelet.go rejectPod: a pod the kubelet's admission refuses is Failed with the
# admit handler's reason (pkg/kubelet/lifecycle/predicate.go: "UnexpectedAdmissionError" when the
# device manager cannot allocate, e.g. a GPU fell off the bus; "OutOf<resource>" when the node's
# own accounting disagrees with the scheduler's; the topology manager's "TopologyAffinityError")
# and "Pod was rejected: ...". The node is at fault, not the job: lost, retried elsewhere.
KUBELET_REJECTED = re.compile(r"^(UnexpectedAdmissionError|OutOf[A-Za-z0-9./_-]+|TopologyAffinityError)$")


# pkg/kubelet/eviction/helpers.go: what the kubelet's eviction manager says (the pod's status
# message, and a Warning "Evicted" Event). Local-storage limits (eviction_manager.go
# localStorageEviction: emptyDirLimitEviction, podEphemeralStorageLimitEviction,
# containerEphemeralStorageLimitEviction) evict with no grace period and no DisruptionTarget: the
# pod's own writes passed a limit its spec set. Node pressure (synchronize: "The node was low on
# resource: ...") evicts with DisruptionTarget TerminationByKubelet: the node ran short.
STORAGE_LIMIT_EVICTION = re.compile(r"Usage of EmptyDir volume|exceeded its local ephemeral storage limit|"
                                    r"ephemeral local storage usage exceeds the total limit")
NODE_PRESSURE_EVICTION = re.compile(r"The node was low on resource: ?([A-Za-z0-9.-]+)")
# pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go processShutdownEvent: a graceful node
# shutdown (a spot reclaim, a maintenance reboot) kills each pod with its share of
# shutdownGracePeriod, reason "Terminated", and DisruptionTarget TerminationByKubelet.
NODE_SHUTDOWN = re.compile(r"imminent node shutdown|node shutdown", re.IGNORECASE)
# pkg/kubelet/cm/topologymanager/scope.go admit -> topologyAffinityError: under the
# single-numa-node (or restricted) policy the topology manager refuses a pod whose CPUs and
# devices cannot come from one NUMA node. Every node configured alike refuses alike: the
# request's shape, not the node, is at fault (failures.PLACEMENT_REASONS).
TOPOLOGY_REFUSED = "TopologyAffinityError"
TOPOLOGY_MEANING = ("its topology manager (kubelet --topology-manager-policy single-numa-node or restricted) "
                    "cannot give the pod its CPUs and devices from one NUMA node. Not a lost node: nodes "
                    "configured alike refuse alike, so none is excluded; ask for a NUMA node's worth per pod "
                    "(fewer accelerators_per_node or resources.cpu), or have the nodes' topology manager policy "
                    "changed")


def kubelet_end(pod: Obj, kw: dict[str, Any]) -> list[tuple[FactKey, Event]]:
    """How the pod ended when the kubelet or a controller says so in its status (a terminal
    phase's reason and message, a DisruptionTarget): read before the exit code, which after a
    kill only says that a signal came (137, or torchrun's 1 after SIGTERM)."""
    uid, status = pod_uid(pod), pod.get("status") or {}
    if status.get("phase") != "Failed":
        return []
    reason, message = status.get("reason") or "", status.get("message") or ""
    host = kw.get("host")
    disruption = true_condition(pod, "DisruptionTarget")
    if reason == TOPOLOGY_REFUSED:
        return [(("refused", uid), Event(NODE_LOST, reason=TOPOLOGY_REFUSED,
                                         message=f"the kubelet on {host} refused the pod ({message or reason}): "
                                                 f"{TOPOLOGY_MEANING}", **kw))]
    if KUBELET_REJECTED.match(reason):
        return [(("lost", uid), Event(NODE_LOST, reason=reason,
                                      message=f"the kubelet on {host} refused the pod: {message or reason}", **kw))]
    if reason == "Evicted" and STORAGE_LIMIT_EVICTION.search(message):
        return [(("evicted", uid), Event(EVICTED, reason=STORAGE_LIMIT, message=(
            f"the kubelet on {host} evicted the pod: {message.strip()} The job's own writes passed a limit its "
            "spec sets; a retry writes the same, so it is not retried: raise the limit (the volume's size_limit, "
            "resources.ephemeral_storage) or write less there (checkpoints belong on a persistent volume)"), **kw))]
    pressure = NODE_PRESSURE_EVICTION.search(message) if reason == "Evicted" else None
    if pressure is not None:
        return [(("evicted", uid), Event(EVICTED, reason="NodePressure", message=(
            f"the kubelet on {host} evicted the pod: {message.strip()} The node ran short of {pressure.group(1)}: "
            "retried without excluding it (the kubelet's pressure taint keeps pods off it while it lasts)"), **kw))]
    if NODE_SHUTDOWN.search(message) or (disruption or {}).get("reason") == "TerminationByKubelet" \
            and NODE_SHUTDOWN.search((disruption or {}).get("message") or ""):
        return [(("evicted", uid), Event(EVICTED, reason="NodeShutdown", message=(
            f"node {host} is shutting down (graceful node shutdown: a spot reclaim or a reboot): "
            f"{message.strip() or (disruption or {}).get('message')} Retried; the node is not blamed"), **kw))]
    if reason == "Evicted":
        return [(("evicted", uid), Event(EVICTED, reason="Evicted", message=message, **kw))]
    if disruption is not None:
        dreason = disruption.get("reason") or "DisruptionTarget"
        kind = DISRUPTION_KIND.get(dreason, EVICTED)
        return [((("lost" if kind == NODE_LOST else "evicted"), uid),
                 Event(kind, reason=dreason, message=disruption.get("message") or message, **kw))]
    return []


# the EVICTED reason of a local-storage limit eviction (failures.STORAGE_REASONS: the job's own)
STORAGE_LIMIT = "StorageLimit"


def pull_facts(pod: Obj, kw: dict[str, Any]) -> list[tuple[FactKey, Event]]:
    """What the pod's image pull says, if it is failing: never (image_pull), not on this node
    (no disk space: lost), or not yet (waited out up to restart.image_pull_timeout, said)."""
    uid, host = pod_uid(pod), kw.get("host")
    for waiting, msg in _waiting_reasons(pod):
        if image_pull_permanent(waiting, msg):
            hint = ("; the node's container runtime does not trust the registry's certificate: add its CA to "
                    "the nodes' runtime (containerd: /etc/containerd/certs.d/<registry>/ca.crt)"
                    if "x509" in msg else "")
            return [(("image", uid), Event(IMAGE_PULL_FAILED, reason=waiting, message=msg + hint, **kw))]
        if waiting == "ErrImagePull" and PULL_NO_SPACE.search(msg):
            return [(("lost", uid), Event(NODE_LOST, reason="ImagePullNoSpace", message=(
                f"node {host} has no disk space for the image ({msg}): retried on another node"), **kw))]
        if waiting in PULL_WAITING:
            # a cause the kubelet retries by itself (a registry's 429, a timeout) or its back-off
            # (no cause: the tracker keeps the last one): waited out up to restart.image_pull_timeout
            return [(("waiting", f"{uid}|pull|{msg}"), Event(NODE_WAITING, reason=waiting, message=msg, **kw))]
    return []
