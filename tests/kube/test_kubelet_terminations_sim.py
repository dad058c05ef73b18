"""Simulation: the real supervisor and Kubernetes backend against the fake cluster, when the
kubelet ends a pod (issue 23 item 1: a storage-limit eviction, a graceful node shutdown) or its
topology manager refuses it (item 8). Each failed on main: the eviction read as node_lost (exit
137, the healthy node excluded), the shutdown as app_error (torchrun's exit 1 on SIGTERM), the
refusal as node_lost (one identical node excluded after another)."""

from __future__ import annotations

import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView

from .fakeapi import kubelet_terminations as kt
from .simhelpers import run_supervisor

pytestmark = pytest.mark.timeout(90)


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


def _spec(name: str):
    return from_dict({
        "name": name, "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    })


def _supervise(spec, fake_api, lines):
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="k.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    return backend, store, sup


def _node_of(fake_api, job: str, index: int) -> str | None:
    for p in fake_api.store.list("pods")[0]:
        labels = p["metadata"].get("labels") or {}
        if labels.get("job-name") == job and labels.get("batch.kubernetes.io/job-completion-index") == str(index) \
                and (p.get("status") or {}).get("phase") == "Running":
            return p["spec"].get("nodeName")
    return None


def test_sim_an_emptydir_over_its_size_limit_stops_with_the_kubelets_words_and_blames_no_node(
        fake_api, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("evs")
    cluster = fake_api.cluster
    cluster.script(job="evs-a0", run_seconds=None, logs=[(0.0, progress("checkpoint", 10))])
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    thread, result = run_supervisor(sup)
    try:
        assert cluster.run_until(lambda: _node_of(fake_api, "evs-a0", 1) is not None, timeout=30)
        host = _node_of(fake_api, "evs-a0", 1)
        assert host is not None
        assert kt.evict_for_storage_limit(cluster, host, kt.emptydir_message("scratch", "1Gi"))
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        backend.close()
    (a0,) = store.load().attempts
    assert result["outcome"].exit_code != 0
    assert (a0.outcome, a0.decision) == ("storage_full", "stop"), a0.evidence
    assert 'Usage of EmptyDir volume "scratch" exceeds the limit "1Gi"' in a0.evidence
    assert not a0.excluded_nodes


def test_sim_a_graceful_node_shutdown_is_retried_without_blaming_the_node(fake_api, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("shd")
    cluster = fake_api.cluster
    cluster.script(job="shd-a0", run_seconds=None, sigterm_exit_code=1, logs=[(0.0, progress("checkpoint", 10))])
    cluster.script(job="shd-a1", run_seconds=0.3,
                   logs=[(0.0, progress("resume", 10)), (0.1, progress("checkpoint", 20))])
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    thread, result = run_supervisor(sup)
    try:
        assert cluster.run_until(lambda: _node_of(fake_api, "shd-a0", 1) is not None, timeout=30)
        host = _node_of(fake_api, "shd-a0", 1)
        assert host is not None
        assert kt.shut_down_node(cluster, host)
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        backend.close()
    a0, a1 = store.load().attempts
    assert result["outcome"].exit_code == 0, result["outcome"].report
    assert (a0.outcome, a0.decision) == ("preempted", "retry"), a0.evidence
    assert "shutting down" in a0.evidence
    assert a1.excluded_nodes == []


def test_sim_a_topology_manager_refusal_is_explained_and_excludes_no_node(fake_api, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("topo")
    cluster = fake_api.cluster
    for n in ("node-a", "node-b", "node-c"):          # identical nodes, one policy
        cluster.admission_rejections[n] = ("TopologyAffinityError",
                                           "Resources cannot be allocated with Topology locality")
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    try:
        outcome = sup.run()
    finally:
        backend.close()
    attempts = store.load().attempts
    assert outcome.exit_code != 0
    assert [(a.outcome, a.decision, a.excluded_nodes) for a in attempts] == [("unschedulable", "stop", [])]
    assert "NUMA" in attempts[0].evidence and "Topology locality" in attempts[0].evidence
