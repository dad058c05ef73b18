"""The run lifecycle on a real Docker engine: cancel in every phase with the watcher in another
process, a graceful cancel, runs nobody watches (status from the containers), a detached
watcher, and a program missing from the image caught before anything is created.

Each test asserts the final state, the exit codes, that no attempt was submitted twice and that
no container or network of the run is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from orchestrator import labels as L
from tests.integration import harness as h

from .conftest import SWEPT_RUNS, run_wmctl
from .test_docker_faults import leftovers, wait_progress, write_spec

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(360),
              pytest.mark.xdist_group(f"{SWEPT_RUNS}-docker-lifecycle"),
              pytest.mark.usefixtures("_no_stale_runs")]
RUN_PREFIX = "dkl-"     # this module's runs: the only ones its _no_stale_runs sweeps


def wmctl(home, *args, timeout=300):
    return run_wmctl(*args, cwd=home, env={"WMCTL_HOME": str(home)}, timeout=timeout)


def docker_watch(spec, home, pause=None):
    if pause:
        os.environ["WMCTL_TEST_PAUSE_AT"] = pause
    try:
        return h.Watch(spec, home, "--backend", "docker")
    finally:
        os.environ.pop("WMCTL_TEST_PAUSE_AT", None)


def attempts(home, run):
    numbers = [a["attempt"] for a in h.record(home, run)["attempts"]]
    assert len(numbers) == len(set(numbers)), numbers
    return numbers


def containers(client, run):
    return client.containers.list(all=True, filters={"label": [f"{L.RUN}={run}"]}, ignore_removed=True)


def cancel_while_held(home, run, phase):
    marker = h.run_folder(home, run) / f"pause-{phase}"
    h.wait_until(marker.exists, 180, f"the watcher to reach {phase}")
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "cancel", run], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(home))
    h.wait_until((h.run_folder(home, run) / "cancel.json").exists, 60, "the cancel intent")
    marker.unlink()
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out


def assert_cancelled(client, home, run, w, expected):
    assert w.wait(timeout=240) == 8, w.output
    rec = h.record(home, run)
    assert rec["status"] == "cancelled", rec["final_report"]
    assert attempts(home, run) == expected
    assert not leftovers(client, run)
    assert not client.networks.list(filters={"label": [f"{L.RUN}={run}"]})


def test_docker_cancel_while_submitting_creates_nothing(docker_client, image, home):
    run = "dkl-submitting"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400), home, pause="submitting")
    cancel_while_held(home, run, "submitting")
    assert_cancelled(docker_client, home, run, w, [0])
    assert "not submitted: the run was cancelled" in w.output


def test_docker_cancel_while_starting_removes_the_containers(docker_client, image, home):
    run = "dkl-starting"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400), home, pause="starting")
    cancel_while_held(home, run, "starting")
    assert_cancelled(docker_client, home, run, w, [0])


def test_docker_cancel_during_the_backoff_wait_submits_nothing_more(docker_client, image, home):
    run = "dkl-backoff"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400, restart={"backoff": "90s"}), home)
    wait_progress(docker_client, run, 0, "checkpoint", 5)
    docker_client.containers.get(f"{run}-a0-0").kill()
    h.wait_until(lambda: "backing off 90 s" in w.output, 120, "the backoff")
    started = time.monotonic()
    cancel = wmctl(home, "cancel", run)
    assert cancel.returncode == 0, cancel.stderr
    assert_cancelled(docker_client, home, run, w, [0])
    assert time.monotonic() - started < 60
    assert h.record(home, run)["attempts"][0]["outcome"] == "node_lost"


def test_docker_cancel_during_the_teardown_of_a_failed_attempt_submits_nothing_more(docker_client, image, home):
    run = "dkl-teardown"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400), home, pause="teardown")
    wait_progress(docker_client, run, 0, "checkpoint", 5)
    docker_client.containers.get(f"{run}-a0-0").kill()
    cancel_while_held(home, run, "teardown")
    assert_cancelled(docker_client, home, run, w, [0])
    assert h.record(home, run)["attempts"][0]["outcome"] == "node_lost"


def test_docker_a_second_watcher_is_refused_naming_the_first(docker_client, image, home):
    run = "dkl-two"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400), home)
    wait_progress(docker_client, run, 0, "step", 1)
    second = wmctl(home, "watch", run, "--auto-resume")
    assert second.returncode == 4 and f"watched by {w.proc.pid}@" in second.stderr, second.stderr
    assert wmctl(home, "cancel", run).returncode == 0
    assert_cancelled(docker_client, home, run, w, [0])


def test_docker_graceful_cancel_keeps_the_sigterm_checkpoint(docker_client, image, home):
    run = "dkl-graceful"
    w = docker_watch(write_spec(home, run, image, nodes=1, steps=400, every=1000), home)
    wait_progress(docker_client, run, 0, "step", 3)
    cancel = wmctl(home, "cancel", run, "--graceful")
    assert cancel.returncode == 0, cancel.stderr
    assert_cancelled(docker_client, home, run, w, [0])
    rec = h.record(home, run)
    assert "gracefully" in rec["final_report"] and "newest checkpoint is step" in rec["final_report"]


def assert_unwatched_status(home, run: str, expected: str, outcome: str | None) -> None:
    """What `wmctl status` and `wmctl list` say of a run nobody watches, once it is ``expected``."""
    h.wait_until(lambda: json.loads(wmctl(home, "status", run, "-o", "json").stdout)["status"] == expected,
                 180, f"status {expected}", every=1.0)     # a wmctl process each look
    status = wmctl(home, "status", run)
    assert "None" not in status.stdout and "watcher: unwatched" in status.stdout
    data = json.loads(wmctl(home, "status", run, "-o", "json").stdout)
    assert data["attempts"][0]["outcome"] == outcome, data["final_report"]
    row = next(line.split() for line in wmctl(home, "list").stdout.splitlines() if line.startswith(run + " "))
    assert row[:3] == [run, "docker", expected]
    assert attempts(home, run) == [0]


# One run passes through running, then cancelled.
@pytest.mark.parametrize("outcome", ["succeeded", "app_error", "killed", "running-then-cancelled"])
def test_docker_status_of_a_run_nobody_watches_is_the_truth(docker_client, image, home, outcome):
    run = f"dkl-unwatched-{outcome.replace('_', '-')}"
    cases: dict[str, dict[str, Any]] = {
        "succeeded": {"steps": 6}, "app_error": {"steps": 400, "job_args": ["--fail-at", "3"]},
        "killed": {"steps": 400}, "running-then-cancelled": {"steps": 4000}}
    # app_error on 2 nodes: the peer's end must not be read as the cause
    spec = write_spec(home, run, image, nodes=2 if outcome == "app_error" else 1, **cases[outcome])
    sub = wmctl(home, "submit", str(spec), "--backend", "docker")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert f"nothing will resume {run}" in sub.stdout
    if outcome in ("killed", "running-then-cancelled"):
        wait_progress(docker_client, run, 0, "step", 1)
    if outcome == "killed":
        docker_client.containers.get(f"{run}-a0-0").kill()
        assert_unwatched_status(home, run, "failed", "node_lost")
    elif outcome == "running-then-cancelled":
        assert_unwatched_status(home, run, "running", None)
        assert wmctl(home, "cancel", run).returncode == 0
        assert_unwatched_status(home, run, "cancelled", "cancelled")
    else:
        assert_unwatched_status(home, run, {"succeeded": "succeeded", "app_error": "failed"}[outcome],
                                outcome)
    if outcome in ("killed", "app_error"):
        assert wmctl(home, "cancel", run).returncode == 0
    h.wait_until(lambda: not [c for c in containers(docker_client, run) if c.status == "running"], 60,
                 "no running container")


def test_docker_detached_watcher_resumes_a_killed_node(docker_client, image, home):
    run = "dkl-detached"
    spec = write_spec(home, run, image, steps=60)
    sub = wmctl(home, "submit", str(spec), "--backend", "docker", "--detach", "--auto-resume")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert "watcher: watched by " in wmctl(home, "status", run).stdout
    wait_progress(docker_client, run, 0, "checkpoint", 5)
    docker_client.containers.get(f"{run}-a0-1").kill()
    h.wait_until(lambda: h.record(home, run)["status"] == "succeeded", 300, "the detached watcher to finish")
    assert attempts(home, run) == [0, 1]
    log = wmctl(home, "logs", run, "--watcher")
    assert "attempt 0 failed: node_lost" in log.stdout and f"run {run} succeeded on attempt 1" in log.stdout
    h.wait_until(lambda: not wmctl(home, "status", run).stdout.count("watched by"), 30, "the watcher to end",
                 every=1.0)


def test_docker_a_program_missing_from_the_image_is_caught_before_submit(docker_client, image, home):
    run = "dkl-noprogram"
    spec = write_spec(home, run, image)
    data = yaml.safe_load(spec.read_text())
    data["command"][0] = "pythonx"
    spec.write_text(yaml.safe_dump(data))
    sub = wmctl(home, "submit", str(spec), "--backend", "docker", "--auto-resume")
    assert sub.returncode == 2, sub.stdout + sub.stderr
    assert "command[0]: 'pythonx' is not found in image" in sub.stderr and "Traceback" not in sub.stderr
    assert not containers(docker_client, run), "an attempt was half-submitted"
    rec = h.record(home, run)
    assert rec["status"] == "failed" and rec["attempts"][0]["outcome"] == "not_submitted"


def job_spec(home, run, image, job, *, steps, sleep, restart=None, ckpt=None):
    """write_spec's run with another job of the image (plain.py: no runtime; tiny.py: the
    runtime's CheckpointManager), optionally on a shared host checkpoint folder."""
    spec = write_spec(home, run, image, steps=steps, sleep=sleep, restart=restart)
    data = yaml.safe_load(spec.read_text())
    data["command"][1] = job
    if ckpt is not None:
        ckpt.mkdir(exist_ok=True)
        data["volumes"][0]["host_path"] = str(ckpt)
    spec.write_text(yaml.safe_dump(data))
    return spec


def test_docker_a_script_without_the_runtime_lives_on_its_own_lines(docker_client, image, home):
    """plain.py prints a line a second for 45 s, never a progress line; heartbeat_timeout is 20 s
    (a container's torchrun start on a loaded 2-core machine took over 8 s in CI): its own output is its
    heartbeat, and its lines reach the watch output. Its `--n 200000` reaches it intact: torchrun's
    argparse took it for an ambiguous abbreviation of its own flags before the line had `--`."""
    run = "dkl-plain"
    # 45 lines a second apart against a 20 s heartbeat: longer than the heartbeat, so only its
    # output keeps it alive; 20 s covers a container's torchrun start on a loaded CI machine
    # (8 s did not: a start under four workers took longer, read as a hang).
    spec = job_spec(home, run, image, "plain.py", steps=45, sleep=1.0, restart={"heartbeat_timeout": "20s"})
    data = yaml.safe_load(spec.read_text())
    data["command"] += ["--n", "200000"]
    spec.write_text(yaml.safe_dump(data))
    w = docker_watch(spec, home)
    assert w.wait(timeout=240) == 0, w.output
    assert attempts(home, run) == [0] and h.record(home, run)["status"] == "succeeded"
    assert "| my own log: step" in w.output
    logs = run_wmctl("logs", run, cwd=home, env={"WMCTL_HOME": str(home)})
    assert "my own args: --n 200000" in logs.stdout, logs.stdout + logs.stderr


def test_docker_a_silent_script_is_a_hang(docker_client, image, home):
    """The same script silent for 20 s (its first line comes after --sleep): a hang at 4 s."""
    run = "dkl-silent"
    spec = job_spec(home, run, image, "plain.py", steps=2, sleep=20.0,
                    restart={"heartbeat_timeout": "4s", "max_attempts": 1})
    w = docker_watch(spec, home)
    assert w.wait(timeout=240) == 7, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["hang"], rec["final_report"]
    assert not leftovers(docker_client, run)


def test_docker_runs_sharing_a_checkpoint_volume_keep_to_their_own_unless_one_resumes_another(
        docker_client, image, home):
    """Two runs at once on one host_path volume keep to their own subfolders; a third resumes
    from one of them on purpose (--resume-from), leaving its files untouched."""
    shared = home / "dkl-shared-ckpt"
    runs = ("dkl-sweep-a", "dkl-sweep-b")
    watchers = [docker_watch(job_spec(home, run, image, "tiny.py", steps=10, sleep=0.05, ckpt=shared), home)
                for run in runs]
    for w in watchers:
        assert w.wait(timeout=300) == 0, w.output
    for run in runs:
        final = json.loads((shared / run / "final.json").read_text())
        assert final["run"] == run and final["steps"] == 10
        assert json.loads((shared / run / "step-00000010" / "COMMITTED").read_text())["run"] == run
        assert attempts(home, run) == [0]
    assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == sorted(runs)
    before = {p.name: p.stat().st_mtime_ns for p in (shared / "dkl-sweep-a").iterdir()}
    spec = job_spec(home, "dkl-finetune", image, "tiny.py", steps=15, sleep=0.05, ckpt=shared)
    ft = wmctl(home, "submit", str(spec), "--backend", "docker", "--resume-from", "dkl-sweep-a", "--auto-resume")
    assert ft.returncode == 0, ft.stdout + ft.stderr
    assert "resumed from step 10" in ft.stdout, ft.stdout
    assert json.loads((shared / "dkl-finetune" / "final.json").read_text())["steps"] == 15
    assert {p.name: p.stat().st_mtime_ns for p in (shared / "dkl-sweep-a").iterdir()} == before
