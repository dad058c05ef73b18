"""What wmctl prints for a user to paste must work when pasted: the Docker plan's equivalent
`docker run` line is run through bash against the real engine, and the container it creates has
the plan's /dev/shm size, memory limit, mounts, environment and argv, hostile values intact.
(`--shm-size 1Gi`, a Kubernetes quantity, was refused by the docker CLI.)"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
import yaml

from orchestrator import labels as L

from .conftest import SWEPT_RUNS, run_wmctl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.xdist_group(f"{SWEPT_RUNS}-pasted-run-line"),
              pytest.mark.usefixtures("_no_stale_runs")]
RUN_PREFIX = "dkp-"     # this module's runs: the only ones its _no_stale_runs sweeps

HOSTILE = ["two words", "quote ' and \"", "$(touch /tmp/pwned)", "`id`", "1e-4", "a;b"]


def test_the_printed_docker_run_line_creates_the_planned_container(docker_client, image, home, tmp_path):
    run = "dkp-pasted"
    data = tmp_path / "data dir"
    data.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": run, "nodes": 1, "nproc_per_node": 1, "affinity": "none",
        "image": {"vendor": "cpu", "tag": image},
        "resources": {"shm": "96Mi", "memory": "1536Mi"},
        "volumes": [{"name": "data", "mount": "/workspace/data", "host_path": str(data), "read_only": True}],
        "env": {"HOSTILE": HOSTILE[2], "SPACED": HOSTILE[0]},
        "command": ["python", "-c", "import time; time.sleep(600)", *HOSTILE],
    }))
    plan = run_wmctl("render", str(spec), "-b", "docker", "-o", "json", cwd=tmp_path, env={"WMCTL_HOME": str(home)})
    assert plan.returncode == 0, plan.stderr
    container = next(r for r in json.loads(plan.stdout)["resources"] if r["kind"] == "container")
    line, create = container["docker_run"], container["create"]
    network = docker_client.networks.create(create["network"], labels={L.RUN: run})
    try:
        out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = docker_client.containers.get(create["name"]).attrs
        host = got["HostConfig"]
        assert host["ShmSize"] == create["shm_size"] == 96 * 2**20
        assert host["Memory"] == create["mem_limit"] == 1536 * 2**20
        binds = {m["Destination"]: m for m in got["Mounts"]}
        assert binds["/workspace/data"]["Source"] == str(data) and binds["/workspace/data"]["RW"] is False
        env = dict(e.split("=", 1) for e in got["Config"]["Env"])
        assert env["HOSTILE"] == HOSTILE[2] and env["SPACED"] == HOSTILE[0]
        assert all(env[k] == v for k, v in create["environment"].items())
        argv = [got["Path"], *got["Args"]]
        assert argv == list(create["command"]) and argv[-len(HOSTILE):] == HOSTILE
        assert shlex.split(line)[-len(HOSTILE):] == HOSTILE
        assert subprocess.run(["test", "-e", "/tmp/pwned"]).returncode != 0, "a value reached a shell"
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": [f"{L.RUN}={run}"]}, ignore_removed=True):
            c.remove(force=True)
        network.remove()
