"""Teardown: an attempt's objects deleted (Foreground for the Job: its pods go first) through the
kinds table, pods on lost nodes force-deleted (no kubelet will confirm them), a graceful stop by
suspending the Job, the survivors of a dead peer cut short, and each node's log tail kept before
its pod goes.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ... import labels as L
from ...errors import BackendError, EngineUnavailable
from ..base import AttemptRef
from .apply import Applier
from .classify import node_healthy, pod_loss_evidence
from .client import call_json
from .cluster import Cluster, Obj, api_error, attempt_selector, failure
from .kinds import KINDS
from .nodewatch import PAGE_SIZE, PER_NAME_MAX, trim_node
from .podlogs import PodLogs, container_started

# How long a graceful cancel waits past the pods' grace period for the kubelets to report them
# ended (their status reaches the API server after the container exits).
GRACEFUL_MARGIN_S = 15.0
# The survivors' grace period once a peer is known dead (cut_grace): room to flush their logs,
# nothing more, as no checkpoint can commit without the dead peer (every rank writes its part
# before rank 0's marker). 2 s is the kubelet's own floor for a graceful stop: a shorter grace
# is raised to it (minimumGracePeriodInSeconds, pkg/kubelet/kuberuntime/kuberuntime_manager.go).
DEAD_PEER_GRACE_S = 2
GRACEFUL_POLL_S = 0.5
GONE_POLL_S = 0.1         # teardown waits for the attempt's pods to be gone before the next one

Step = Callable[..., Any]


class Teardown:
    def __init__(self, cluster: Cluster, applier: Applier, podlogs: PodLogs, force_delete_lost: bool = True):
        self.cluster = cluster
        self.applier = applier
        self.podlogs = podlogs
        self.force_delete_lost = force_delete_lost

    def keep_logs(self, ref: AttemptRef, container: str | None) -> None:
        """Copy each node's log tail into the run folder before anything is deleted: a failed
        pod is removed the moment the Job's deletion reaches it (terminal pods need no grace),
        and its log with it. Best effort: whatever fails here must not keep the attempt from
        being torn down."""
        try:
            pods = self.cluster.attempt_pods(ref)
            lost = self.on_lost_nodes(pods)
        except (api_error(), BackendError):
            return          # teardown reports these itself when it lists the same objects
        # no kubelet serves the log of a pod on a lost node: asking would only wait
        self.podlogs.archive(ref, [p for p in pods if container_started(p) and p["metadata"]["uid"] not in lost],
                             container)

    def remove(self, ref: AttemptRef, gang: str | None, notes: list[str]) -> list[str]:
        """Delete the Job (Foreground: its pods go first), the Service and any PodGroup, and
        force-delete pods on lost nodes (their kubelet can never confirm a graceful delete); wait
        for the pods to be gone. Best effort per step: a step answered 404 is already done; 403
        or 405 (RBAC grants less, a kind not served) is noted and the remaining steps still run.
        Only a Job that could not be deleted (or a step that failed otherwise) fails the
        teardown, after every other step was tried: its pods would keep running beside the next
        attempt. Returns the notes (``notes`` and this teardown's) or raises with all of them."""
        ApiException = api_error()
        ns, name = self.cluster.ns(ref), ref.attempt_name
        fatal: list[str] = []

        def step(what: str, fn: Step, *args: Any, essential: bool = False, **kw: Any) -> Any:
            try:
                return call_json(fn, *args, what=what, **kw)
            except ApiException as exc:
                if getattr(exc, "status", None) == 404:
                    return None               # already gone: that step is done
                (fatal if essential or getattr(exc, "status", None) not in (403, 405) else notes).append(
                    failure(exc, what))
            except EngineUnavailable:
                raise                         # no API at all: no later step could run either
            except BackendError as exc:       # transient failures outlasted call()'s retries
                fatal.append(exc.message)
            return None

        step(f"delete Job {ns}/{name}", self.applier.method(KINDS["Job"], "delete"), name, ns,
             propagation_policy="Foreground", essential=True)
        step(f"delete Service {ns}/{name}", self.applier.method(KINDS["Service"], "delete"), name, ns)
        if gang:      # only a spec that asked for Volcano has one: without its CRD the call is a 403
            step(f"delete PodGroup {ns}/{gang}", self.applier.method(KINDS["PodGroup"], "delete"), gang, ns)
        # pods: graceful on healthy nodes; grace 0 where no kubelet will ever confirm
        core = self.cluster.core()
        listed = step(f"list pods of {name}", core.list_namespaced_pod, namespace=ns,
                      label_selector=attempt_selector(ref.run, ref.attempt))
        pods = (listed or {}).get("items") or []
        lost = self.on_lost_nodes(pods)
        for p in pods:
            pname = p["metadata"]["name"]
            if p["metadata"]["uid"] in lost and self.force_delete_lost:
                step(f"force-delete pod {ns}/{pname}", core.delete_namespaced_pod, pname, ns,
                     grace_period_seconds=0)
            elif not p["metadata"].get("deletionTimestamp"):
                step(f"delete pod {ns}/{pname}", core.delete_namespaced_pod, pname, ns)
        notes += self._await_pods_gone(ref, ns, [] if fatal else pods, step)   # nothing listed: nothing to wait for
        if fatal:
            raise BackendError(f"teardown of {ns}/{name} is incomplete: " + "; ".join(fatal + notes),
                               hint=f"grant the verbs of {_rbac_manifest()} (shipped with wmctl), or delete it by "
                               f"hand: kubectl -n {ns} delete job {name} --cascade=foreground")
        return notes

    def _await_pods_gone(self, ref: AttemptRef, ns: str, pods: list[Obj], step: Step) -> list[str]:
        """Wait until no pod of the attempt is left, so the next attempt's pods never start beside
        (or queue behind) this one's: a pod 0 pending behind its predecessor's terminating pod is
        a late rendezvous host, and two attempts' ranks must never share a node's devices. Pods
        found on lost nodes meanwhile are force-deleted (no kubelet will confirm them). Bounded
        by the pods' grace period plus a margin; past it, a note says what was left."""
        grace = max([float((p.get("spec") or {}).get("terminationGracePeriodSeconds") or 30) for p in pods],
                    default=0.0)
        deadline = time.monotonic() + grace + GRACEFUL_MARGIN_S
        forced: set[str] = set()
        while pods:
            try:
                pods = self.cluster.attempt_pods(ref)
            except api_error() as exc:
                return [failure(exc, f"see the pods of {ref.attempt_name} go")]
            if not pods:
                return []
            if self.force_delete_lost:
                for p in pods:
                    meta = p["metadata"]
                    if meta["uid"] not in forced and meta["uid"] in self.on_lost_nodes([p]):
                        forced.add(meta["uid"])
                        step(f"force-delete pod {ns}/{meta['name']}", self.cluster.core().delete_namespaced_pod,
                             meta["name"], ns, grace_period_seconds=0)
            if time.monotonic() >= deadline:
                names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
                return [f"pods of {ref.attempt_name} still terminating {grace + GRACEFUL_MARGIN_S:.0f} s after "
                        f"their deletion ({names}): the next attempt may start beside them"]
            time.sleep(GONE_POLL_S)
        return []

    def cut_grace(self, ref: AttemptRef, dead_hosts: list[str], container: str | None) -> None:
        """A peer is known dead: delete the attempt's pods before the Job's own teardown, those on
        ``dead_hosts`` with grace 0 (no kubelet there will confirm, and the Job's pods must not
        hold the next attempt's place), the survivors with DEAD_PEER_GRACE_S instead of
        kubernetes.termination_grace_period (90 s by default): their SIGTERM checkpoint needs the
        dead peer too. A pod already terminating takes the shorter grace (the API server
        shortens a pending deletion: staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete).
        Best effort: cancel() follows and reports what is left."""
        ns = self.cluster.ns(ref)
        core = self.cluster.core()
        try:
            pods = self.cluster.attempt_pods(ref)
        except (api_error(), BackendError):
            return
        self.keep_logs(ref, container)          # the survivors' last words, before they go
        for p in pods:
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            grace = 0 if (p.get("spec") or {}).get("nodeName") in dead_hosts else DEAD_PEER_GRACE_S
            try:
                call_json(core.delete_namespaced_pod, p["metadata"]["name"], ns, grace_period_seconds=grace,
                          what=f"delete pod {ns}/{p['metadata']['name']}")
            except (api_error(), BackendError):
                pass

    def stop_gracefully(self, ref: AttemptRef) -> list[str]:
        """``cancel --graceful``: suspend the Job. The Job controller then deletes its active pods
        with their termination grace period and creates none (KEP-2232; job_controller.go
        manageJob on a suspended Job), each kubelet sends SIGTERM, and the job writes its SIGTERM
        checkpoint and exits. A Job Kueue admitted is stopped Kueue's way instead
        (``_deactivate``): Kueue would unsuspend it. Wait for every pod to end, at most the grace
        period plus a margin; the teardown then removes what is left. What could not be done is
        returned as notes (a user who may not patch Jobs gets the plain teardown, itself a
        graceful pod delete)."""
        ns, name = self.cluster.ns(ref), ref.attempt_name
        notes: list[str] = []
        try:
            job = call_json(self.cluster.batch().read_namespaced_job, name, ns, what=f"read Job {ns}/{name}")
            kueue = self._deactivate(ref, job)
            if kueue is None or kueue:
                notes += kueue or []
                job = call_json(self.cluster.batch().patch_namespaced_job, name, ns, {"spec": {"suspend": True}},
                                what=f"suspend Job {ns}/{name}")
        except api_error() as exc:
            if getattr(exc, "status", None) == 404:
                return []
            return notes + [failure(exc, f"suspend Job {ns}/{name} for a graceful stop") + "; its pods were "
                            "deleted with their grace period instead, without waiting for them"]
        grace = float(((job.get("spec") or {}).get("template") or {}).get("spec", {})
                      .get("terminationGracePeriodSeconds") or 30)
        deadline = time.monotonic() + grace + GRACEFUL_MARGIN_S
        while time.monotonic() < deadline:
            try:
                pods = self.cluster.attempt_pods(ref)
            except api_error() as exc:
                return [failure(exc, f"watch the pods of {name} end")]
            if all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods):
                return notes
            time.sleep(GRACEFUL_POLL_S)
        return notes + [f"pods of {name} still running {grace + GRACEFUL_MARGIN_S:.0f} s after SIGTERM; deleted"]

    def _deactivate(self, ref: AttemptRef, job: Obj) -> list[str] | None:
        """Stop a Job Kueue holds the way Kueue honours: its Workload's ``spec.active: false``.
        A suspended Job whose Workload is still admitted is unsuspended by Kueue's job reconciler
        (kubernetes-sigs/kueue pkg/controller/jobframework/reconciler.go), so its pods would come
        back while the SIGTERM checkpoint is written. A deactivated Workload is evicted (reason
        Deactivated: pkg/controller/core/workload_controller.go), Kueue suspends the Job itself,
        and the pods get SIGTERM with their grace period. None when that does not apply (no queue
        label, no Kueue, no Workload yet): suspending is then the way; notes (suspend as well) when
        the Workload could not be patched (manifests/rbac-watcher.yaml grants `patch` on
        workloads); [] when done."""
        meta = job.get("metadata") or {}
        if not (meta.get("labels") or {}).get(L.KUEUE_QUEUE) or not meta.get("uid"):
            return None
        ns, custom = self.cluster.ns(ref), self.cluster.custom()
        try:
            groups = call_json(self.cluster.api("ApisApi").get_api_versions, what="list the API groups")
            found = next((g for g in groups.get("groups") or [] if g.get("name") == L.KUEUE_GROUP), None)
            version = ((found or {}).get("preferredVersion") or {}).get("version")
            if not version:
                return None
            items = call_json(custom.list_namespaced_custom_object, L.KUEUE_GROUP, version, ns, "workloads",
                              label_selector=f"{L.KUEUE_JOB_UID}={meta['uid']}",
                              what=f"list the Kueue Workloads of Job {ns}/{meta.get('name')}")["items"]
            for wl in items:
                wname = wl["metadata"]["name"]
                call_json(custom.patch_namespaced_custom_object, L.KUEUE_GROUP, version, ns, "workloads", wname,
                          {"spec": {"active": False}}, what=f"deactivate Kueue Workload {ns}/{wname}")
        except api_error() as exc:
            return [failure(exc, f"deactivate the Kueue Workload of Job {ns}/{meta.get('name')}") +
                    "; the Job was suspended instead, and Kueue may start its pods again while they save"]
        return [] if items else None

    def on_lost_nodes(self, pods: list[Obj]) -> set[str]:
        """Uids of the pods whose node is lost: from the Nodes when this user may list them, else
        from the pods' own evidence (classify.pod_loss_evidence)."""
        nodes: dict[str, Obj] | None = None
        try:
            nodes = self._read_nodes({p["spec"].get("nodeName") for p in pods} - {None, ""})
        except api_error() as exc:
            if getattr(exc, "status", None) != 403:
                raise BackendError(failure(exc, "list nodes")) from None
        now = time.time()
        out = set()
        for p in pods:
            host = p["spec"].get("nodeName")
            if not host:
                continue
            if (not node_healthy(nodes.get(host)) if nodes is not None
                    else pod_loss_evidence(p, now) is not None):
                out.add(p["metadata"]["uid"])
        return out

    def _read_nodes(self, names: set[str]) -> dict[str, Obj]:
        """The named Nodes that exist: each read by name when they are few, else one list in
        pages (limit/continue), so a teardown never pulls a whole cluster's Nodes at once."""
        ApiException = api_error()
        core = self.cluster.core()
        out: dict[str, Obj] = {}
        if len(names) <= PER_NAME_MAX:
            for name in sorted(names):
                try:
                    out[name] = call_json(core.read_node, name, what=f"read node {name}")
                except ApiException as exc:
                    if getattr(exc, "status", None) != 404:          # 404: the node is gone, which is the answer
                        raise
            return out
        token, restarts = None, 0
        while True:
            kw: dict[str, Any] = {"limit": PAGE_SIZE, **({"_continue": token} if token else {})}
            try:
                body = call_json(core.list_node, what="list nodes", **kw)
            except ApiException as exc:
                if getattr(exc, "status", None) != 410 or not token or restarts >= 3:
                    raise
                out, token, restarts = {}, None, restarts + 1    # the token expired: from the start
                continue
            out.update((n["metadata"]["name"], trim_node(n)) for n in body.get("items") or []
                       if n["metadata"]["name"] in names)
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return out


def _rbac_manifest() -> str:
    from ...resources import rbac_manifest

    return rbac_manifest()
