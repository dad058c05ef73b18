"""Fault matrix on the Docker backend: the real `wmctl build-image` makes the job's image, the
real `wmctl submit --backend docker --auto-resume` runs it as two containers (2 nodes x 1 rank,
gloo, c10d rendezvous on node 0) on the real engine, and faults are injected with the Docker
client: kill, pause, stop, a memory limit.

The job is tests/integration/jobs/counter.py, the same deterministic torchrun job the local fault
matrix uses; checkpoints go to a host_path bind so the host can read them. Every run that
completes is compared bit for bit (float.hex of the all-reduced state) with an uninterrupted run
of the same image, and each test prints how many steps were redone.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import docker.errors
import pytest
import yaml

from orchestrator import labels as L
from orchestrator.runtime.protocol import parse_progress
from tests.integration import harness as h

from .conftest import SWEPT_RUNS, pause, run_wmctl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(360),
              pytest.mark.xdist_group(f"{SWEPT_RUNS}-docker-faults"),
              pytest.mark.usefixtures("_no_stale_runs")]
RUN_PREFIX = "dkf-"     # this module's runs: the only ones its _no_stale_runs sweeps


def write_spec(home: Path, name: str, image: str, *, steps: int = 40, every: int = 5, sleep: float = 0.1,
               job_args: list[str] | None = None, restart: dict | None = None,
               resources: dict | None = None, nodes: int = 2) -> Path:
    ckpt = home / f"ckpt-{name}"
    ckpt.mkdir()
    spec = {
        "name": name, "nodes": nodes, "nproc_per_node": 1, "affinity": "none",
        "image": {"vendor": "cpu", "tag": image},
        "resources": {"shm": "256Mi", **(resources or {})},
        "volumes": [{"name": "ckpt", "mount": "/workspace/ckpt", "host_path": str(ckpt)}],
        "command": ["python", "counter.py", "--steps", str(steps), "--every", str(every), "--sleep", str(sleep),
                    *(job_args or [])],
        "checkpoint": {"dir": "/workspace/ckpt", "every_steps": every},
        # The heartbeat counts from a node's start (container, torch import): 30 s was lost on a
        # loaded 2-core machine with xdist workers (seen: "hang: no progress line for 30 s" on both
        # attempts of dkf-reference). The test of a hang sets its own.
        "restart": {"max_attempts": 4, "backoff": "0s", "heartbeat_timeout": "120s", **(restart or {})},
        "rendezvous": {"join_timeout": "60s"},
    }
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def watch(spec: Path, home: Path) -> h.Watch:
    return h.Watch(spec, home, "--backend", "docker")


def run_root(home: Path, run: str) -> Path:
    """The run's own checkpoint folder on the host: <host_path>/<run>, as the launcher scopes it."""
    return home / f"ckpt-{run}" / run


def final_state(home: Path, run: str) -> str:
    return (run_root(home, run) / "final.txt").read_text()


def container(client, run: str, attempt: int, node: int):
    return client.containers.get(f"{run}-a{attempt}-{node}")


def progress(client, run: str, attempt: int) -> list[dict]:
    """Progress lines of a live attempt, from rank 0's container log."""
    try:
        text = container(client, run, attempt, 0).logs().decode(errors="replace")
    except docker.errors.NotFound:
        return []
    return [p for p in map(parse_progress, text.splitlines()) if p]


def wait_progress(client, run: str, attempt: int, event: str, step: int = 0, timeout: float = 150) -> None:
    h.wait_until(lambda: any(p["event"] == event and p.get("step", 0) >= step
                             for p in progress(client, run, attempt)),
                 timeout, f"{event} >= {step} in attempt {attempt}", every=0.5)    # a Docker API call


def leftovers(client, run: str) -> list[str]:
    found = client.containers.list(all=True, filters={"label": [f"{L.RUN}={run}"]}, ignore_removed=True)
    return [c.name for c in found]


def redone(home: Path, run: str) -> list[int]:
    rec = h.record(home, run)
    out = [(prev["last_step"] or 0) - (nxt["resumed_from_step"] or 0)
           for prev, nxt in itertools.pairwise(rec["attempts"])]
    print(f"{run}: steps redone per failure {out}")
    return out


@pytest.fixture(scope="module")
def reference() -> str:
    """An uninterrupted run's final state, computed (harness.counter_state: 40 steps on 2 ranks,
    the spec's default): every faulted run below must end bit-identical to it."""
    return h.counter_state(40)


def new_checkpoint(client, run: str, attempt: int, timeout: float = 150) -> None:
    """Wait for attempt ``attempt`` to commit a checkpoint past the step it resumed from."""
    def done() -> bool:
        events = progress(client, run, attempt)
        start = next((e["step"] for e in events if e["event"] == "resume"), 0)
        return any(e["event"] == "checkpoint" and e["step"] > start for e in events)
    h.wait_until(done, timeout, f"a new checkpoint in attempt {attempt}", every=0.5)    # a Docker API call


def stop_training(client, run: str, attempt: int, node: int) -> None:
    """SIGSTOP the training process of ``node`` only: its container and torchrun agent look healthy."""
    import os
    import signal

    top = container(client, run, attempt, node).top(ps_args="-eo pid,args")
    pid_at = top["Titles"].index("PID")
    workers = [int(p[pid_at]) for p in top["Processes"]
               if "counter.py" in p[-1] and "torchrun" not in p[-1] and "torch.distributed.run" not in p[-1]]
    assert workers, top
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)           # the host sees the container's processes


@pytest.mark.timeout(600)
def test_docker_node_faults_one_per_attempt_each_resumed_and_the_run_matches_uninterrupted(
        docker_client, image, home):
    """One run, one fault per attempt, each after that attempt committed a checkpoint of its own
    (every fault pays for its own attempt, none for a fresh run up to its checkpoint):

      attempt 0  the watcher is SIGKILLed; the containers run on without it and a second watcher
                 (`wmctl watch`) takes the attempt over without submitting another; then node 1's
                 container is killed (`docker kill`)
      attempt 1  node 0's container is killed: the rendezvous host, global rank 0
      attempt 2  node 1's container is paused (`docker pause`): a hang, seen at once in the
                 container's state, torn down and resumed
      attempt 3  rank 0's training process stops (SIGSTOP: a hung host whose container and agent
                 look healthy). Rank 0 was the beat's reader, so group rank 1's witness
                 (runtime/liveness.py) reports it on node 1's output, which the backend follows for
                 that alone: node 0 is lost after restart.node_silence_timeout (5 s), not after the
                 10-minute heartbeat_timeout
      attempt 4  runs to the end, bit-identical to an uninterrupted run (computed)."""
    run = "dkf-chain"
    spec = write_spec(home, run, image, steps=120, job_args=["--beat"],
                      restart={"max_attempts": 6, "heartbeat_timeout": "10m", "node_silence_timeout": "5s"})
    w = watch(spec, home)
    wait_progress(docker_client, run, 0, "checkpoint", 5)
    w.kill()                                     # the containers keep running without their watcher
    w = h.Watch(spec, home, run, command="watch")
    new_checkpoint(docker_client, run, 0)
    wait_progress(docker_client, run, 0, "step", 12)
    container(docker_client, run, 0, 1).kill()
    new_checkpoint(docker_client, run, 1)
    container(docker_client, run, 1, 0).kill()
    new_checkpoint(docker_client, run, 2)
    pause(container(docker_client, run, 2, 1))
    new_checkpoint(docker_client, run, 3)
    stop_training(docker_client, run, 3, 0)
    assert w.wait(420) == 0, w.output
    rec = h.record(home, run)
    assert [(a["outcome"], a["failed_node"]) for a in rec["attempts"]] == \
        [("node_lost", 1), ("node_lost", 0), ("hang", 1), ("node_lost", 0), ("succeeded", None)], rec["final_report"]
    assert "paused" in rec["attempts"][2]["evidence"]
    assert "no liveness beat" in rec["attempts"][3]["evidence"], rec["attempts"][3]["evidence"]
    for prev, nxt in itertools.pairwise(rec["attempts"]):       # each from the checkpoint its fault followed
        assert nxt["resumed_from_step"] > (prev["resumed_from_step"] or 0), rec["attempts"]
    assert final_state(home, run) == h.counter_state(120)
    assert not leftovers(docker_client, run)
    # a checkpoint interval, plus the steps taken while the fault was seen and torn down
    assert max(redone(home, run)[:2]) <= 5 + 3


def test_docker_kill_during_checkpoint_write_resumes_from_the_previous_one(docker_client, image, home):
    """One node: the torn checkpoint is the checkpoint manager's and the watcher's business."""
    run = "dkf-torn"
    w = watch(write_spec(home, run, image, nodes=1, every=10, job_args=["--slow-commit", "4"]), home)
    wait_progress(docker_client, run, 0, "checkpoint", 10)
    # Step 20's save sleeps between the rank files and COMMITTED: kill rank 0's node inside it.
    h.wait_until(lambda: (run_root(home, run) / "step-00000020").exists(), 90, "step 20 write")
    container(docker_client, run, 0, 0).kill()
    assert w.wait(300) == 0, w.output
    rec = h.record(home, run)
    assert rec["attempts"][1]["resumed_from_step"] == 10
    assert final_state(home, run) == h.counter_state(40, world=1)
    redone(home, run)


def test_docker_stop_is_graceful_and_loses_no_step(docker_client, image, home, reference):
    """Both nodes stopped, as a host's shutdown or a scheduler's preemption does: the ranks agree
    on the step to stop at, save it, and the next attempt loses none."""
    run = "dkf-stop"
    w = watch(write_spec(home, run, image, every=1000), home)   # no periodic checkpoint: only SIGTERM's
    wait_progress(docker_client, run, 0, "step", 12)
    for node in (0, 1):
        container(docker_client, run, 0, node).stop(timeout=60)
    assert w.wait(300) == 0, w.output
    rec = h.record(home, run)
    assert rec["attempts"][0]["outcome"] == "preempted", rec["final_report"]
    assert redone(home, run) == [0]
    assert final_state(home, run) == reference


def test_docker_app_error_is_reported_as_the_apps_and_not_retried(docker_client, image, home):
    run = "dkf-apperror"
    w = watch(write_spec(home, run, image, nodes=1, job_args=["--fail-at", "7"]), home)
    assert w.wait(300) == 7, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["app_error"], rec["final_report"]
    assert "not retried" in rec["final_report"]
    assert not leftovers(docker_client, run)
    # The containers are gone, but why the attempt failed is not: teardown kept their logs.
    logs = run_wmctl("logs", run, "--node", "0", cwd=home, env={"WMCTL_HOME": str(home)})
    assert logs.returncode == 0, logs.stderr
    assert "injected application error" in logs.stdout


def test_docker_a_missing_image_is_refused_before_the_run_is_recorded(docker_client, home):
    """Refused with "nothing was submitted": and nothing is recorded, so `list` has no such run and
    the corrected spec is submitted under the same name (a kept failed record blocked it)."""
    run = "dkf-noimage"
    spec = write_spec(home, run, "wmctl-test/absent:never")
    env = {"WMCTL_HOME": str(home)}
    refused = run_wmctl("submit", str(spec), "--backend", "docker", cwd=home, env=env)
    assert refused.returncode == 4, refused.stderr
    assert "is not on this Docker host" in refused.stderr and "Traceback" not in refused.stderr
    listed = run_wmctl("list", "-o", "json", cwd=home, env=env)
    assert listed.returncode == 0 and run not in listed.stdout, listed.stdout + listed.stderr
    again = run_wmctl("submit", str(spec), "--backend", "docker", "--dry-run", cwd=home, env=env)
    assert again.returncode == 0, again.stderr
    assert not (home / "runs" / run).exists()


def test_docker_resubmitting_a_finished_run_runs_it_again(docker_client, image, home):
    """A finished run's name is refused without --replace; with it the new attempt 0 must run,
    not adopt the old one, and the old run's record is gone (no hidden archive)."""
    run = "dkf-again"
    spec = write_spec(home, run, image, nodes=1, steps=6, every=3)
    assert watch(spec, home).wait(300) == 0
    assert (run_root(home, run) / "final.txt").exists()
    first = h.record(home, run)["created_at"]
    refused = run_wmctl("submit", str(spec), "--backend", "docker", cwd=home, env={"WMCTL_HOME": str(home)})
    assert refused.returncode == 4 and "--replace" in refused.stderr, refused.stderr
    assert h.record(home, run)["created_at"] == first, "a refused submit touched the record"
    shutil.rmtree(home / f"ckpt-{run}")
    (home / f"ckpt-{run}").mkdir()
    again = h.Watch(spec, home, "--backend", "docker", "--replace")
    assert again.wait(300) == 0, again.output
    assert (run_root(home, run) / "final.txt").exists(), again.output
    rec = h.record(home, run)
    assert rec["created_at"] != first and [a["outcome"] for a in rec["attempts"]] == ["succeeded"]
    assert not (home / "runs" / ".archive").exists()
    assert not leftovers(docker_client, run)


def test_docker_memory_limit_is_reported_as_oom_and_not_retried(docker_client, image, home):
    run = "dkf-oom"
    w = watch(write_spec(home, run, image, nodes=1, resources={"memory": "768Mi"}, job_args=["--alloc-mb", "2048"]),
              home)
    assert w.wait(300) == 7, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["oom"], rec["final_report"]
    assert "not retried" in rec["final_report"]
    assert not leftovers(docker_client, run)
