"""In-process binding and the re-check after process-group init (NCCL may reset affinity).

Each case runs in a fresh interpreter: binding the pytest process itself would leak into
every later test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REAL_CPUS = sorted(os.sched_getaffinity(0))

SCRIPT = r"""
import json, os, sys, threading
import torch
from orchestrator.runtime.affinity import apply_binding_for_this_rank, verify_binding

rank = apply_binding_for_this_rank()
out = {"bound": sorted(rank.cpus), "omp": os.environ["OMP_NUM_THREADS"], "torch_threads": torch.get_num_threads()}
stop = threading.Event()
worker = threading.Thread(target=stop.wait)
worker.start()
out["first"] = verify_binding()
# What a collective library's init may do: widen the main thread and its helper threads.
everything = set(range(os.cpu_count()))
os.sched_setaffinity(0, everything)
os.sched_setaffinity(worker.native_id, everything)
out["changed"] = verify_binding()
out["main_after"] = sorted(os.sched_getaffinity(0))
out["worker_after"] = sorted(os.sched_getaffinity(worker.native_id))
out["again"] = verify_binding()
stop.set(); worker.join()
print(json.dumps(out))
"""


def run(code, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMCTL_", "LOCAL_", "OMP_", "MKL_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update({k: str(v) for k, v in env_extra.items()})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.skipif(len(REAL_CPUS) < 2, reason="needs 2 allowed CPUs")
@pytest.mark.timeout(180)
def test_apply_then_verify_reapplies_to_every_thread():
    proc = run(SCRIPT, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, WMCTL_VENDOR="cpu", WMCTL_AFFINITY="exclusive")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    half = len(REAL_CPUS) // 2
    mine = REAL_CPUS[half:]
    assert out["bound"] == mine
    assert out["omp"] == str(len(mine)) and out["torch_threads"] == len(mine)
    assert out["first"]["status"] == "ok"
    assert out["changed"]["status"] == "reapplied"
    assert out["main_after"] == mine and out["worker_after"] == mine
    assert out["again"]["status"] == "ok"
    assert "affinity changed after init" in proc.stderr and "re-applied" in proc.stderr


@pytest.mark.timeout(120)
def test_verify_without_a_binding_reports_unbound():
    code = "import json; from orchestrator.runtime.affinity import verify_binding; print(json.dumps(verify_binding()))"
    proc = run(code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "unbound"
    code = ("import json, os; from orchestrator.runtime.affinity import verify_binding; "
            "print(json.dumps(verify_binding(reapply=False)))")
    all_cpus = ",".join(map(str, REAL_CPUS))
    proc = run(code, WMCTL_BOUND_CPUS=REAL_CPUS[0]) if len(REAL_CPUS) > 1 else run(code, WMCTL_BOUND_CPUS=all_cpus)
    status = json.loads(proc.stdout)["status"]
    assert status == ("changed" if len(REAL_CPUS) > 1 else "ok")


# A rank bound by the launcher's rules, then something (as NCCL's init may) widens its affinity
# before the job initialises its process group through the runtime.
INIT_SCRIPT = r"""
import json, os
from orchestrator.runtime import dist
from orchestrator.runtime.affinity import apply_binding_for_this_rank

planned = sorted(apply_binding_for_this_rank().cpus)
os.sched_setaffinity(0, set(range(os.cpu_count())))
widened = sorted(os.sched_getaffinity(0))
assert dist.init_from_env() is True
print(json.dumps({"planned": planned, "widened": widened, "after": sorted(os.sched_getaffinity(0))}))
dist.destroy()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(len(REAL_CPUS) < 2, reason="needs 2 allowed CPUs")
@pytest.mark.timeout(180)
def test_process_group_init_restores_the_planned_cpus():
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WMCTL_", "LOCAL_", "OMP_", "MKL_"))}
        env.update(PYTHONPATH=str(REPO), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", RANK=str(rank),
                   WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WMCTL_VENDOR="cpu",
                   WMCTL_AFFINITY="exclusive", WMCTL_TORCH_MODULE="cpu")
        procs.append(subprocess.Popen([sys.executable, "-c", INIT_SCRIPT], env=env, cwd=REPO, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    half = len(REAL_CPUS) // 2
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-3000:]
        got = json.loads(out.splitlines()[-1])
        assert got["planned"] == (REAL_CPUS[:half] if rank == 0 else REAL_CPUS[half:])
        assert got["widened"] != got["planned"]              # the test really changed it
        assert got["after"] == got["planned"]                # init_from_env put it back
        assert err.count("affinity changed after init") == 1 and "re-applied" in err
