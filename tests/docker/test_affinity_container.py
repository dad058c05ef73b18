"""The ``wmctl-bind`` launcher inside a real container restricted with ``--cpuset-cpus``.

The repository is bind-mounted read-only at /wmctl (PYTHONPATH=/wmctl) into the test base image
(python + torch), so this tests the source tree as it is, with the container's real cgroup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from .conftest import unavailable

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import json, os; from orchestrator.runtime.topology import read_cgroup_cpuset; "
    "c = read_cgroup_cpuset('/'); "
    "os.write(1, (json.dumps({'rank': int(os.environ.get('LOCAL_RANK', 0)), 'cpus': sorted(os.sched_getaffinity(0)), "
    "'omp': os.environ.get('OMP_NUM_THREADS'), 'cgroup': sorted(c) if c is not None else None}) + '\\n').encode())"
)  # one write(2): lines of two workers sharing a pipe never interleave
LAUNCHER = ["python", "-m", "orchestrator.runtime.affinity"]


def _docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="module")
def engine():
    if not _docker_ready():
        unavailable("Docker engine not reachable (start it with .ci/start-dockerd.sh)")
    host_cpus = sorted(os.sched_getaffinity(0))
    if host_cpus[:2] != [0, 1]:
        pytest.fail(f"these cases pin CPUs 0 and 1; this host allows {host_cpus}")


def docker_run(image: str, cpuset: str, env: dict, cmd: list[str], timeout: int = 240):
    # --hostname localhost: torchrun resolves its own hostname, and --network none has no DNS.
    name = f"wmctl-test-affinity-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    argv = ["docker", "run", "--rm", "--name", name, "--network", "none", "--hostname", "localhost",
            "--cpuset-cpus", cpuset,
            "-v", f"{REPO}:/wmctl:ro", "-w", "/wmctl",
            "-e", "PYTHONPATH=/wmctl", "-e", "PYTHONDONTWRITEBYTECODE=1"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [image, *cmd]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    finally:
        # A timed-out client leaves its container running: remove it (no-op when it is gone).
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def reports(stdout: str) -> list[dict]:
    return sorted((json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")), key=lambda r: r["rank"])


@pytest.mark.timeout(300)
def test_single_cpu_cpuset(engine, base_image):
    env = {"LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "WMCTL_VENDOR": "cpu", "WMCTL_AFFINITY": "exclusive"}
    proc = docker_run(base_image, "1", env, LAUNCHER + ["python", "-c", PROBE])
    assert proc.returncode == 0, proc.stderr
    [rep] = reports(proc.stdout)
    assert rep["cgroup"] == [1]          # the real cgroup reader sees the container's cpuset
    assert rep["cpus"] == [1] and rep["omp"] == "1"
    assert "wmctl-bind: local_rank=0 cpus=1 " in proc.stderr


@pytest.mark.timeout(300)
def test_more_ranks_than_the_cpuset_is_a_clear_error(engine, base_image):
    env = {"LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "WMCTL_VENDOR": "cpu", "WMCTL_AFFINITY": "exclusive"}
    proc = docker_run(base_image, "1", env, LAUNCHER + ["python", "-c", PROBE])
    assert proc.returncode == 2
    assert "2 ranks but only 1 allowed CPUs (1)" in proc.stderr and "lower nproc_per_node" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchrun_workers_split_the_cpuset(engine, base_image):
    env = {"WMCTL_VENDOR": "cpu", "WMCTL_AFFINITY": "numa"}
    cmd = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           *LAUNCHER, "python", "-c", PROBE]
    proc = docker_run(base_image, "0-1", env, cmd, timeout=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reps = reports(proc.stdout)
    assert [r["rank"] for r in reps] == [0, 1]
    assert [r["cgroup"] for r in reps] == [[0, 1], [0, 1]]
    assert [r["cpus"] for r in reps] == [[0], [1]]   # disjoint, one CPU each
    assert [r["omp"] for r in reps] == ["1", "1"]
