"""Cold image pulls and failed pulls (issue 23 item 3), against the fake cluster: its torchrun
agent waits at the rendezvous for every pod of its Job and gives up after the timeouts on its
own command line (fakeapi/agent.py); its kubelet reports a failed pull with the runtime's words.

On main the pod that started first gave up the rendezvous while its peer still pulled (the
attempt a `rendezvous` failure, then "no new checkpoint"), and a pull that never succeeded
(a registry's 429 for ever) was waited on for ever."""

from __future__ import annotations

import re

import pytest
from .sdk import client

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import RunNotFound
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView

from .simhelpers import run_supervisor

pytestmark = pytest.mark.timeout(90)
IMAGE = "registry.example.com/wm:v3"


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


def _spec(name: str, **restart):
    return from_dict({
        "name": name, "nodes": 2, "image": {"vendor": "cpu", "tag": IMAGE},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "rendezvous": {"join_timeout": "2m"},
        "restart": {"max_attempts": 3, "backoff": "0s", **restart},
    })


def _supervise(spec, fake_api, lines):
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="p.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    return backend, store, sup


def test_sim_the_rendezvous_waits_out_a_peers_cold_pull_longer_than_join_timeout(fake_api, tmp_path, monkeypatch):
    """Node 1 pulls its image for 5 (Kubernetes) minutes, node 0 runs at once; join_timeout is
    2m. The agents' rendezvous waits (image_pull_timeout more) and the attempt completes."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("cold")
    cluster = fake_api.cluster
    cluster.script(job="cold-a0", rendezvous=True, run_seconds=0.3, logs=[(0.1, progress("checkpoint", 10))])
    cluster.script(job="cold-a0", index=1, rendezvous=True, run_seconds=0.3, start_delay=cluster.timings.real(300))
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    thread, result = run_supervisor(sup)
    notes: list[str] = []

    def noted() -> bool:          # `wmctl status` and the panel read the attempt's evidence while it waits
        try:
            attempts = store.load().attempts
        except RunNotFound:
            return False        # not saved yet
        if attempts and attempts[0].evidence:
            notes.append(attempts[0].evidence)
        return any(re.fullmatch(r"starting \(pulling the image or creating the container\): node 1 on node-\w+ "
                                r"for \d+s of restart.image_pull_timeout 30m00s", n) for n in notes)
    try:
        assert cluster.run_until(noted, timeout=60), (notes, lines)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    outcome = result["outcome"]
    attempts = store.load().attempts
    assert not (attempts[0].evidence or "").startswith("starting")     # cleared once every node ran
    assert outcome.exit_code == 0, outcome.report
    assert len(attempts) == 1, [(a.outcome, a.evidence) for a in attempts]
    assert not any(w == "rendezvous_timeout" for _, w, _ in cluster.timeline)


def test_sim_a_pull_that_never_succeeds_stops_after_image_pull_timeout_with_its_cause(fake_api, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("never", image_pull_timeout="2s")
    cluster = fake_api.cluster
    cluster.rate_limited_images[IMAGE] = 3600.0          # the registry's 429, for an hour
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    thread, result = run_supervisor(sup)
    try:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the watcher waited on a pull that never succeeds"
    finally:
        backend.close()
    (a0,) = store.load().attempts
    assert result["outcome"].exit_code != 0
    assert (a0.outcome, a0.decision) == ("image_pull", "stop"), a0.evidence
    assert "429 Too Many Requests" in a0.evidence and "image_pull_timeout" in a0.evidence
    assert any("node_waiting" in line and "429" in line for line in lines)     # said while it waited


@pytest.mark.parametrize("cause,outcome,decision", [
    ("failed to resolve reference: tls: failed to verify certificate: x509: certificate signed by unknown "
     "authority", "image_pull", "stop"),
    ("failed to extract layer sha256:ab: write /var/lib/containerd/io.containerd.content.v1.content/ingest/ab/"
     "data: no space left on device", "node_lost", "retry_elsewhere"),
])
def test_sim_a_failed_pull_says_why(fake_api, tmp_path, monkeypatch, cause, outcome, decision):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = _spec("pullerr", max_attempts=1)
    cluster = fake_api.cluster
    cluster.pull_failures[IMAGE] = cause
    cluster.start()
    lines: list[str] = []
    backend, store, sup = _supervise(spec, fake_api, lines)
    try:
        sup.run()
    finally:
        backend.close()
    (a0,) = store.load().attempts
    assert (a0.outcome, a0.decision) == (outcome, decision), a0.evidence
    assert cause.rsplit(": ", 1)[-1] in a0.evidence


# --- the fake's contract ------------------------------------------------------------------------

def _job_pod(name: str, idx: int, conf: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{idx}", "labels": {"job-name": name,
                                                              "batch.kubernetes.io/job-completion-index": str(idx)}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "command": ["torchrun", "--nnodes=2", f"--rdzv-conf={conf}", "--", "x"]}]}}


def test_sim_fake_agent_gives_up_after_its_read_timeout_with_torchruns_traceback(fake_api):
    """agent.py: a non-store agent waits read_timeout (scaled) for its peers, then exits 1 with a
    RendezvousConnectionError traceback; the store host's agent waits join_timeout."""
    from orchestrator import failures as F

    core = client.CoreV1Api(fake_api.client)
    cluster = fake_api.cluster
    cluster.script(job="rj", rendezvous=True, run_seconds=None)
    cluster.script(job="rj", index=0, rendezvous=True, run_seconds=None, start_delay=3600)   # pulls for ever
    core.create_namespaced_pod("default", _job_pod("rj", 0, "join_timeout=600,read_timeout=60"))
    core.create_namespaced_pod("default", _job_pod("rj", 1, "join_timeout=600,read_timeout=60"))
    cluster.start()
    assert cluster.run_until(lambda: core.read_namespaced_pod("rj-1", "default").status.phase == "Failed",
                             timeout=30)
    when = {w: t for t, w, _ in cluster.timeline}
    assert when["rendezvous_timeout"] - when["pod_running"] >= cluster.timings.real(60) * 0.9
    log = core.read_namespaced_pod_log("rj-1", "default").splitlines()
    assert F.rendezvous_failure(log) is not None and "RendezvousConnectionError" in log[-1]
    assert core.read_namespaced_pod("rj-0", "default").status.phase == "Pending"


def test_sim_fake_agent_completes_the_rendezvous_once_every_pod_runs(fake_api):
    core = client.CoreV1Api(fake_api.client)
    cluster = fake_api.cluster
    cluster.script(job="ok", rendezvous=True, run_seconds=0.05)
    cluster.script(job="ok", index=1, rendezvous=True, run_seconds=0.05, start_delay=cluster.timings.real(30))
    for i in (0, 1):
        core.create_namespaced_pod("default", _job_pod("ok", i, "join_timeout=600,read_timeout=60"))
    cluster.start()
    assert cluster.run_until(lambda: all(core.read_namespaced_pod(f"ok-{i}", "default").status.phase == "Succeeded"
                                         for i in (0, 1)), timeout=30)


def test_sim_fake_failed_pull_carries_the_runtimes_words_then_backs_off(fake_api):
    core = client.CoreV1Api(fake_api.client)
    cluster = fake_api.cluster
    cluster.pull_failures["busybox"] = "x509: certificate signed by unknown authority"
    pod = _job_pod("pf", 0, "join_timeout=1")
    pod["spec"]["nodeName"] = "node-a"
    core.create_namespaced_pod("default", pod)
    cluster.tick()
    wait = core.read_namespaced_pod("pf-0", "default").status.container_statuses[0].state.waiting
    assert (wait.reason, wait.message) == (
        "ErrImagePull", 'failed to pull and unpack image "busybox": x509: certificate signed by unknown authority')
    cluster.start()
    assert cluster.run_until(lambda: core.read_namespaced_pod("pf-0", "default").status.container_statuses[0]
                             .state.waiting.reason == "ImagePullBackOff", timeout=10)
