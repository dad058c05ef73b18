"""Simulation: the real supervisor drives the real Kubernetes backend (real `kubernetes` client,
real HTTP) against the fake API server and scripted cluster of tests/kube/fakeapi. No real
cluster is involved; Kubernetes durations are scaled (40 s node grace period -> 0.2 s).

A node's machine dies mid-run: the supervisor must see the loss from the Node's conditions,
tear the whole attempt down (including the pod stuck Terminating on the dead node), and create
attempt 1 with resume and a node anti-affinity for the dead node, which then runs elsewhere and
completes.
"""

from __future__ import annotations


import kubernetes_validate
import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.watchview import EchoView
from orchestrator.vendors import load_profile

from .manifests import watcher_rbac, without_nodes
from .simhelpers import node_of_index, running_pods, start_supervisor

pytestmark = pytest.mark.timeout(90)


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


@pytest.mark.parametrize("who", ["unrestricted", "rbac-watcher", "rbac-watcher-without-nodes", "edit-role"])
def test_sim_supervisor_replaces_an_attempt_that_lost_a_node(fake_api, tmp_path, monkeypatch, who):
    """The supervisor sees node 1's machine die, tears attempt 0 down (the pod stuck on the dead
    node included) and resumes attempt 1 elsewhere: with every permission; under exactly the
    rules of manifests/rbac-watcher.yaml (not one request refused); under those rules without
    the Node ClusterRole, and as a user with the built-in namespace `edit` role (Nodes cannot be
    read: the pods' own conditions tell the loss; only the Node reads are refused)."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    from .fakeapi.rbac import User, request_attributes

    namespace = "default" if who == "unrestricted" else "training"
    spec = from_dict({
        "name": "sup", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        # a lost node is excluded: no backoff (an hour here) stands between it and the next attempt
        "restart": {"max_attempts": 3, "backoff": "1h", "heartbeat_timeout": "60s"},
        "kubernetes": {"namespace": namespace},
    })
    sa = User.service_account("training", "wmctl-watcher")
    api_client = {
        "unrestricted": lambda: fake_api.client,
        "rbac-watcher": lambda: fake_api.as_user("sa-token", sa, manifests=watcher_rbac()),
        "rbac-watcher-without-nodes": lambda: fake_api.as_user("sa-token", sa, manifests=without_nodes(watcher_rbac())),
        "edit-role": lambda: fake_api.as_user("alice-token", role="edit", namespace="training"),
    }[who]()
    profile = load_profile("cpu")
    cluster = fake_api.cluster
    cluster.script(job="sup-a0", run_seconds=None)       # attempt 0 runs until its node dies
    cluster.script(job="sup-a0", index=0, run_seconds=None,
                   logs=[(0.0, progress("start", 0)), (0.05, progress("checkpoint", 10)), (0.1, progress("step", 12))])
    cluster.script(job="sup-a1", run_seconds=1.2)
    cluster.script(job="sup-a1", index=0, run_seconds=1.5,
                   logs=[(0.0, progress("resume", 10)), (0.2, progress("checkpoint", 20)), (0.4, progress("step", 25))])
    cluster.start()

    backend = KubernetesBackend(api_client, watch_timeout=2, namespace=namespace)
    thread, result, store, lines = start_supervisor(spec, backend, profile)
    try:
        assert cluster.run_until(lambda: len(running_pods(fake_api, "sup-a0")) == 2
                                 and any("checkpoint" in ln for ln in lines)), "\n".join(lines)
        dead = node_of_index(running_pods(fake_api, "sup-a0"), 1)
        cluster.kill_node(dead)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()

    outcome = result["outcome"]
    assert outcome.exit_code == 0, outcome.report
    a0, a1 = store.load().attempts
    assert (a0.outcome, a0.failed_node, a0.failed_host, a0.decision) == ("node_lost", 1, dead, "retry_elsewhere")
    assert (a1.outcome, a1.excluded_nodes, a1.resumed_from_step) == ("succeeded", [dead], 10), "\n".join(lines)
    assert f"no backoff: {dead} is excluded, the next attempt goes elsewhere, so attempt 1 starts now" in lines, lines
    # attempt 0 is gone entirely, the pod stuck on the dead node included
    def resource(r: dict) -> str:
        attrs = request_attributes(r["verb"], r["path"], r["query"])
        assert attrs is not None, r            # a refused request names a resource
        return attrs.resource

    refused = {(r["verb"], resource(r)) for r in fake_api.refused(403)}
    if who in ("unrestricted", "rbac-watcher"):
        assert not refused
    else:
        assert refused and {path for _, path in refused} == {"nodes"}, refused
        lost = [ln for ln in lines if "node_lost" in ln]
        assert lost and "not ready" in lost[0], lines       # told by the pod's Ready condition
    assert not [j for j in fake_api.store.list("jobs")[0] if j["metadata"]["name"] == "sup-a0"]
    assert not [p for p in fake_api.store.list("pods")[0] if p["metadata"]["labels"].get("job-name") == "sup-a0"]
    # attempt 1 was placed away from the dead node, and told to resume
    job1 = next(j for j in fake_api.store.list("jobs")[0] if j["metadata"]["name"] == "sup-a1")
    pod_spec = job1["spec"]["template"]["spec"]
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [dead]} in \
        terms["nodeSelectorTerms"][0]["matchExpressions"]
    env = {e["name"]: e.get("value") for e in pod_spec["containers"][0]["env"]}
    assert env.get("WMCTL_RESUME") == "1"
    ran_on = {ch.obj["spec"].get("nodeName") for ch in fake_api.store._history
              if ch.resource == "pods" and ch.obj["metadata"]["labels"].get("job-name") == "sup-a1"}
    assert dead not in ran_on and ran_on - {None}
    # what the supervisor created is what a real API server would accept
    for req in fake_api.api.sent("POST", ""):
        body = req["body"]
        if body and body.get("apiVersion") in ("v1", "batch/v1"):
            kubernetes_validate.validate(body, "1.30", strict=True)


def test_sim_the_next_attempt_is_created_only_once_the_last_ones_pods_are_gone(fake_api, tmp_path, monkeypatch):
    """Attempt 0 loses node 1; its pod 0, on a healthy node, takes a while to stop after SIGTERM
    (a checkpoint save). Attempt 1's Job is created only after every pod of attempt 0 is gone:
    its pod 0 (the rendezvous host) must not queue behind, or start beside, its predecessor."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "seq", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s"},
    })
    cluster = fake_api.cluster
    cluster.script(job="seq-a0", run_seconds=None)
    cluster.script(job="seq-a0", index=0, run_seconds=None, sigterm_seconds=1.0,
                   logs=[(0.0, progress("start", 0)), (0.05, progress("checkpoint", 10))])
    cluster.script(job="seq-a1", run_seconds=0.3,
                   logs=[(0.0, progress("resume", 10)), (0.1, progress("checkpoint", 20))])
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend)
    try:
        def running(job):
            return [p for p in fake_api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        assert cluster.run_until(lambda: len(running("seq-a0")) == 2 and any("checkpoint" in ln for ln in lines))
        dead = next(p["spec"]["nodeName"] for p in running("seq-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.kill_node(dead)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    assert result["outcome"].exit_code == 0, result["outcome"].report
    history = list(fake_api.store._history)
    a0_pods = {ch.obj["metadata"]["name"] for ch in history if ch.resource == "pods" and ch.type == "ADDED"
               and ch.obj["metadata"]["labels"].get("job-name") == "seq-a0"}
    a1_created = min(ch.rv for ch in history if ch.resource == "jobs" and ch.type == "ADDED"
                     and ch.obj["metadata"]["name"] == "seq-a1")
    gone_before = {ch.obj["metadata"]["name"] for ch in history if ch.resource == "pods" and ch.type == "DELETED"
                   and ch.rv < a1_created}
    assert len(a0_pods) == 2 and a0_pods <= gone_before, \
        f"attempt 1 was created while {sorted(a0_pods - gone_before)} of attempt 0 were still there"


@pytest.mark.parametrize("why", ["no-node-fits", "quota", "pod-security", "priority-class", "service-account"])
def test_sim_an_attempt_that_cannot_be_placed_says_why_and_ends_unschedulable(fake_api, tmp_path, monkeypatch, why):
    """Pods the scheduler cannot place (PodScheduled=False/Unschedulable) or the API server
    refuses to create (a ResourceQuota, PodSecurity baseline against hostPath volumes: only the
    Job's FailedCreate Event says so) are shown with the cluster's reason while they wait, and
    after restart.pending_timeout the attempt ends `unschedulable` with it, instead of waiting forever."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    from .sdk import client as k8s

    core = k8s.CoreV1Api(fake_api.client)
    data: dict = {
        "name": "pend", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 3, "backoff": "0s", "pending_timeout": "2s"},
        "kubernetes": {"namespace": "team"},
    }
    expect = {"no-node-fits": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
              "quota": "exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1",
              "pod-security": 'violates PodSecurity "baseline:latest": hostPath volumes (volume "models")',
              "priority-class": "no PriorityClass with name training-high was found",
              "service-account": 'error looking up service account team/trainer: serviceaccount "trainer" not found',
              }[why]
    labels = {}
    if why == "no-node-fits":
        data["kubernetes"]["node_selector"] = {"gpu": "h200"}
    elif why == "priority-class":
        data["kubernetes"]["priority_class"] = "training-high"
    elif why == "service-account":
        data["kubernetes"]["service_account"] = "trainer"
    elif why == "quota":
        core.create_namespaced_resource_quota(
            "team", {"metadata": {"name": "compute"}, "spec": {"hard": {"pods": "1"}}})
    else:
        labels = {"pod-security.kubernetes.io/enforce": "baseline"}
        data["volumes"] = [{"name": "models", "mount": "/models", "host_path": "/mnt/models"}]
    core.create_namespace({"metadata": {"name": "team", "labels": labels}})
    spec = from_dict(data)
    fake_api.cluster.script(job="pend-a0", run_seconds=None)
    fake_api.cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2, namespace="team")
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="p.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[str] = []
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    try:
        outcome = sup.run()
    finally:
        backend.close()
    (a0,) = store.load().attempts
    assert outcome.exit_code == 7, outcome.report
    assert (a0.outcome, a0.decision) == ("unschedulable", "stop")
    # a PodSecurity refusal is refused for good: it ends at once (test_admission_sim.py)
    assert a0.evidence is not None
    assert expect in a0.evidence and ("restart.pending_timeout" in a0.evidence) == (why != "pod-security")
    assert any("node_waiting" in ln and expect in ln for ln in lines), lines      # shown while it waited
    assert not any("node None" in ln for ln in lines), lines        # a refused pod names no node


def test_sim_a_kubelet_that_refuses_the_pod_is_a_node_fault_retried_elsewhere(fake_api, tmp_path, monkeypatch):
    """node-a's kubelet refuses pods (UnexpectedAdmissionError: its device plugin lost a GPU):
    the attempt is node_lost on node-a, not a survivor's SIGTERM 'preempted' on the same
    placement; attempt 1 excludes node-a and completes."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "adm", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    })
    cluster = fake_api.cluster
    cluster.admission_rejections["node-a"] = (
        "UnexpectedAdmissionError", "Allocate failed due to no healthy devices present, which is unexpected")
    cluster.script(job="adm-a0", run_seconds=None)
    cluster.script(job="adm-a1", run_seconds=0.3)
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="a.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lambda _: None),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    try:
        outcome = sup.run()
    finally:
        backend.close()
    a0, a1 = store.load().attempts
    assert outcome.exit_code == 0, outcome.report
    assert (a0.outcome, a0.failed_host, a0.decision) == ("node_lost", "node-a", "retry_elsewhere")
    assert a0.evidence is not None
    assert "UnexpectedAdmissionError" in a0.evidence or "no healthy devices" in a0.evidence
    assert a1.excluded_nodes == ["node-a"]


def test_sim_a_gpu_the_device_plugin_marks_unhealthy_is_a_device_fault_retried_elsewhere(fake_api, tmp_path,
                                                                                          monkeypatch):
    """Node 1's device plugin reports one of its GPUs unhealthy (allocatable 2 -> 1) while the job
    holds both: the attempt is a device_fault on that node, with that evidence in the record, and
    attempt 1 runs without it. Before, nothing noticed until the rank crashed as an app_error."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "gpu", "nodes": 2, "accelerators_per_node": 2,
        "image": {"vendor": "cuda", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    })
    cluster = fake_api.cluster
    for n in ("node-a", "node-b", "node-c"):
        cluster.set_devices(n, "nvidia.com/gpu", 2)
    cluster.script(job="gpu-a0", run_seconds=None)
    cluster.script(job="gpu-a0", index=0, run_seconds=None, logs=[(0.0, progress("checkpoint", 10))])
    cluster.script(job="gpu-a1", run_seconds=0.3,
                   logs=[(0.0, progress("resume", 10)), (0.1, progress("checkpoint", 20))])
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend, load_profile("cuda"))
    try:
        def running(job):
            return [p for p in fake_api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        assert cluster.run_until(lambda: len(running("gpu-a0")) == 2 and any("checkpoint" in ln for ln in lines))
        sick = next(p["spec"]["nodeName"] for p in running("gpu-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.set_devices(sick, "nvidia.com/gpu", 1)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    assert result["outcome"].exit_code == 0, result["outcome"].report
    a0, a1 = store.load().attempts
    assert (a0.outcome, a0.failed_host, a0.decision) == ("device_fault", sick, "retry_elsewhere")
    assert a0.evidence is not None
    assert f"decided by node {sick}'s allocatable nvidia.com/gpu: 2 -> 1" in a0.evidence
    assert a1.excluded_nodes == [sick]
