"""`wmctl logs` on Kubernetes against the fake API server: --tail, --since and --timestamps become
pods/log's tailLines, sinceSeconds and timestamps (the fake serves them as the kubelet does,
tests/kube/fakeapi/server.py _logs); --all-nodes and -f into the next attempt through the real
command line, which finds the cluster through `submit --kubeconfig` kept in the run record."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.backends import base
from orchestrator.errors import OptionError

from .fakeapi.server import rfc3339nano
from .manifests import rendered_plan
from .simhelpers import Collector
from .test_cli_sim import progress, write_kubeconfig

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def test_tail_since_and_timestamps_reach_pods_log(fake_api, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    fake_api.cluster.script(job="sim-a0", run_seconds=None)
    fake_api.cluster.script(job="sim-a0", index=0, run_seconds=None,
                            logs=[(0.0, "one"), (0.0, "two"), (0.0, "three"), (2.5, "late")])
    fake_api.cluster.start()
    ref = backend.submit(rendered_plan("sim", 0))
    col = Collector(backend, ref)
    assert col.until(lambda c: [n.phase for n in c.last.nodes] == [base.RUNNING] * 2)
    pod = next(p["metadata"]["name"] for p in fake_api.store.list("pods")[0]
               if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0")
    key = ("default", pod, "trainer")
    assert fake_api.cluster.run_until(lambda: "late" in fake_api.api.log_lines(*key), timeout=60)
    entries = fake_api.api.log_file(*key)[1]

    assert list(backend.logs(ref, 0, query=base.LogQuery(tail=2))) == ["three", "late"]
    stamped = list(backend.logs(ref, 0, query=base.LogQuery(timestamps=True)))
    assert stamped == [f"{rfc3339nano(t)} {line}" for t, line in entries]
    assert [base.rfc3339(t) for t, _ in entries] == [rfc3339nano(t) for t, _ in entries]   # the same format
    late_s = entries[-1][0] / 1e9
    assert list(backend.logs(ref, 0, query=base.LogQuery(since=late_s - 0.2))) == ["late"]

    backend.cancel(ref)                 # torn down: the kept tail has no times
    assert fake_api.cluster.run_until(lambda: not fake_api.store.list("pods")[0])
    assert list(backend.logs(ref, 0, query=base.LogQuery(tail=1))) == ["late"]
    with pytest.raises(OptionError) as err:
        list(backend.logs(ref, 0, query=base.LogQuery(since=time.time() - 60)))
    assert err.value.hint is not None
    assert "--since" in err.value.message and "--tail" in err.value.hint


def test_cli_logs_follow_every_node_into_the_next_attempt_with_kubeconfig(fake_api, tmp_path):
    """`submit --kubeconfig FILE --context sim` with no KUBECONFIG in the environment; later
    commands read the same file from the run record."""
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "klogs", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s"}, "kubernetes": {"namespace": "training"},
    }))
    cluster = fake_api.cluster
    cluster.script(job="klogs-a0", run_seconds=None, logs=[(0.0, "a0 hello")])
    cluster.script(job="klogs-a0", index=0, run_seconds=None,
                   logs=[(0.0, "a0 hello"), (0.05, progress("start", 0)), (0.1, progress("checkpoint", 10))])
    cluster.script(job="klogs-a1", run_seconds=1.5, logs=[(0.0, "a1 hello"), (1.0, "a1 bye")])
    cluster.script(job="klogs-a1", index=0, run_seconds=1.6,
                   logs=[(0.0, "a1 hello"), (0.1, progress("resume", 10)), (1.0, "a1 bye")])
    cluster.start()
    kubeconfig = tmp_path / "cluster.yaml"
    write_kubeconfig(kubeconfig, fake_api.server.url)
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "absent"), "WMCTL_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(REPO)}

    def wmctl(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    watcher = wmctl("submit", str(spec), "-b", "kubernetes", "--kubeconfig", str(kubeconfig), "--context", "sim",
                    "--auto-resume")
    follower = None
    try:
        def running(job):
            return [p for p in fake_api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        assert cluster.run_until(lambda: len(running("klogs-a0")) == 2, timeout=30)

        def written(index: str, line: str) -> bool:      # the pod's script got that far
            pod = next(p for p in running("klogs-a0")
                       if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == index)
            return line in fake_api.api.log_lines(pod["metadata"]["namespace"], pod["metadata"]["name"],
                                                  pod["spec"]["containers"][0]["name"])
        assert cluster.run_until(lambda: written("0", progress("checkpoint", 10)) and written("1", "a0 hello"),
                                 timeout=30)
        tail = wmctl("logs", "klogs", "--all-nodes", "--tail", "1", "--raw")
        out, err = tail.communicate(timeout=30)
        assert tail.returncode == 0, err
        assert out.splitlines() == ["[node 0] " + progress("checkpoint", 10), "[node 1] a0 hello"], out
        follower = wmctl("logs", "klogs", "-f", "--all-nodes", "--timestamps")
        assert follower.stdout is not None
        first = follower.stdout.readline()         # it follows attempt 0 before its node is killed
        assert re.fullmatch(r"\[node [01]\] \S+ a0 hello\n", first), first
        dead = next(p["spec"]["nodeName"] for p in running("klogs-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.kill_node(dead)
        wout, werr = watcher.communicate(timeout=90)
        assert watcher.returncode == 0, wout + werr
        fout, ferr = follower.communicate(timeout=60)
        fout = first + fout
    finally:
        for proc in (watcher, follower):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert follower.returncode == 0, ferr
    lines = fout.splitlines()
    assert "==> klogs-a1 (attempt 1) <==" in lines, fout
    after = lines[lines.index("==> klogs-a1 (attempt 1) <=="):]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"
    for node in (0, 1):
        assert any(re.fullmatch(rf"\[node {node}\] {stamp} a1 bye", ln) for ln in after), fout
    assert any(re.fullmatch(rf"\[node [01]\] {stamp} a0 hello", ln) for ln in lines[:lines.index(after[0])]), fout
    assert "WMCTL-PROGRESS" not in fout
