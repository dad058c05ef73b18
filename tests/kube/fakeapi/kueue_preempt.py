"""Kueue preempting an admitted workload (issue 23 item 1), after kubernetes-sigs/kueue:

- pkg/scheduler/preemption/preemption.go IssuePreemptions: each victim Workload gets
  Evicted=True, reason "Preempted", with a message naming the preemptor
  (workload.SetEvictedCondition).
- pkg/controller/jobframework/reconciler.go ReconcileGenericJob: an evicted Workload's Job is
  stopped (stopJob -> job.Suspend(): spec.suspend true), and the Workload's quota reservation is
  dropped (workload.UnsetQuotaReservationWithCondition: QuotaReserved=False, reason Pending, and
  Admitted=False), so it is queued again; the scheduler admits it once there is room (the fake's
  Cluster._kueue, while the queue is not in ``kueue_full``), and the reconciler unsuspends it.

The Job controller (pkg/controller/job/job_controller.go manageJob on a suspended Job) then
deletes the active pods with their grace period; no DisruptionTarget is set on them, and
torchrun's agent exits 1 on their SIGTERM (the script's ``sigterm_exit_code``).
"""

from __future__ import annotations

from .cluster import Cluster
from .store import Obj, now_rfc3339

PREEMPTED = ("Preempted to accommodate a workload (UID: 7d1e, JobUID: 9a2c) due to prioritization in the "
             "ClusterQueue")


def preempt(cluster: Cluster, namespace: str, job_name: str, message: str = PREEMPTED) -> None:
    with cluster._lock:
        job = cluster.store.get("jobs", namespace, job_name)
        uid = job["metadata"]["uid"]
        (wl,) = cluster.store.list("workloads", namespace, lambda w: (
            (w["metadata"].get("labels") or {}).get("kueue.x-k8s.io/job-uid") == uid))[0]

        def evict(o: Obj) -> None:
            now = now_rfc3339()
            current = {c["type"]: c for c in (o.get("status") or {}).get("conditions") or []}
            current["Evicted"] = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": message,
                                  "lastTransitionTime": now}
            current["QuotaReserved"] = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                        "message": message, "lastTransitionTime": now}
            current["Admitted"] = {"type": "Admitted", "status": "False", "reason": "NoReservation",
                                   "message": "The workload has no reservation", "lastTransitionTime": now}
            o.setdefault("status", {})["conditions"] = list(current.values())
            o["status"].pop("admission", None)
        cluster.store.update("workloads", namespace, wl["metadata"]["name"], evict)
        cluster.store.update("jobs", namespace, job_name, lambda j: j["spec"].update(suspend=True))
        cluster.note("kueue_preempted", job_name)
