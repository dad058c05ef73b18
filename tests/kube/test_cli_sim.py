"""Simulation through the real command line: `wmctl submit SPEC -b kubernetes --auto-resume` in a
subprocess, finding the fake API server (tests/kube/fakeapi) through a kubeconfig file and
`--context`, exactly as it would find a cluster. No real cluster is involved; Kubernetes
durations are scaled. Then `wmctl status`, `wmctl list` and `wmctl logs` read the run back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


def sim_env(fake_api, tmp_path: Path) -> dict[str, str]:
    """The environment of a wmctl process that finds the fake API through its own kubeconfig,
    with its own WMCTL_HOME under ``tmp_path``."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, fake_api.server.url)
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "WMCTL_HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(REPO)}


def write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "other",
        "clusters": [{"name": "sim", "cluster": {"server": url}},
                     {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "sim", "user": {"token": "sim-token"}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": "training"}},
                     {"name": "other", "context": {"cluster": "nowhere", "user": "sim"}}],
    }))


def test_sim_cli_submit_auto_resume_status_and_logs(fake_api, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "clisim", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"}, "kubernetes": {"namespace": "training"},
    }))
    cluster = fake_api.cluster
    cluster.script(job="clisim-a0", run_seconds=None)
    cluster.script(job="clisim-a0", index=0, run_seconds=None,
                   logs=[(0.0, "torchrun says hello"), (0.05, progress("start", 0)), (0.1, progress("checkpoint", 10))])
    cluster.script(job="clisim-a1", run_seconds=0.6)
    cluster.script(job="clisim-a1", index=0, run_seconds=0.8,
                   logs=[(0.0, progress("resume", 10)), (0.2, progress("checkpoint", 20))])
    cluster.start()

    env = sim_env(fake_api, tmp_path)

    def wmctl(*args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

    watcher = wmctl("submit", str(spec), "-b", "kubernetes", "--context", "sim", "--auto-resume")
    try:
        def running_pods(job):
            return [p for p in fake_api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        assert cluster.run_until(lambda: len(running_pods("clisim-a0")) == 2, timeout=30)
        # the watcher has the checkpoint line (it keeps each progress event in the run's metrics)
        metrics = Path(env["WMCTL_HOME"]) / "runs" / "clisim" / "metrics.jsonl"
        assert cluster.run_until(lambda: metrics.exists() and '"checkpoint"' in metrics.read_text(), timeout=60), \
            "the watcher never saw checkpoint 10"
        dead = next(p["spec"]["nodeName"] for p in running_pods("clisim-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.kill_node(dead)
        out, _ = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, out
    assert "node_lost" in out and f"excluding {dead}" in out and "succeeded on attempt 1" in out, out
    # the objects went where the context's namespace said, with the kubeconfig's token
    assert all(r["path"].startswith("/api/v1/namespaces/training/") or "/namespaces/training/" in r["path"]
               for r in fake_api.api.sent("POST", ""))

    status = wmctl("status", "clisim", "-o", "json").communicate(timeout=30)[0]
    record = json.loads(status)
    assert [a["outcome"] for a in record["attempts"]] == ["node_lost", "succeeded"]
    assert record["attempts"][1]["excluded_nodes"] == [dead]
    listing = wmctl("list").communicate(timeout=30)[0]
    assert "clisim" in listing and "succeeded" in listing
    logs = wmctl("logs", "clisim", "--node", "0", "--raw").communicate(timeout=30)[0]
    assert progress("resume", 10) in logs, logs


def test_sim_cli_detach_then_cancel_deletes_in_the_runs_namespace(fake_api, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "clicancel", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training"},
    }))
    fake_api.cluster.script(job="clicancel-a0", run_seconds=None)
    fake_api.cluster.start()
    env = sim_env(fake_api, tmp_path)

    def wmctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    sub = wmctl("submit", str(spec), "-b", "kubernetes", "--context", "sim", "--detach")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    jobs = lambda: [j["metadata"]["name"] for j in fake_api.store.list("jobs")[0]]  # noqa: E731
    assert jobs() == ["clicancel-a0"]
    cancel = wmctl("cancel", "clicancel")
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert fake_api.cluster.run_until(lambda: not jobs() and not fake_api.store.list("services")[0])
    assert all("/namespaces/training/" in r["path"] for r in fake_api.api.sent("DELETE", ""))
    status = json.loads(wmctl("status", "clicancel", "-o", "json").stdout)
    assert status["status"] == "cancelled" and "cancelled" in status["final_report"]


def test_sim_cancel_annotates_the_job_before_teardown_and_a_watcher_elsewhere_obeys_it(fake_api, tmp_path):
    """`wmctl cancel` writes its intent on the Job (an annotation) before deleting anything; a
    watcher on another machine, which shares no run folder with the canceller, reads the intent
    from the cluster, ends the run cancelled (exit 8) and submits no attempt 1."""
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "clicross", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    }))
    fake_api.cluster.script(job="clicross-a0", run_seconds=None)
    fake_api.cluster.start()
    env = sim_env(fake_api, tmp_path)
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "-b", "kubernetes",
                                "--context", "sim", "--auto-resume"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        jobs = lambda: [j["metadata"]["name"] for j in fake_api.store.list("jobs")[0]]  # noqa: E731
        assert fake_api.cluster.run_until(lambda: jobs() == ["clicross-a0"], timeout=30)
        time.sleep(0.5)
        # Another machine's cancel: the annotation alone (its run folder is not this one).
        from .sdk import client as k8s
        cfg = k8s.Configuration(host=fake_api.server.url)
        cfg.api_key = {"authorization": "Bearer sim-token"}
        k8s.BatchV1Api(k8s.ApiClient(cfg)).patch_namespaced_job(
            "clicross-a0", "training",
            {"metadata": {"annotations": {"wmctl.io/cancel-requested": '{"by": "elsewhere"}'}}})
        out, _ = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 8, out
    assert "cancel requested on the Job" in out and "clicross-a1" not in out
    assert all("clicross-a1" not in r["path"] for r in fake_api.api.sent("POST", ""))
    record = json.loads((tmp_path / "home" / "runs" / "clicross" / "run.json").read_text())
    assert record["status"] == "cancelled" and [a["attempt"] for a in record["attempts"]] == [0]


def test_sim_cli_cancel_patches_the_intent_before_any_delete(fake_api, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "cliorder", "nodes": 1, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training"},
    }))
    fake_api.cluster.script(job="cliorder-a0", run_seconds=None)
    fake_api.cluster.start()
    env = sim_env(fake_api, tmp_path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "orchestrator.cli", *a], env=env, cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    assert run("submit", str(spec), "-b", "kubernetes", "--context", "sim", "--detach").returncode == 0
    assert run("cancel", "cliorder").returncode == 0
    verbs = [(r["verb"], r["path"]) for r in fake_api.api.sent(None, "") if r["verb"] in ("PATCH", "DELETE")]
    patch = next(i for i, (v, p) in enumerate(verbs) if v == "PATCH" and p.endswith("/jobs/cliorder-a0"))
    first_delete = next(i for i, (v, _) in enumerate(verbs) if v == "DELETE")
    assert patch < first_delete, verbs


@pytest.mark.parametrize("outcome", ["succeeded", "app_error", "killed", "cancelled", "running"])
def test_sim_status_of_a_run_nobody_watches_is_read_from_the_cluster(fake_api, tmp_path, outcome):
    """A plain `submit` (no watcher); after the outcome, `status` and `list` ask the cluster."""
    run = f"unw-{outcome.replace('_', '-')}"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": run, "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
    }))
    cluster = fake_api.cluster
    behaviours: dict[str, dict[str, Any]] = {
        "succeeded": {"run_seconds": 0.3}, "app_error": {"run_seconds": 0.3, "exit_code": 1},
        "killed": {"run_seconds": None}, "cancelled": {"run_seconds": None}, "running": {"run_seconds": None}}
    behaviour = behaviours[outcome]
    cluster.script(job=f"{run}-a0", **behaviour)
    first = {**behaviour, "run_seconds": 0.8} if outcome == "app_error" else behaviour   # rank 1 fails first
    cluster.script(job=f"{run}-a0", index=0, logs=[(0.0, progress("start", 0)), (0.05, progress("step", 3))],
                   **first)
    if outcome == "app_error":
        cluster.script(job=f"{run}-a0", index=1, run_seconds=0.3, exit_code=1,
                       logs=[(0.0, "[rank1]: Traceback (most recent call last):"),
                             (0.01, '[rank1]:   File "/workspace/train.py", line 7, in <module>'),
                             (0.02, "[rank1]: ValueError: bad shape")])
    cluster.start()
    env = sim_env(fake_api, tmp_path)

    def wmctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)

    sub = wmctl("submit", str(spec), "-b", "kubernetes", "--context", "sim")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert f"nothing will resume {run}" in sub.stdout

    def running_pods():
        return [p for p in fake_api.store.list("pods")[0]
                if p["metadata"]["labels"].get("job-name") == f"{run}-a0" and p["status"].get("phase") == "Running"]
    if outcome in ("killed", "cancelled", "running"):
        assert cluster.run_until(lambda: len(running_pods()) == 2, timeout=30)
    if outcome == "killed":
        cluster.kill_node(running_pods()[0]["spec"]["nodeName"])
    elif outcome == "cancelled":
        assert wmctl("cancel", run).returncode == 0
    expected = {"succeeded": "succeeded", "app_error": "failed", "killed": "failed", "cancelled": "cancelled",
                "running": "running"}[outcome]
    want = {"succeeded": "succeeded", "app_error": "app_error", "killed": "node_lost", "cancelled": "cancelled",
            "running": None}[outcome]

    def settled():
        data = json.loads(wmctl("status", run, "-o", "json").stdout)
        return data["status"] == expected and data["attempts"][0]["outcome"] == want
    # Each look is a whole `wmctl` process (seconds on a loaded 2-core CI box): the deadline is
    # generous, the test still ends as soon as the status settles.
    assert cluster.run_until(settled, timeout=240), wmctl("status", run).stdout
    text = wmctl("status", run).stdout
    assert "None" not in text and "watcher: unwatched" in text
    row = next(line.split() for line in wmctl("list").stdout.splitlines() if line.startswith(run + " "))
    assert row[:3] == [run, "kubernetes", expected]
    if outcome == "app_error":
        assert 'train.py", line 7' in text and "ValueError: bad shape" in text
    assert all(f"{run}-a1" not in r["path"] for r in fake_api.api.sent("POST", ""))


def _cli(fake_api, tmp_path):
    env = sim_env(fake_api, tmp_path)

    def wmctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)
    return wmctl


def _ttl_spec(tmp_path, run: str, ttl: int) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": run, "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training", "ttl_seconds_after_finished": ttl},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    }))
    return spec


def test_sim_cli_watch_returns_once_the_ttl_removed_a_job_nobody_watched(fake_api, tmp_path):
    """A detached submit (no watcher); the Job completes and ttlSecondsAfterFinished removes it
    with its pods before anyone looks. `wmctl watch` must not wait forever for pods that will
    never come: the Job controller's "Completed" Event says how the attempt ended. The Service,
    owned by the Job, went with it."""
    wmctl = _cli(fake_api, tmp_path)
    run = "clittl"
    cluster = fake_api.cluster
    cluster.script(job=f"{run}-a0", run_seconds=0.2, logs=[(0.0, progress("start", 0)), (0.1, progress("step", 5))])
    cluster.start()
    sub = wmctl("submit", str(_ttl_spec(tmp_path, run, ttl=20)), "-b", "kubernetes", "--context", "sim", "--detach")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert cluster.run_until(lambda: any(w == "ttl_deleted" for _, w, _ in cluster.timeline), timeout=30)
    assert cluster.run_until(lambda: not fake_api.store.list("pods")[0])
    watch = wmctl("watch", run, timeout=30)
    assert watch.returncode == 0, watch.stdout + watch.stderr
    assert "succeeded on attempt 0" in watch.stdout and "the Job completed" in watch.stdout, watch.stdout
    assert cluster.run_until(lambda: not fake_api.store.list("services")[0])
    assert all(f"{run}-a1" not in r["path"] for r in fake_api.api.sent("POST", ""))


def test_sim_cli_logs_outlive_the_ttl_and_nothing_of_the_attempt_is_left(fake_api, tmp_path):
    """A watched run succeeds; then ttlSecondsAfterFinished removes the Job and its pods. `wmctl
    logs` still shows what the nodes printed (archived when the run succeeded), and neither the
    Service nor anything else of the attempt is left behind (owned by the Job)."""
    wmctl = _cli(fake_api, tmp_path)
    run = "clilogs"
    cluster = fake_api.cluster
    cluster.script(job=f"{run}-a0", run_seconds=0.3, logs=[(0.0, "node says hello")])
    cluster.script(job=f"{run}-a0", index=0, run_seconds=0.3, logs=[(0.0, progress("start", 0)),
                                                                    (0.1, "rank 0 says goodbye")])
    cluster.start()
    sub = wmctl("submit", str(_ttl_spec(tmp_path, run, ttl=60)), "-b", "kubernetes", "--context", "sim",
                "--auto-resume")
    assert sub.returncode == 0 and "succeeded on attempt 0" in sub.stdout, sub.stdout + sub.stderr
    assert cluster.run_until(lambda: not fake_api.store.list("jobs")[0] and not fake_api.store.list("pods")[0]
                             and not fake_api.store.list("services")[0], timeout=30)
    logs0 = wmctl("logs", run, "--node", "0")
    assert logs0.returncode == 0 and "rank 0 says goodbye" in logs0.stdout, logs0.stdout + logs0.stderr
    logs1 = wmctl("logs", run, "--node", "1")
    assert logs1.returncode == 0 and "node says hello" in logs1.stdout, logs1.stdout + logs1.stderr


def test_sim_cli_status_of_a_run_the_ttl_removed_unwatched_is_its_real_end(fake_api, tmp_path):
    """A detached submit; the Job succeeds and ttlSecondsAfterFinished removes it before anyone
    looks. `wmctl status` reports `succeeded` (the Job controller's Event says so), not a node
    lost because every object is gone."""
    wmctl = _cli(fake_api, tmp_path)
    run = "clistat"
    cluster = fake_api.cluster
    cluster.script(job=f"{run}-a0", run_seconds=0.2)
    cluster.start()
    sub = wmctl("submit", str(_ttl_spec(tmp_path, run, ttl=20)), "-b", "kubernetes", "--context", "sim", "--detach")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert cluster.run_until(lambda: any(w == "ttl_deleted" for _, w, _ in cluster.timeline), timeout=30)
    assert cluster.run_until(lambda: not fake_api.store.list("jobs")[0] and not fake_api.store.list("pods")[0])
    seen: list = []

    def settled():      # `status` looks for RECONCILE_WAIT_S; a loaded machine may need another look
        data = json.loads(wmctl("status", run, "-o", "json").stdout)
        seen.append((data["status"], data["attempts"][0]["outcome"]))
        return data["status"] != "running"
    assert cluster.run_until(settled, timeout=60, interval=0.2)
    assert seen[-1] == ("succeeded", "succeeded"), seen


def test_sim_graceful_cancel_suspends_the_job_and_waits_for_the_sigterm_checkpoint(fake_api, tmp_path):
    """`wmctl cancel --graceful` on Kubernetes: the Job is suspended, so the Job controller deletes
    its pods with their grace period and starts no new one; each pod gets SIGTERM, rank 0 writes
    its checkpoint and exits 83; the watcher (another process) sees that checkpoint, then the
    teardown removes the rest. The run ends cancelled (8) with the checkpoint named."""
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "cligrace", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "kubernetes": {"namespace": "training"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"},
    }))
    step = 'WMCTL-PROGRESS {"event":"step","step":%d,"loss":1.0,"samples":8}'
    fake_api.cluster.script(job="cligrace-a0", run_seconds=None,
                            logs=[(0.05 * i, step % i) for i in range(1, 8)],
                            sigterm_seconds=0.4, sigterm_exit_code=83,
                            sigterm_logs=[(0.2, 'WMCTL-PROGRESS {"event":"checkpoint","step":7,"path":"/ckpt/x",'
                                                '"seconds":0.1}'),
                                          (0.3, 'WMCTL-PROGRESS {"event":"preempted","step":7}')])
    fake_api.cluster.start()
    env = sim_env(fake_api, tmp_path)
    watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "-b", "kubernetes",
                                "--context", "sim", "--auto-resume"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_dir = tmp_path / "home" / "runs" / "cligrace"
        assert fake_api.cluster.run_until(
            lambda: (run_dir / "metrics.jsonl").exists() and '"step":7' in (run_dir / "metrics.jsonl").read_text(),
            timeout=60)
        cancel = subprocess.run([sys.executable, "-m", "orchestrator.cli", "cancel", "cligrace", "--graceful"],
                                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
        out, _ = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert watcher.returncode == 8, out
    patches = [r for r in fake_api.api.sent("PATCH", "/jobs/cligrace-a0")]
    assert any(((r.get("body") or {}).get("spec") or {}).get("suspend") is True for r in patches), patches
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "cancelled" and [a["attempt"] for a in record["attempts"]] == [0]
    assert "gracefully" in record["final_report"] and "newest checkpoint is step 7" in record["final_report"], out
    assert not fake_api.store.list("jobs")[0] and not fake_api.store.list("pods")[0]
