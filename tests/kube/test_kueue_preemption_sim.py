"""Kueue preempts a running attempt (issue 23 item 1): Kueue suspends the Job, the Job controller
deletes its pods with no condition, torchrun exits 1 on their SIGTERM. On main that exit read as
app_error and stopped the run; now it is `preempted`, and the next attempt waits in the queue
for readmission (fakeapi/kueue_preempt.py)."""

from __future__ import annotations

import pytest
from .sdk import client as k8s

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict

from .fakeapi.kueue_preempt import PREEMPTED, preempt
from .test_kueue_sim import FULL, KUEUE, LQ, condition, evidence, workloads
from .simhelpers import start_supervisor

pytestmark = pytest.mark.timeout(90)


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


@pytest.mark.fake_api(crds=KUEUE)
def test_fake_kueue_preemption_evicts_the_workload_and_suspends_the_job(fake_api):
    custom, batch = k8s.CustomObjectsApi(fake_api.client), k8s.BatchV1Api(fake_api.client)
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues", LQ)
    from .test_kueue_sim import queued_job

    fake_api.cluster.script(job="pj", run_seconds=None, sigterm_exit_code=1)
    batch.create_namespaced_job("default", queued_job("pj", "team-a"))
    fake_api.cluster.start()
    assert fake_api.cluster.run_until(lambda: len([p for p in fake_api.store.list("pods", "default")[0]
                                                   if p["status"].get("phase") == "Running"]) == 2)
    fake_api.cluster.kueue_full["team-a"] = FULL
    preempt(fake_api.cluster, "default", "pj")
    (wl,) = workloads(fake_api)
    assert condition(wl, "Evicted") == ("True", "Preempted", PREEMPTED)
    assert condition(wl, "Admitted")[0] == "False"
    assert batch.read_namespaced_job("pj", "default").spec.suspend is True
    # the Job controller deletes the pods; their SIGTERM exit (torchrun: 1), no DisruptionTarget
    assert fake_api.cluster.run_until(lambda: not fake_api.store.list("pods", "default")[0], timeout=20)
    stopped = [w for _, w, d in fake_api.cluster.timeline if w == "pod_stopped"]
    assert len(stopped) == 2
    # readmitted once there is room: unsuspended, pods again
    del fake_api.cluster.kueue_full["team-a"]
    assert fake_api.cluster.run_until(lambda: len(fake_api.store.list("pods", "default")[0]) == 2, timeout=20)
    assert batch.read_namespaced_job("pj", "default").spec.suspend is False


@pytest.mark.fake_api(crds=KUEUE)
def test_a_kueue_preemption_is_preempted_and_the_next_attempt_waits_for_readmission(fake_api, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    k8s.CoreV1Api(fake_api.client).create_namespace({"metadata": {"name": "training"}})
    k8s.CustomObjectsApi(fake_api.client).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta1", "training", "localqueues", LQ)
    spec = from_dict({
        "name": "kp", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
        "kubernetes": {"namespace": "training", "queue": "team-a"},
    })
    cluster = fake_api.cluster
    cluster.script(job="kp-a0", run_seconds=None, sigterm_exit_code=1, logs=[(0.0, progress("checkpoint", 10))])
    cluster.script(job="kp-a1", run_seconds=0.3,
                   logs=[(0.0, progress("resume", 10)), (0.1, progress("checkpoint", 20))])
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2, namespace="training")
    thread, result, store, lines = start_supervisor(spec, backend)
    try:
        assert cluster.run_until(lambda: any("checkpoint" in ln for ln in lines), timeout=30), lines
        cluster.kueue_full["team-a"] = FULL           # the preemptor takes the quota
        preempt(cluster, "training", "kp-a0")
        assert cluster.run_until(lambda: evidence(store).startswith("queued: ") and
                                 len(store.load().attempts) == 2, timeout=30), "\n".join(lines)
        del cluster.kueue_full["team-a"]              # the preemptor finished: readmitted
        thread.join(timeout=60)
        assert not thread.is_alive(), lines
    finally:
        backend.close()
    a0, a1 = store.load().attempts
    assert result["outcome"].exit_code == 0, result["outcome"].report
    assert (a0.outcome, a0.decision) == ("preempted", "retry"), a0.evidence
    assert a0.evidence is not None
    assert "Kueue" in a0.evidence and "readmission" in a0.evidence
    assert a1.outcome == "succeeded"
