"""The ``wmctl-bind`` launcher as a real process, alone and under real torchrun.

This machine may have as few as 2 CPUs, so the splits tested here are splits of 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import vendor_env

from .fakesysfs import FakeSysfs

REPO = Path(__file__).resolve().parents[2]
REAL_CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(REAL_CPUS) < 2, reason="needs 2 allowed CPUs")

PROBE = (
    "import json, os; os.write(1, (json.dumps({'rank': int(os.environ.get('LOCAL_RANK', 0)), "
    "'cpus': sorted(os.sched_getaffinity(0)), 'omp': os.environ.get('OMP_NUM_THREADS'), "
    "'mkl': os.environ.get('MKL_NUM_THREADS'), 'bound': os.environ.get('WMCTL_BOUND_CPUS')}) + '\\n').encode())"
)  # one write(2): lines of two workers sharing a pipe never interleave

# The two ways to start the launcher: `python -m`, and what the console script does.
LAUNCHERS = {
    "module": [sys.executable, "-m", "orchestrator.runtime.affinity"],
    "entry": [sys.executable, "-c", "from orchestrator.runtime.affinity import launcher_main; launcher_main()"],
}


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMCTL_", "LOCAL_", "OMP_", "MKL_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    vendor = env.get("WMCTL_VENDOR")
    if vendor and vendor != "tpu":        # a job started by wmctl carries its profile; tpu has none
        env.update(vendor_env(vendor))
    return env


def run(cmd, env, timeout=60):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def two_node_root(tmp_path):
    """2 real CPU ids on 2 fake NUMA nodes, one MUSA card on each node."""
    a, b = REAL_CPUS[:2]
    fs = FakeSysfs(tmp_path).cpus(max(a, b) + 1)
    fs.node(0, [a]).node(1, [b])
    fs.pci("0000:81:00.0", 0x1ED5, 0x030000, 1)
    fs.pci("0000:01:00.0", 0x1ED5, 0x030000, 0)
    return tmp_path


@needs_two_cpus
@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("mode", ["numa", "exclusive"])
def test_launcher_binds_each_rank_to_its_devices_node(two_node_root, launcher, mode):
    a, b = REAL_CPUS[:2]
    for rank, expected in ((0, a), (1, b)):
        env = base_env(LOCAL_RANK=rank, LOCAL_WORLD_SIZE=2, WMCTL_AFFINITY=mode, WMCTL_VENDOR="musa",
                       WMCTL_SYSFS_ROOT=two_node_root, OMP_NUM_THREADS=1)
        proc = run(LAUNCHERS[launcher] + ["--", sys.executable, "-c", PROBE], env)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["cpus"] == [expected]
        assert out["omp"] == "1" and out["mkl"] == "1"  # len(cpus), overriding torchrun's 1 anyway
        assert out["bound"] == str(expected)
        assert f"wmctl-bind: local_rank={rank} cpus={expected} numa={rank} mode={mode}" in proc.stderr


@needs_two_cpus
@pytest.mark.timeout(120)
def test_numa_ranks_sharing_a_node_get_their_share_of_threads(tmp_path):
    a, b = REAL_CPUS[:2]
    fs = FakeSysfs(tmp_path).cpus(max(a, b) + 1)
    fs.node(0, [a, b])
    fs.pci("0000:01:00.0", 0x1ED5, 0x030000, 0)
    fs.pci("0000:02:00.0", 0x1ED5, 0x030000, 0)
    for rank in (0, 1):
        env = base_env(LOCAL_RANK=rank, LOCAL_WORLD_SIZE=2, WMCTL_AFFINITY="numa", WMCTL_VENDOR="musa",
                       WMCTL_SYSFS_ROOT=tmp_path, OMP_NUM_THREADS=1)
        proc = run(LAUNCHERS["module"] + ["--", sys.executable, "-c", PROBE], env)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["cpus"] == [a, b]                      # both share the node's two CPUs
        assert out["omp"] == "1" and out["mkl"] == "1"    # 2 CPUs / 2 ranks, not 2 each
        assert "threads=1" in proc.stderr


@needs_two_cpus
@pytest.mark.timeout(60)
def test_launcher_even_split_on_real_sysfs_and_omp_threads():
    env = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_AFFINITY="numa", WMCTL_VENDOR="cpu")
    out = json.loads(run(LAUNCHERS["module"] + [sys.executable, "-c", PROBE], env).stdout)
    assert out["cpus"] == REAL_CPUS and out["omp"] == str(len(REAL_CPUS))
    env = base_env(LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, WMCTL_VENDOR="cpu", OMP_NUM_THREADS=7, WMCTL_KEEP_OMP=1)
    out = json.loads(run(LAUNCHERS["module"] + [sys.executable, "-c", PROBE], env).stdout)
    half = len(REAL_CPUS) // 2
    assert out["cpus"] == REAL_CPUS[half:]
    assert out["omp"] == "7" and out["mkl"] is None  # WMCTL_KEEP_OMP=1 leaves them alone


@pytest.mark.timeout(60)
def test_launcher_mode_none_does_not_bind():
    env = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_AFFINITY="none", WMCTL_VENDOR="cpu")
    proc = run(LAUNCHERS["module"] + [sys.executable, "-c", PROBE], env)
    out = json.loads(proc.stdout)
    assert out["cpus"] == REAL_CPUS and out["omp"] is None and out["bound"] is None
    assert "mode=none" in proc.stderr


@pytest.mark.timeout(60)
def test_launcher_errors_are_clear_and_nonzero():
    too_many = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=len(REAL_CPUS) + 1, WMCTL_AFFINITY="exclusive",
                        WMCTL_VENDOR="cpu")
    proc = run(LAUNCHERS["module"] + ["true"], too_many)
    assert proc.returncode == 2
    assert "wmctl-bind: error:" in proc.stderr and "lower nproc_per_node" in proc.stderr
    assert "Traceback" not in proc.stderr

    bad_mode = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_AFFINITY="fast", WMCTL_VENDOR="cpu")
    proc = run(LAUNCHERS["module"] + ["true"], bad_mode)
    assert proc.returncode == 2 and "'fast' is not a mode" in proc.stderr

    bad_vendor = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_VENDOR="tpu")
    proc = run(LAUNCHERS["module"] + ["true"], bad_vendor)
    assert proc.returncode == 2 and "unknown vendor 'tpu'" in proc.stderr

    missing = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_VENDOR="cpu")
    proc = run(LAUNCHERS["module"] + ["no-such-command-wmctl"], missing)
    assert proc.returncode == 127 and "command not found: no-such-command-wmctl" in proc.stderr

    proc = run(LAUNCHERS["module"], missing)
    assert proc.returncode == 2 and "usage: wmctl-bind" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_launcher_imports_no_torch():
    # The launcher runs before every worker: it must not pay torch's import time.
    code = ("import sys, orchestrator.runtime.affinity; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'click', 'yaml')))")
    proc = run([sys.executable, "-c", code], base_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "[]"


@needs_two_cpus
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_real_torchrun_workers_get_disjoint_sets():
    env = base_env(WMCTL_AFFINITY="exclusive", WMCTL_VENDOR="cpu")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--no-python"] + LAUNCHERS["module"] + [sys.executable, "-c", PROBE]
    proc = run(cmd, env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    half = len(REAL_CPUS) // 2
    assert reports[0]["cpus"] == REAL_CPUS[:half] and reports[1]["cpus"] == REAL_CPUS[half:]
    assert not set(reports[0]["cpus"]) & set(reports[1]["cpus"])
    # torchrun forces OMP_NUM_THREADS=1 for nproc > 1; the launcher sets it to the set's size.
    assert [r["omp"] for r in reports] == [str(half), str(len(REAL_CPUS) - half)]
    assert "wmctl-bind: local_rank=0" in proc.stderr and "wmctl-bind: local_rank=1" in proc.stderr


def test_the_launcher_creates_the_runs_checkpoint_folder_for_any_job(tmp_path):
    """A job that never imports the runtime writes straight into WMCTL_CHECKPOINT_DIR, now the
    run's own subfolder: the launcher creates it before the job starts, on every backend."""
    folder = tmp_path / "ckpt" / "myrun"
    env = base_env(LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, WMCTL_AFFINITY="none", WMCTL_VENDOR="cpu",
                   WMCTL_CHECKPOINT_DIR=str(folder))
    probe = "import os, sys; open(os.path.join(os.environ['WMCTL_CHECKPOINT_DIR'], 'x'), 'w').write('ok')"
    proc = run(LAUNCHERS["module"] + [sys.executable, "-c", probe], env)
    assert proc.returncode == 0, proc.stderr
    assert (folder / "x").read_text() == "ok"
