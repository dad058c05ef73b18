"""Table tests of the pure pod/node -> Event classification (orchestrator/backends/kubernetes/classify.py)."""

from __future__ import annotations

import pytest

from orchestrator.backends import base
from orchestrator.backends.kubernetes.classify import (
    node_statuses, pod_deleted_event, pod_events)


def pod(phase="Running", *, idx=0, uid="u1", node="n1", state=None, conds=None, reason=None):
    status = {"phase": phase, "conditions": conds or []}
    if reason:
        status["reason"] = reason
    if state is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": state}]
    return {"metadata": {"uid": uid, "name": f"p-{uid}", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(idx)}},
            "spec": {"nodeName": node, "containers": [{"name": "trainer"}]},
            "status": status}


def node(ready="True", reason="KubeletReady"):
    return {"metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": reason}]}}


def TERM(code, reason):
    return {"terminated": {"exitCode": code, "reason": reason}}

CASES = [
    # (pod, node, expected (kind, exit_code, reason) facts besides NODE_STARTED)
    (pod(state={"running": {}}), node(), []),
    (pod("Succeeded", state=TERM(0, "Completed")), node(), [(base.NODE_EXITED, 0, "Completed")]),
    (pod("Failed", state=TERM(1, "Error")), node(), [(base.NODE_EXITED, 1, "Error")]),
    (pod("Failed", state=TERM(137, "OOMKilled")), node(), [(base.OOM_KILLED, 137, "OOMKilled")]),
    (pod("Failed", state=TERM(83, "Error")), node(), [(base.NODE_EXITED, 83, "Error")]),
    # a missing image or refused credentials never fix themselves ...
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": 'rpc error: code = NotFound desc = '
                                       'failed to pull and unpack image "r/x:v1": r/x:v1: not found'}}), node(),
     [(base.IMAGE_PULL_FAILED, None, "ErrImagePull")]),
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": 'failed to authorize: failed to fetch '
                                       'anonymous token: 401 Unauthorized'}}), node(),
     [(base.IMAGE_PULL_FAILED, None, "ErrImagePull")]),
    (pod("Pending", state={"waiting": {"reason": "InvalidImageName"}}), node(),
     [(base.IMAGE_PULL_FAILED, None, "InvalidImageName")]),
    # ... a registry's 429, a 5xx or a timeout do; a back-off names no cause: the kubelet retries,
    # and the wait is said (restart.image_pull_timeout bounds it)
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": "unexpected status code "
                                       "https://r/v2/: 429 Too Many Requests - Server message: toomanyrequests"}}),
     node(), [(base.NODE_WAITING, None, "ErrImagePull")]),
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": "dial tcp 10.0.0.9:443: i/o timeout"}}),
     node(), [(base.NODE_WAITING, None, "ErrImagePull")]),
    (pod("Pending", state={"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "r/x:v1"'}}),
     node(), [(base.NODE_WAITING, None, "ImagePullBackOff")]),
    # the node's runtime does not trust the registry: no retry fixes it
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": 'failed to pull and unpack image '
                                       '"r/x:v1": failed to resolve reference: tls: failed to verify certificate: '
                                       'x509: certificate signed by unknown authority'}}), node(),
     [(base.IMAGE_PULL_FAILED, None, "ErrImagePull")]),
    # the node's disk cannot hold the image: the node's fault, another may have room
    (pod("Pending", state={"waiting": {"reason": "ErrImagePull", "message": 'failed to pull and unpack image '
                                       '"r/x:v1": failed to extract layer sha256:ab: write /var/lib/containerd/'
                                       'x: no space left on device'}}), node(),
     [(base.NODE_LOST, None, "ImagePullNoSpace")]),
    (pod("Pending", state={"waiting": {"reason": "ContainerCreating"}}), node(), []),
    (pod(conds=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]),
     node("Unknown", "NodeStatusUnknown"), [(base.NODE_LOST, None, "DeletionByTaintManager")]),
    (pod(conds=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]),
     node(), [(base.EVICTED, None, "EvictionByEvictionAPI")]),
    (pod(conds=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
     node(), [(base.EVICTED, None, "PreemptionByScheduler")]),
    (pod("Failed", reason="Evicted"), node(), [(base.EVICTED, None, "Evicted")]),
    (pod(state={"running": {}}), node("Unknown", "NodeStatusUnknown"), [(base.NODE_LOST, None, "NodeStatusUnknown")]),
    (pod(state={"running": {}}), node("False", "KubeletNotReady"), [(base.NODE_LOST, None, "KubeletNotReady")]),
    (pod(state={"running": {}}), None, [(base.NODE_LOST, None, "NodeDeleted")]),
    # an exited pod on a node that later dies is not lost: its result is known
    (pod("Succeeded", state=TERM(0, "Completed")), node("Unknown"), [(base.NODE_EXITED, 0, "Completed")]),
]


@pytest.mark.parametrize("p,n,expected", CASES)
def test_pod_events_table(p, n, expected):
    facts = [(e.kind, e.exit_code, e.reason) for _, e in pod_events(p, n) if e.kind != base.NODE_STARTED]
    assert facts == expected


def test_one_loss_fact_however_it_is_seen():
    dt = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]
    keys = {k for k, e in pod_events(pod(conds=dt), node("Unknown")) if e.kind == base.NODE_LOST}
    deleted = pod_deleted_event(pod(), cancelled=False, job_finished=None, failure_seen=False)
    assert keys == {("lost", "u1")} and deleted is not None and deleted[0] == ("lost", "u1")


@pytest.mark.parametrize("kw,lost", [
    ({"cancelled": False, "job_finished": None, "failure_seen": False}, True),
    ({"cancelled": True, "job_finished": None, "failure_seen": False}, False),
    ({"cancelled": False, "job_finished": "Complete", "failure_seen": False}, False),
    # the Job controller deleting the survivors of a failure already seen: a consequence
    ({"cancelled": False, "job_finished": "Failed", "failure_seen": True}, False),
    # a Failed Job seen before the deletion that failed it (separate watch streams): the cause
    ({"cancelled": False, "job_finished": "Failed", "failure_seen": False}, True),
])
def test_pod_deleted(kw, lost):
    assert (pod_deleted_event(pod(), **kw) is not None) == lost
    # a pod whose exit is known is not lost when its object goes
    assert pod_deleted_event(pod("Failed", state=TERM(1, "Error")), **kw) is None


def test_node_statuses_newest_pod_per_index():
    old = pod("Failed", idx=0, uid="a", state=TERM(1, "Error"))
    new = pod("Running", idx=0, uid="b", state={"running": {}})
    new["metadata"]["creationTimestamp"] = "2026-01-01T00:00:05Z"
    lost = pod("Running", idx=1, uid="c", node="n2", state={"running": {}})
    out = node_statuses([old, new, lost], 3, lost={"c"})
    assert [(n.node, n.phase, n.host) for n in out] == [
        (0, base.RUNNING, "n1"), (1, base.LOST, "n2"), (2, base.PENDING, None)]


def test_loss_without_node_access_is_read_from_the_pod():
    """Without Nodes (403), the pod's own evidence: the node lifecycle controller's Ready=False
    (no reason, ContainersReady still True), DisruptionTarget from the taint manager or pod GC,
    or a deletion unconfirmed well past its grace period. A kubelet's own NotReady (with a
    reason) or a pod in its grace period is no loss."""
    from orchestrator.backends.kubernetes.classify import TERMINATION_SLACK_S, pod_loss_evidence

    def reason(p: dict, now: float) -> str:
        found = pod_loss_evidence(p, now)
        assert found is not None, p
        return found[0]

    running: dict = {"running": {}}
    marked = pod(state=running, conds=[{"type": "ContainersReady", "status": "True"},
                                       {"type": "Ready", "status": "False"}])
    probe = pod(state=running, conds=[{"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                                      {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}])
    gc = pod(state=running, conds=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}])
    evicted = pod(state=running, conds=[{"type": "DisruptionTarget", "status": "True",
                                         "reason": "EvictionByEvictionAPI"}])
    stuck = pod(state=running)
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    due = 1767225630.0            # 2026-01-01T00:00:30Z
    assert reason(marked, due) == "NodeNotReady"
    assert reason(gc, due) == "DeletionByPodGC"
    assert pod_loss_evidence(probe, due) is None and pod_loss_evidence(evicted, due) is None
    assert pod_loss_evidence(stuck, due + TERMINATION_SLACK_S - 1) is None
    assert reason(stuck, due + TERMINATION_SLACK_S + 1) == "TerminationUnconfirmed"
    facts = pod_events(marked, None, nodes_known=False, node_access=False, now=due)
    assert [(k[0], e.kind, e.reason) for k, e in facts if e.kind != base.NODE_STARTED] == \
        [("lost", base.NODE_LOST, "NodeNotReady")]
    # with node access the Node decides: the pod's flag alone is not read
    assert [e.kind for _, e in pod_events(marked, node(), now=due)] == [base.NODE_STARTED]


def test_job_end_from_the_job_controllers_events():
    from orchestrator.backends.kubernetes.classify import job_end_event

    def ev(reason, etype, when, message=""):
        return {"reason": reason, "type": etype, "lastTimestamp": when, "message": message}
    end = job_end_event([ev("SuccessfulCreate", "Normal", "t1"), ev("Completed", "Normal", "t2")])
    assert end is not None and end[0] == "Complete"
    assert job_end_event([ev("BackoffLimitExceeded", "Warning", "t2", "Job has reached the specified backoff limit")]) \
        == ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    assert job_end_event([ev("SuccessfulCreate", "Normal", "t1"), ev("FailedCreate", "Warning", "t2")]) is None


def test_log_cursor_resumes_by_timestamp_not_by_line_count():
    """After a reconnect, lines read before are dropped (by stamp and text); a rotated log,
    which starts again with fewer lines, loses nothing new; the resumed read reaches back the
    cursor's reorder window plus the clock-skew margin."""
    from orchestrator.backends.kubernetes.classify import SINCE_MARGIN_S, since_seconds
    from orchestrator.backends.logcursor import REORDER_WINDOW_NS, LogCursor, split_timestamp

    assert split_timestamp("2026-12-04T15:10:00.5Z hello world") == (1796397000_500000000, "hello world")
    assert split_timestamp("2026-12-04T15:10:00Z x")[0] == 1796397000_000000000
    assert split_timestamp("no stamp here") == (None, "no stamp here")
    cur = LogCursor()
    assert since_seconds(cur, 0.0) is None
    first = [(10, "a"), (20, "b"), (20, "c")]
    assert [t for s, t in first if cur.fresh(s, t)] == ["a", "b", "c"]
    again = [(20, "b"), (20, "c"), (20, "d"), (30, "e")]      # the reconnect overlaps by design
    assert [t for s, t in again if cur.fresh(s, t)] == ["d", "e"]
    rotated = [(40, "f")]                                      # a new file, line 1 of it
    assert [t for s, t in rotated if cur.fresh(s, t)] == ["f"]
    assert since_seconds(cur, 100.0) == 100 + REORDER_WINDOW_NS // 10**9 + SINCE_MARGIN_S


def test_a_failure_target_already_ends_the_job():
    """Since 1.31 the Job controller sets FailureTarget (or SuccessCriteriaMet) first and
    deletes the remaining pods; Failed (Complete) follows only once none is terminating, which a
    pod stuck on a dead node can hold off for minutes. A pod deleted meanwhile, after a failure
    was seen, is a consequence, not another lost node."""
    from orchestrator.backends.kubernetes.classify import job_finished

    def job(*types):
        return {"status": {"conditions": [{"type": t, "status": "True"} for t in types]}}
    assert job_finished(job("FailureTarget")) == "Failed"
    assert job_finished(job("SuccessCriteriaMet")) == "Complete"
    assert job_finished(job("FailureTarget", "Failed")) == "Failed"
    assert job_finished(job("Suspended")) is None
    pending = pod("Pending", idx=1, uid="u2", node=None)
    assert pod_deleted_event(pending, cancelled=False, job_finished=job_finished(job("FailureTarget")),
                             failure_seen=True) is None


@pytest.mark.parametrize("ready, since_s, tolerations, lost", [
    ("False", 10, [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 30}], False),        # a blip within node_loss_timeout
    ("False", 40, [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 30}], True),         # outlasted it
    ("False", 10, [], True),                                  # no toleration: the taint manager evicts at once
    ("False", 10_000, [{"operator": "Exists"}], False),       # tolerated for ever
    ("Unknown", 1, [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                     "tolerationSeconds": 30}], True),        # a silent kubelet is not judged by it
])
def test_a_kubelet_reported_not_ready_is_lost_only_past_the_pods_toleration(ready, since_s, tolerations, lost):
    import datetime as dt
    now = 1_800_000_000.0
    stamp = dt.datetime.fromtimestamp(now - since_s, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    n = node(ready, "KubeletNotReady" if ready == "False" else "NodeStatusUnknown")
    n["status"]["conditions"][0]["lastTransitionTime"] = stamp
    p = pod(state={"running": {}})
    p["spec"]["tolerations"] = tolerations
    kinds = [e.kind for _, e in pod_events(p, n, now=now)]
    assert (base.NODE_LOST in kinds) == lost


def test_a_failed_exit_on_a_node_with_a_problem_condition_is_a_device_fault_with_that_evidence():
    from orchestrator import failures as F
    n = node()
    n["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                                      "message": "task docker:7 blocked for more than 120 seconds."})
    (ev,) = [e for _, e in pod_events(pod("Failed", state=TERM(1, "Error")), n) if e.kind != base.NODE_STARTED]
    found = F.classify_event(ev)
    assert found is not None and found.kind == F.DEVICE_FAULT
    assert "decided by node n1's node condition KernelDeadlock=True (DockerHung" in found.evidence
    # the kubelet's own conditions, and a problem condition that is False, are no evidence
    n["status"]["conditions"][-1]["status"] = "False"
    n["status"]["conditions"].append({"type": "MemoryPressure", "status": "True"})
    (ev,) = [e for _, e in pod_events(pod("Failed", state=TERM(1, "Error")), n) if e.kind != base.NODE_STARTED]
    assert (failure := F.classify_event(ev)) is not None and failure.kind == F.APP_ERROR
