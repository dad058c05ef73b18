"""Simulation: node loss seen in seconds on Kubernetes. The real supervisor drives the real
Kubernetes backend against the fake API server (tests/kube/fakeapi); Kubernetes durations are
scaled so the node-monitor grace period (40 s) lasts 4 s here.

A node's machine dies. Rank 0's runtime (orchestrator/runtime/liveness.py, tested over a real
TCPStore in tests/runtime/test_liveness.py) reports the silent node on its log, as it would 3 s
after the last beat; the supervisor declares the node lost at restart.node_silence_timeout,
before the Node is even Ready=Unknown, cuts the survivors' grace period short, force-deletes the
dead node's pod, and resumes elsewhere. When the dead machine is rank 0's own (pod index 0, the
store's host), pod index 1's runtime is the witness and reports it on its log instead."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.backends.kubernetes.teardown import DEAD_PEER_GRACE_S
from orchestrator.runtime.protocol import format_progress
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from tests.kube.simhelpers import start_supervisor


pytestmark = pytest.mark.timeout(90)


@dataclass
class SilenceRun:
    """A 2-node run 'sil' under the real supervisor, attempt 0 running with a checkpoint at step 10."""
    fake_api: Any
    store: RunStore
    thread: threading.Thread          # the supervisor's
    lines: list[str]                  # what it echoed
    result: dict                      # its outcome, once it returns

    def pods(self, job: str) -> list[dict]:
        return [p for p in self.fake_api.store.list("pods")[0]
                if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]

    def by_index(self, job: str = "sil-a0") -> dict[str, dict]:
        return {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p for p in self.pods(job)}

    def append_log(self, pod: dict, line: str) -> None:
        self.fake_api.api.append_log("default", pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], line)

    def finish(self) -> None:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "\n".join(self.lines)
        assert self.result["outcome"].exit_code == 0, self.result["outcome"].report

    def assert_resumed_without(self, dead: str) -> None:
        """Attempt 0 lost ``dead`` to its silence before Kubernetes called it Unknown; attempt 1
        ran elsewhere from the checkpoint."""
        a0, a1 = self.store.load().attempts
        assert (a0.outcome, a0.failed_host, a0.decision) == ("node_lost", dead, "retry_elsewhere"), a0.evidence
        assert a0.evidence is not None and a0.ended_at is not None
        assert "no liveness beat" in a0.evidence
        assert (a1.outcome, a1.excluded_nodes, a1.resumed_from_step) == ("succeeded", [dead], 10)
        # declared lost before the node lifecycle controller called the node Unknown
        when = {(w, who): t for t, w, who in self.fake_api.cluster.timeline}
        assert ("node_unknown", dead) not in when or \
            when[("node_unknown", dead)] > a0.ended_at - a0.timings["teardown_s"]


@pytest.fixture
def silence_run(fake_api, tmp_path, monkeypatch) -> Iterator[SilenceRun]:
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "sil", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s",
                    "node_silence_timeout": "3s"},
    })
    cluster = fake_api.cluster
    cluster.script(job="sil-a0", run_seconds=None)
    cluster.script(job="sil-a0", index=0, run_seconds=None,
                   logs=[(0.0, format_progress("start")), (0.05, format_progress("checkpoint", step=10)),
                         (0.1, format_progress("step", step=12))])
    cluster.script(job="sil-a1", run_seconds=0.5)
    cluster.script(job="sil-a1", index=0, run_seconds=0.8,
                   logs=[(0.0, format_progress("resume", step=10)), (0.2, format_progress("checkpoint", step=20))])
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend)
    run = SilenceRun(fake_api, store, thread, lines, result)
    try:
        assert cluster.run_until(lambda: len(run.pods("sil-a0")) == 2 and any("checkpoint" in ln for ln in run.lines))
        yield run
    finally:
        backend.close()


@pytest.mark.fake_api(scale=0.1)
def test_sim_silent_node_is_lost_before_kubernetes_notices_and_survivors_get_a_short_grace(silence_run, fake_api):
    by_index = silence_run.by_index()
    dead, rank0 = by_index["1"]["spec"]["nodeName"], by_index["0"]
    fake_api.cluster.kill_node(dead)
    # rank 0's reader, SUSPECT_S after the last beat, then again REPORT_S later
    for silent in (3.0, 5.0):
        silence_run.append_log(rank0, format_progress("node_silent", group_rank=1, host=dead, silent_s=silent))
    silence_run.finish()

    silence_run.assert_resumed_without(dead)
    # the survivor went with a short grace period, the dead node's pod at once
    deletes = {r["path"].rsplit("/", 1)[-1]:
               (r["body"] or {}).get("gracePeriodSeconds", r["query"].get("gracePeriodSeconds"))
               for r in fake_api.api.sent("DELETE", "/pods/") if "sil-a0" in r["path"]}
    grace = {i: deletes.get(p["metadata"]["name"]) for i, p in by_index.items()}
    assert {i: None if g is None else int(g) for i, g in grace.items()} == {"0": DEAD_PEER_GRACE_S, "1": 0}, deletes


@pytest.mark.fake_api(scale=0.1)
def test_sim_rank0s_node_dies_and_its_witness_on_pod_1_reports_it(silence_run, fake_api):
    """Pod 0's machine (global rank 0, the store's host) dies: nothing more comes from its log.
    Pod 1's runtime, the witness, reports group rank 0 silent on pod 1's log; the supervisor
    declares pod 0's node lost from that alone, before Kubernetes calls it Unknown."""
    by_index = silence_run.by_index()
    dead, witness = by_index["0"]["spec"]["nodeName"], by_index["1"]
    fake_api.cluster.kill_node(dead)
    for silent in (3.0, 5.0):
        silence_run.append_log(witness, format_progress("node_silent", group_rank=0, host=dead, silent_s=silent,
                                                        witness=1))
    silence_run.finish()

    silence_run.assert_resumed_without(dead)
