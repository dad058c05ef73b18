"""Simulation: an attempt's end waits for rank 0's last lines (podlogs.PodLogs.hold_end).

The pod watch and rank 0's followed log are separate streams. A short attempt can have every pod
seen ended before its log follower has read the terminated container's log: a slow kubelet behind
pods/log (the API server proxies the request to it), a loaded watcher. The supervisor judged the
attempt on the pods alone and lost its last lines: the `resume` line of a resumed attempt, its
last checkpoint, or the `preempted` line that makes torchrun's exit 1 on SIGTERM a preemption.
(Found while chasing the edit-role supervisor sim's CI flake, whose own cause was the fake's:
test_fakeapi_contract.py test_sim_a_job_is_stored_with_its_selector_and_template_labels_from_the_first.)
Here the fake API server answers pod 0's first log request late (faults.delay_next), after the
container has ended, so the race is lost every time without the hold.
"""

from __future__ import annotations

import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView

from .simhelpers import run_supervisor

pytestmark = pytest.mark.timeout(90)

# the follower's first read of pod 0's log is answered this late: well after the 0.3 s container
SLOW_KUBELET_S = 3.0


def progress(event: str, step: int, **more: object) -> str:
    extra = "".join(f',"{k}":"{v}"' for k, v in more.items())
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}{extra}}}'


def _run(fake_api, tmp_path, monkeypatch, name: str, *, nodes: int, exit_code: int, logs: list[tuple[float, str]]):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": name, "nodes": nodes, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 1, "backoff": "0s", "heartbeat_timeout": "60s"},
    })
    cluster = fake_api.cluster
    cluster.script(job=f"{name}-a0", run_seconds=0.2, exit_code=exit_code)
    cluster.script(job=f"{name}-a0", index=0, run_seconds=0.3, exit_code=exit_code, logs=logs)
    slow = fake_api.faults.delay_next(1, seconds=SLOW_KUBELET_S, verb="GET", path=rf"/pods/{name}-a0-0-[^/]+/log$")
    cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path=f"{name}.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=False)
    lines: list[str] = []
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(poll_interval=0.02))
    thread, result = run_supervisor(sup)
    try:
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    assert slow.fired == 1, lines       # the follower's first read of pod 0's log was the slow one
    return result["outcome"], store.load().attempts[0], lines


def test_sim_a_short_attempt_ends_after_rank0s_last_lines(fake_api, tmp_path, monkeypatch):
    """Rank 0 checkpoints and completes in 0.3 s; its log is served 3 s later. The attempt's end
    waits for the lines: its last checkpoint and step are recorded."""
    outcome, a0, lines = _run(fake_api, tmp_path, monkeypatch, "drain", nodes=2, exit_code=0, logs=[
        (0.0, progress("start", 0)), (0.1, progress("checkpoint", 10)), (0.2, progress("step", 12)),
        (0.25, 'WMCTL-PROGRESS {"event":"exit","status":"completed","step":12}')])
    assert outcome.exit_code == 0, outcome.report
    assert (a0.outcome, a0.last_checkpoint_step, a0.last_step) == ("succeeded", 10, 12), lines


def test_sim_a_preempted_line_read_late_still_makes_exit_1_a_preemption(fake_api, tmp_path, monkeypatch):
    """torchrun exits 1 after SIGTERM; rank 0's `preempted` line before it says the stop was the
    graceful, checkpointed one. Read late, the exit alone judged the attempt an app_error (one
    node: no other node's exit 1 comes first)."""
    outcome, a0, lines = _run(fake_api, tmp_path, monkeypatch, "drainp", nodes=1, exit_code=1, logs=[
        (0.0, progress("start", 0)), (0.1, progress("checkpoint", 10)), (0.2, progress("preempted", 10))])
    assert (a0.outcome, a0.last_checkpoint_step) == ("preempted", 10), (a0.evidence, lines)
