"""Terminations the kubelet starts, in the order it reports them (issue 23 item 1).

pkg/kubelet/eviction/eviction_manager.go evictPod -> killPodFunc: the pod's containers are
stopped with the eviction's grace period (``immediateEvictionGracePeriodSeconds`` = 1 for a hard
threshold and for every local-storage limit: SIGKILL, exit 137), and the status function sets
phase Failed, reason "Evicted" and the eviction manager's message (helpers.go
emptyDirMessageFmt, containerEphemeralStorageMessageFmt, podEphemeralStorageMessageFmt,
nodeLowMessageFmt). Node-pressure evictions (synchronize) add DisruptionTarget
TerminationByKubelet with the same message; local-storage evictions (localStorageEviction) add
none. pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go processShutdownEvent kills each pod
with its shutdown grace period (SIGTERM first), reason "Terminated", message "Pod was terminated
in response to imminent node shutdown.", and DisruptionTarget TerminationByKubelet.

The order: pkg/kubelet/status/status_manager.go mergePodStatus keeps the old phase, reason and
message, and drops DisruptionTarget, while the pod "could have running containers"; the
containers' terminated states (from the runtime) can go out first. So a watcher sees two
updates: the containers terminated under phase Running, then phase Failed with the reason, the
message and the condition together. Both are written here as separate updates (two watch
events), under the cluster's lock so no controller tick comes between them.

The node side: pkg/controller/nodelifecycle/node_lifecycle_controller.go taints a node under
pressure (``nodeConditionToTaintKeyStatusMap``: DiskPressure -> node.kubernetes.io/disk-pressure,
MemoryPressure -> node.kubernetes.io/memory-pressure, NoSchedule) while the condition lasts,
and a shutting-down kubelet reports Ready=False ("node is shutting down"): the scheduler keeps
new pods off it, without anyone excluding it.
"""

from __future__ import annotations

from .cluster import Cluster, _set_condition
from .store import Obj, now_rfc3339

PRESSURE_TAINTS = {"DiskPressure": "node.kubernetes.io/disk-pressure",
                   "MemoryPressure": "node.kubernetes.io/memory-pressure",
                   "PIDPressure": "node.kubernetes.io/pid-pressure"}
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def emptydir_message(volume: str, limit: str) -> str:
    return f'Usage of EmptyDir volume "{volume}" exceeds the limit "{limit}". '


def node_low_message(resource: str) -> str:
    return f"The node was low on resource: {resource}. "


def _terminate(cluster: Cluster, pod: Obj, code: int, reason: str, message: str, condition: bool) -> None:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    now = now_rfc3339()
    term = {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                           "startedAt": (pod.get("status") or {}).get("startTime") or now, "finishedAt": now}}
    # 1: the runtime's view, the phase held back (mergePodStatus: could have running containers)
    cluster.store.update("pods", ns, name, lambda o: o["status"].__setitem__(
        "containerStatuses", cluster._container_statuses(o, term, False)))
    cluster.note("kubelet_killed", f"{name} {code}")

    # 2: terminal, with the reason, the message and (if any) DisruptionTarget together
    def terminal(o: Obj) -> None:
        st = o["status"]
        st.update(phase="Failed", reason=reason, message=message)
        conds = st.get("conditions") or []
        for t in ("ContainersReady", "Ready"):
            conds = _set_condition(conds, {"type": t, "status": "False", "reason": "PodFailed"})
        if condition:
            conds = _set_condition(conds, {"type": "DisruptionTarget", "status": "True",
                                           "reason": "TerminationByKubelet", "message": message,
                                           "lastTransitionTime": now_rfc3339()})
        st["conditions"] = conds
    cluster.store.update("pods", ns, name, terminal)
    cluster.note("kubelet_terminated", f"{name} {reason}")


def _running_pods(cluster: Cluster, node: str) -> list[Obj]:
    pods, _ = cluster.store.list("pods")
    return [p for p in pods if p["spec"].get("nodeName") == node
            and (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def evict_for_storage_limit(cluster: Cluster, node: str, message: str) -> list[str]:
    """localStorageEviction: each running pod on ``node`` passed its own limit (``message``, e.g.
    emptydir_message): killed at once (exit 137), Evicted, no DisruptionTarget. The node is fine."""
    with cluster._lock:
        pods = _running_pods(cluster, node)
        for p in pods:
            _terminate(cluster, p, 137, "Evicted", message, condition=False)
        return [p["metadata"]["name"] for p in pods]


def evict_for_node_pressure(cluster: Cluster, node: str, condition: str = "DiskPressure",
                            resource: str = "ephemeral-storage") -> list[str]:
    """synchronize: the node reports ``condition`` (and is tainted for it); its running pods are
    evicted with a hard threshold's grace (exit 137), Evicted, DisruptionTarget TerminationByKubelet."""
    with cluster._lock:
        cond = {"type": condition, "status": "True", "reason": f"KubeletHas{condition}",
                "message": f"kubelet has {condition.lower()}", "lastTransitionTime": now_rfc3339()}
        taint = {"key": PRESSURE_TAINTS[condition], "effect": "NoSchedule", "timeAdded": now_rfc3339()}

        def press(n: Obj) -> None:
            n["status"]["conditions"] = _set_condition(n["status"].get("conditions") or [], cond)
            n["spec"].setdefault("taints", []).append(taint)
        cluster.store.update("nodes", None, node, press)
        pods = _running_pods(cluster, node)
        for p in pods:
            _terminate(cluster, p, 137, "Evicted", node_low_message(resource), condition=True)
        return [p["metadata"]["name"] for p in pods]


def shut_down_node(cluster: Cluster, node: str) -> list[str]:
    """processShutdownEvent: the kubelet reports Ready=False and SIGTERMs its pods; each exits
    with its script's ``sigterm_exit_code`` (torchrun: 1), Failed, reason Terminated, DisruptionTarget."""
    with cluster._lock:
        cluster._update_node_ready(node, "False", "KubeletNotReady", "node is shutting down")
        pods = _running_pods(cluster, node)
        for p in pods:
            rt = cluster.pods.get(p["metadata"]["uid"])
            code = rt.script.sigterm_exit_code if rt is not None else 143
            _terminate(cluster, p, code, "Terminated", SHUTDOWN_MESSAGE, condition=True)
        return [p["metadata"]["name"] for p in pods]
