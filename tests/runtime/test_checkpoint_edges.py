"""CheckpointManager edge cases: an async commit that times out, a preemption save of a step an
async save is still committing, what gets unwrapped, and models it must refuse."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from orchestrator.runtime.checkpoint import (COMMIT_MARKER, CheckpointError, CheckpointManager, is_committed,
                                             list_checkpoints)
from tests.runtime.conftest import restored

REPO = Path(__file__).resolve().parents[2]


def test_async_commit_timeout_is_raised_by_the_next_save_and_by_close(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    m = CheckpointManager(tmp_path, async_save=True, commit_timeout_s=0.2)
    m.register(model=model)
    m.world_size = 2   # rank 1 never writes its done file: rank 0's commit times out
    m.save(1)
    with pytest.raises(CheckpointError, match="not committed: ranks \\[1\\] did not finish"):
        m.save(2)
    assert not any(c.committed for c in list_checkpoints(tmp_path))
    m.save(3)
    with pytest.raises(CheckpointError, match="not committed"):
        m.close()
    m.close()   # the error is raised once


class Holder(torch.nn.Module):
    """A user model that happens to have a submodule called ``module``."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 1)


def test_only_real_wrappers_are_unwrapped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Holder()
    m = CheckpointManager(tmp_path / "a")
    m.register(model=model)
    m.save(1)
    saved = torch.load(tmp_path / "a" / "step-00000001" / "shared.pt", weights_only=False)["model"]
    assert set(saved) == {"module.weight", "module.bias", "head.weight", "head.bias"}
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert restored(m).step == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())

    # DataParallel (as DDP) is unwrapped: names without the wrapper's "module." prefix.
    wrapped = torch.nn.DataParallel(torch.nn.Linear(3, 1))
    m = CheckpointManager(tmp_path / "b")
    m.register(model=wrapped)
    m.save(1)
    saved = torch.load(tmp_path / "b" / "step-00000001" / "shared.pt", weights_only=False)["model"]
    assert set(saved) == {"weight", "bias"}


def test_an_fsdp_model_without_a_process_group_is_refused_with_the_fix(tmp_path: Path) -> None:
    """FSDP models get sharded checkpoints (test_checkpoint_sharded.py); those need the process
    group DCP coordinates through, and saying so beats a hang or an AttributeError later."""
    import torch.distributed.fsdp as fsdp

    holder = Holder()
    fake = type("Sharded", (fsdp.FullyShardedDataParallel,), {"__init__": lambda self: torch.nn.Module.__init__(self)})
    holder.head = fake()
    with pytest.raises(CheckpointError, match=r"process group initialised .*init_from_env"):
        CheckpointManager(tmp_path).register(model=holder)


# Two gloo ranks: a periodic async save of step 2 whose commit rank 0 delays, then the preemption
# save of the same step. Every rank must leave that second save only once step 2 is committed.
RANKS = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from orchestrator.runtime import dist
    from orchestrator.runtime.checkpoint import CheckpointManager, is_committed
    dist.init_from_env()
    model = torch.nn.Linear(2, 2)
    m = CheckpointManager(sys.argv[1], async_save=True)
    m.register(model=model)
    m.save(2)
    final = m.save(2, sync=True)          # what the example does on SIGTERM at that step
    print(json.dumps({"rank": dist.rank(), "committed": is_committed(final)}), flush=True)
    m.close()
    dist.barrier()
    dist.destroy()
""")


@pytest.mark.timeout(180)
def test_preemption_at_the_step_of_an_async_save_waits_for_its_commit(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WMCTL_TORCH_MODULE": "cpu",
               "WMCTL_TEST_SLEEP_BEFORE_COMMIT": "2:3"}
        env.pop("WMCTL_BOUND_CPUS", None)
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt")], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["committed"] for r in results), results
    assert is_committed(tmp_path / "ckpt" / "step-00000002")
    assert (tmp_path / "ckpt" / "step-00000002" / COMMIT_MARKER).exists()
