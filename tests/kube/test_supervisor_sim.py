"""Simulation: the real supervisor drives the real Kubernetes backend (real `kubernetes` client,
real HTTP) against the fake API server and scripted cluster of tests/kube/fakeapi. No real
cluster is involved; Kubernetes durations are scaled (40 s node grace period -> 0.2 s).

A node's machine dies mid-run: the supervisor must see the loss from the Node's conditions,
tear the whole attempt down (including the pod stuck Terminating on the dead node), and create
attempt 1 with resume and a node anti-affinity for the dead node, which then runs elsewhere and
completes.
"""

from __future__ import annotations

import threading

import kubernetes_validate
import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.plan import AttemptContext
from orchestrator.spec import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor
from orchestrator.vendors import load_profile

from .manifests import watcher_rbac, without_nodes

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
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s"},
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
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="sup.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[str] = []
    sup = Supervisor(spec, profile, backend, store, record, auto_resume=True,
                     echo=lines.append,
                     poll_interval=0.02)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("outcome", sup.run()), daemon=True)
    thread.start()
    try:
        def pods(job):
            return [p for p in fake_api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        assert cluster.run_until(lambda: len(pods("sup-a0")) == 2 and any("checkpoint" in ln for ln in lines))
        dead = next(p["spec"]["nodeName"] for p in pods("sup-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.kill_node(dead)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()

    outcome = result["outcome"]
    assert outcome.exit_code == 0, outcome.report
    a0, a1 = store.load().attempts
    assert (a0.outcome, a0.failed_node, a0.failed_host, a0.decision) == ("node_lost", 1, dead, "retry_elsewhere")
    assert (a1.outcome, a1.excluded_nodes, a1.resumed_from_step) == ("succeeded", [dead], 10)
    # attempt 0 is gone entirely, the pod stuck on the dead node included
    refused = {(r["verb"], request_attributes(r["verb"], r["path"], r["query"]).resource)
               for r in fake_api.refused(403)}
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
