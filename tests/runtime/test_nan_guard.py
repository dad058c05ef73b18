"""The NaN/inf guard in the example's real training loop: a poisoned micro-batch must be caught
before optimizer.step(), the step skipped on every rank, the precision stepped down, and no
checkpoint may ever hold non-finite weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.runtime.checkpoint import CheckpointError, CheckpointManager, list_checkpoints
from tests.runtime.conftest import REPO, TINY, TRAIN, job_env, start_job

NAN_STEP = 3


def _finite(state: dict) -> bool:
    return all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def _model_at(ckpt: Path, step: int) -> dict:
    path = next(c.path for c in list_checkpoints(ckpt) if c.step == step and c.committed)
    return torch.load(path / "shared.pt", weights_only=False)["model"]


@pytest.mark.timeout(300)
def test_single_process_skips_the_poisoned_step_and_continues_in_fp32(tmp_path: Path, shared_data: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = TINY + ["--data-dir", str(shared_data), "--num-workers", "0", "--dtype", "bf16",
                   "--max_steps", "8", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
                   "--checkpoint-keep", "20", "--inject-nan-at", f"{NAN_STEP}:1",
                   "--dump-final", str(tmp_path / "final.pt")]
    proc = subprocess.run([sys.executable, str(TRAIN), *args], env=job_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from orchestrator.runtime.protocol import parse_progress

    steps = [e for e in map(parse_progress, proc.stdout.splitlines()) if e and e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 9))
    assert [e["dtype"] for e in steps] == ["bf16"] * (NAN_STEP - 1) + ["fp32"] * (9 - NAN_STEP)
    assert [e.get("skipped") for e in steps] == [None] * (NAN_STEP - 1) + ["loss is NaN/inf"] + [None] * (8 - NAN_STEP)
    assert all(isinstance(e["loss"], float) for e in steps if e["step"] != NAN_STEP)
    assert "switching bf16 -> fp32" in proc.stderr

    final = torch.load(tmp_path / "final.pt", weights_only=False)
    assert final["dtype"] == "fp32" and _finite(final["model"])
    # The skipped step changed no weight; every committed checkpoint is finite.
    before, skipped = _model_at(ckpt, NAN_STEP - 1), _model_at(ckpt, NAN_STEP)
    assert all(torch.equal(before[k], skipped[k]) for k in before)
    assert [c.step for c in list_checkpoints(ckpt) if c.committed] == list(range(1, 9))
    for c in list_checkpoints(ckpt):
        assert _finite(_model_at(ckpt, c.step)), c.step
    # The precision the run stepped down to is part of the checkpoint, for the resume.
    assert list_checkpoints(ckpt)[-1].meta()["extra"]["dtype_guard"]["dtype"] == "fp32"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nan_on_one_rank_only_skips_the_step_on_both(tmp_path: Path, shared_data: Path) -> None:
    final = tmp_path / "final.pt"
    args = TINY + ["--data-dir", str(shared_data), "--num-workers", "0", "--dtype", "bf16", "--max_steps", "6",
                   "--inject-nan-at", f"{NAN_STEP}:0:1", "--dump-final", str(final)]
    job = start_job(args, tmp_path / "log.txt")
    job.completed()
    steps = job.events("step")
    assert [e["dtype"] for e in steps] == ["bf16"] * (NAN_STEP - 1) + ["fp32"] * (7 - NAN_STEP)
    assert steps[NAN_STEP - 1]["skipped"] == "loss is NaN/inf"
    r0 = torch.load(final, weights_only=False)
    r1 = torch.load(f"{final}.rank-1", weights_only=False)
    assert r0["dtype"] == r1["dtype"] == "fp32"
    assert _finite(r0["model"])
    # Both replicas skipped the same step: they are still identical.
    assert all(torch.equal(r0["model"][k], r1["model"][k]) for k in r0["model"])


def test_checkpoint_manager_refuses_non_finite_weights(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    m = CheckpointManager(tmp_path)
    m.register(model=model)
    m.save(1)
    with torch.no_grad():
        model.weight[0, 1] = float("inf")
    with pytest.raises(CheckpointError, match="non-finite.*weight"):
        m.save(2)
    assert [(c.step, c.committed) for c in list_checkpoints(tmp_path)] == [(1, True)]
    m.check_finite = False   # an explicit opt-out still works
    m.save(3)


def test_the_non_finite_check_is_exact_where_its_fast_sum_is_not() -> None:
    """The check sums each tensor (cheap) and looks element by element only where a sum is not
    finite: finite values whose sum overflows are not refused, and every NaN or infinity is."""
    from orchestrator.runtime.checkpoint import nonfinite_tensors

    big = torch.full((4,), 3e38)                         # finite, but the float32 sum is inf
    half = torch.full((70000,), 60000.0, dtype=torch.float16)   # finite, sum far above float16's max
    cancel = torch.tensor([float("inf"), float("-inf"), 1.0])   # the sum is NaN
    nan = torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)
    ints = torch.tensor([2**62, 2**62])                   # not floating point: never checked
    assert nonfinite_tensors([("big", big), ("half", half), ("ints", ints), ("empty", torch.empty(0))]) == []
    assert nonfinite_tensors([("big", big), ("cancel", cancel), ("nan", nan), ("ok", torch.ones(3))]) == \
        ["cancel", "nan"]
