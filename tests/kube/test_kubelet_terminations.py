"""Terminations the kubelet (or a controller) starts are judged by what the pod's status says,
not by the exit code a kill leaves (issue 23 item 1), and a topology manager's refusal is not a
lost node (item 8): classify.kubelet_end, failures.classify_event."""

from __future__ import annotations

import pytest

from orchestrator import failures as F
from orchestrator.backends import base
from orchestrator.backends.kubernetes.classify import pod_deleted_event, pod_events

EMPTYDIR = 'Usage of EmptyDir volume "scratch" exceeds the limit "1Gi". '
PRESSURE = "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "
SHUTDOWN = "Pod was terminated in response to imminent node shutdown."


def pod(phase, *, code=None, reason=None, message=None, conds=None, deleting=False):
    status = {"phase": phase, "conditions": conds or []}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if code is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {
            "terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}}}]
    meta = {"uid": "u1", "name": "p-u1", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    return {"metadata": meta, "spec": {"nodeName": "n1", "containers": [{"name": "trainer"}]}, "status": status}


NODE = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def kubelet_dt(message):
    return [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": message}]


CASES = [
    # (pod, expected (event kind, reason), failure kind, decision)
    (pod("Failed", code=137, reason="Evicted", message=EMPTYDIR),
     (base.EVICTED, "StorageLimit"), F.STORAGE_FULL, F.STOP),
    (pod("Failed", code=137, reason="Evicted", message=PRESSURE, conds=kubelet_dt(PRESSURE)),
     (base.EVICTED, "NodePressure"), F.PREEMPTED, F.RETRY),
    (pod("Failed", code=1, reason="Terminated", message=SHUTDOWN, conds=kubelet_dt(SHUTDOWN)),
     (base.EVICTED, "NodeShutdown"), F.PREEMPTED, F.RETRY),
    (pod("Failed", code=143, conds=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                                     "message": "Preempted by pod 9f2 on node n1"}]),
     (base.EVICTED, "PreemptionByScheduler"), F.PREEMPTED, F.RETRY),
    (pod("Failed", code=1, conds=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                   "message": "Eviction API: evicting"}]),
     (base.EVICTED, "EvictionByEvictionAPI"), F.PREEMPTED, F.RETRY),
    (pod("Failed", code=137, conds=[{"type": "DisruptionTarget", "status": "True",
                                     "reason": "DeletionByDeviceTaintManager", "message": "Device taint"}]),
     (base.NODE_LOST, "DeletionByDeviceTaintManager"), F.DEVICE_FAULT, F.RETRY_ELSEWHERE),
    (pod("Failed", reason="TopologyAffinityError",
         message="Pod was rejected: Resources cannot be allocated with Topology locality"),
     (base.NODE_LOST, "TopologyAffinityError"), F.UNSCHEDULABLE, F.STOP),
    # a plain exit is still judged by its code
    (pod("Failed", code=1), (base.NODE_EXITED, "Error"), F.APP_ERROR, F.STOP),
]


@pytest.mark.parametrize("p,expected,kind,decision", CASES)
def test_the_status_decides_before_the_exit_code(p, expected, kind, decision):
    facts = [e for _, e in pod_events(p, NODE) if e.kind != base.NODE_STARTED]
    assert [(e.kind, e.reason) for e in facts] == [expected]
    failure = F.root_cause(facts)
    assert failure is not None and failure.kind == kind
    assert F.decide(failure) == decision


def test_the_kubelets_words_reach_the_failure():
    (ev,) = [e for _, e in pod_events(pod("Failed", code=137, reason="Evicted", message=EMPTYDIR), NODE)
             if e.kind != base.NODE_STARTED]
    failure = F.classify_event(ev)
    assert failure is not None
    evidence = failure.evidence
    assert 'EmptyDir volume "scratch" exceeds the limit "1Gi"' in evidence and "n1" in evidence
    (topo,) = [e for _, e in pod_events(pod("Failed", reason="TopologyAffinityError"), NODE)
               if e.kind != base.NODE_STARTED]
    assert "NUMA" in topo.message and "Not a lost node" in topo.message


def test_an_exit_before_the_terminal_phase_is_not_judged_yet():
    """status_manager.go mergePodStatus: containers may read terminated while the phase (and the
    eviction's reason) are held back; the exit 137 alone must not be read as a SIGKILL."""
    early = pod("Running", code=137)
    assert [e.kind for _, e in pod_events(early, NODE)] == [base.NODE_STARTED]
    # ... but a deleted pod's last state is all there is
    assert pod_deleted_event(early, cancelled=False, job_finished=None, failure_seen=False) is None
    assert pod_deleted_event(pod("Running"), cancelled=False, job_finished=None, failure_seen=False) is not None
