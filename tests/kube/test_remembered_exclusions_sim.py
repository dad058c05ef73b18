"""Exclusions that outlive a run, against the fake API server: run A loses a node's machine; the
watcher remembers it (keyed by the API server); run B, planned by a separate wmctl process that
finds the same server through its kubeconfig, keeps off that node (its rendered Job's node
anti-affinity) and says so; `wmctl nodes` lists it, `wmctl nodes forgive` clears it. The
ConfigMap store (WMCTL_RUN_STORE=kubernetes) keeps every racing writer's entry."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import yaml

from orchestrator import exclusions as X
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.backends.kubernetes.runstore import EXCLUSIONS_NAME, ClusterExclusionStore
from orchestrator.specload import from_dict

from .simhelpers import node_of_index, running_pods, start_supervisor
from .test_cli_sim import sim_env

pytestmark = pytest.mark.timeout(120)
DAY = 24 * 3600.0


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


def job_spec(name: str) -> dict:
    return {"name": name, "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
            "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
            "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
            "restart": {"max_attempts": 3, "backoff": "1h", "heartbeat_timeout": "60s"}}


def wmctl(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def not_in(job: dict) -> list[str]:
    affinity = job["spec"]["template"]["spec"].get("affinity") or {}
    terms = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return [v for term in terms.get("nodeSelectorTerms") or [] for m in term.get("matchExpressions") or []
            if m.get("key") == "kubernetes.io/hostname" and m.get("operator") == "NotIn" for v in m["values"]]


def test_sim_a_node_lost_in_run_a_is_avoided_by_run_b_until_forgiven(fake_api, tmp_path, monkeypatch):
    env = sim_env(fake_api, tmp_path)
    monkeypatch.setenv("WMCTL_HOME", env["WMCTL_HOME"])
    monkeypatch.delenv("WMCTL_RUN_STORE", raising=False)
    spec = from_dict(job_spec("runa"))
    cluster = fake_api.cluster
    cluster.script(job="runa-a0", run_seconds=None)
    cluster.script(job="runa-a0", index=0, run_seconds=None,
                   logs=[(0.0, progress("start", 0)), (0.05, progress("checkpoint", 10))])
    cluster.script(job="runa-a1", run_seconds=0.5)
    cluster.script(job="runa-a1", index=0, run_seconds=0.6, logs=[(0.0, progress("resume", 10))])
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend)
    try:
        assert cluster.run_until(lambda: len(running_pods(fake_api, "runa-a0")) == 2
                                 and any("checkpoint" in ln for ln in lines)), "\n".join(lines)
        dead = node_of_index(running_pods(fake_api, "runa-a0"), 1)
        cluster.kill_node(dead)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    assert result["outcome"].exit_code == 0, result["outcome"].report

    # remembered, keyed by the API server, with the evidence
    [kept] = X.active(X.LocalExclusionStore().load())
    assert (kept.node, kept.cluster, kept.kind, kept.run, kept.attempt) == (
        dead, fake_api.server.url, "node_lost", "runa", 0)
    assert kept.evidence and kept.expires == pytest.approx(kept.at + DAY)

    # run B, planned by another wmctl process through its kubeconfig's context for the same server
    spec_b = tmp_path / "b.yaml"
    spec_b.write_text(yaml.safe_dump(job_spec("runb")))
    planned = wmctl(env, "submit", str(spec_b), "-b", "kubernetes", "--context", "sim", "--dry-run", "-o", "json")
    assert planned.returncode == 0, planned.stderr
    job_b = next(o for o in json.loads(planned.stdout)["items"] if o["kind"] == "Job")
    assert not_in(job_b) == [dead]
    shown = wmctl(env, "submit", str(spec_b), "-b", "kubernetes", "--context", "sim", "--dry-run")
    assert "# remembered exclusions applied" in shown.stdout and f"{dead} (node_lost in run runa attempt 0)" in \
        shown.stdout, shown.stdout
    assert "failed earlier attempts" not in shown.stdout      # run B's attempt 0 has none of its own
    # another cluster's context: nothing remembered there
    elsewhere = wmctl(env, "submit", str(spec_b), "-b", "kubernetes", "--context", "other", "--dry-run", "-o", "json")
    assert elsewhere.returncode == 0 and not_in(next(o for o in json.loads(elsewhere.stdout)["items"]
                                                     if o["kind"] == "Job")) == []

    listed = wmctl(env, "nodes", "-o", "json")
    assert [(r["node"], r["cluster"], r["run"]) for r in json.loads(listed.stdout)] == [
        (dead, fake_api.server.url, "runa")]
    forgiven = wmctl(env, "nodes", "forgive", dead, "--cluster", fake_api.server.url)
    assert forgiven.returncode == 0, forgiven.stderr
    planned = wmctl(env, "submit", str(spec_b), "-b", "kubernetes", "--context", "sim", "--dry-run", "-o", "json")
    assert not_in(next(o for o in json.loads(planned.stdout)["items"] if o["kind"] == "Job")) == []


def test_sim_the_configmap_store_keeps_every_racing_writers_entry(fake_api):
    stores = [ClusterExclusionStore(api_client=fake_api.client, namespace="default") for _ in range(3)]

    def write(k: int) -> None:
        for i in range(8):
            X.remember(node=f"w{k}-n{i}", cluster="https://a:6443", kind="hang", evidence="no beat", run=f"r{k}",
                       attempt=i, ttl_s=DAY, store=stores[k])

    threads = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {e.node for e in stores[0].load()} == {f"w{k}-n{i}" for k in range(3) for i in range(8)}
    cm = fake_api.store.get("configmaps", "default", EXCLUSIONS_NAME)
    assert cm["metadata"]["labels"]["wmctl.io/store"] == "exclusions"
    stores[1].update(lambda entries: X.forgive(entries, "w0-n0")[0])
    assert "w0-n0" not in {e.node for e in stores[2].load()}


def test_sim_remembered_nodes_never_leave_too_few_ready_nodes(fake_api, backend, tmp_path, monkeypatch):
    """Three nodes, a 2-node job, node-a and node-b remembered: excluding both would leave one
    Ready node, so the older remembered one goes, with a warning. A node that is down anyway
    (its machine gone) costs no room: only the ones in the way go."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict(job_spec("capped"))
    assert backend.placeable_hosts(spec) == {"node-a", "node-b", "node-c"}
    url = backend.cluster_key()
    for node, ago in (("node-a", 200.0), ("node-b", 100.0)):
        X.remember(node=node, cluster=url, kind="node_lost", evidence="gone", run="earlier", attempt=0,
                   ttl_s=DAY, now=time.time() - ago)

    def plan():
        return X.for_attempt([], remembers=True, cluster=backend.cluster_key, ttl_s=DAY,
                             usable=lambda: backend.placeable_hosts(spec), needed=spec.nodes)

    capped = plan()
    assert capped.nodes == ("node-b",) and [e.node for e in capped.dropped] == ["node-a"]
    assert any(n.startswith("warning: remembered exclusions of node-a dropped") for n in capped.notes)
    # a node selector no node matches: nothing can be placed, so nothing is worth excluding
    picky = from_dict({**job_spec("capped"), "kubernetes": {"node_selector": {"pool": "none"}}})
    assert backend.placeable_hosts(picky) == frozenset()
    # node-a's machine is gone (NotReady): excluding it costs no room and it stays excluded; the
    # job now needs both Ready nodes, so node-b, though newer, goes
    fake_api.cluster.start()
    fake_api.cluster.kill_node("node-a")
    assert fake_api.cluster.run_until(lambda: backend.placeable_hosts(spec) == {"node-b", "node-c"})
    after = plan()
    assert after.nodes == ("node-a",) and [e.node for e in after.dropped] == ["node-b"]
