"""The example world model sharded with FSDP2 (--fsdp) under real torchrun (gloo, CPU), its
checkpoints sharded through torch.distributed.checkpoint, killed with SIGKILL and resumed.

Chain on 2 ranks, async checkpoints: conftest.sigkill_resume_chain, the one test_resume_exact.py
runs for DDP (killed mid-accumulation, while checkpoint 12 is written, just after it committed;
then to the end), with the shards checked in the marker and the torn folder.
Final weights, optimizer state and scheduler equal an uninterrupted FSDP2 run's bit for bit,
and so does every rank's sequence of samples.

4 -> 2: a 4-rank run killed after its checkpoint at step 4 resumes on 2 ranks (DCP reshards),
says it is not exact and why, repeats no sample of the interrupted epoch, and completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime.checkpoint import read_marker
from tests.runtime.conftest import (TINY, Job, assert_bit_identical, committed_step, effective_samples, job_env,
                                    kill_tree, sigkill_resume_chain, start_job, wait_until)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _kill(job: Job) -> None:
    kill_tree(job.proc.pid)
    job.proc.wait(timeout=60)


def test_fsdp2_sigkill_resume_is_bit_exact(tmp_path: Path, shared_data: Path, baseline) -> None:
    ref = baseline(0, "--fsdp")
    ckpt = tmp_path / "ckpt"
    base = TINY + ["--fsdp", "--async-checkpoint", "--data-dir", str(shared_data), "--num-workers", "0",
                   "--checkpoint-dir", str(ckpt), "--record-samples", str(tmp_path / "samples")]
    final = sigkill_resume_chain(tmp_path, base, ckpt, sharded=True)

    assert_bit_identical(ref["final"], final)
    got = effective_samples(tmp_path / "samples")
    assert got == ref["samples"]
    assert sorted(got[0]) == [(s, m) for s in range(1, 17) for m in range(3)]


def test_fsdp2_four_ranks_resume_on_two_not_exact_without_repeating_data(tmp_path: Path, shared_data: Path) -> None:
    ckpt = tmp_path / "ckpt"
    base = TINY + ["--fsdp", "--data-dir", str(shared_data), "--num-workers", "0", "--checkpoint-dir", str(ckpt)]
    pause = tmp_path / "paused"
    job = start_job(base + ["--pause-at", "6:0", "--pause-file", str(pause), "--record-samples",
                            str(tmp_path / "four")], tmp_path / "a0.log", job_env(WMCTL_ATTEMPT="0"), nproc=4)
    wait_until(pause.exists, 240, job, "pause at step 6 (4 ranks)")
    _kill(job)
    assert committed_step(ckpt) == 4
    assert (marker := read_marker(ckpt / "step-00000004")) is not None and marker["world_size"] == 4

    job = start_job(base + ["--record-samples", str(tmp_path / "two")], tmp_path / "a1.log",
                    job_env(WMCTL_ATTEMPT="1"), nproc=2)
    job.completed()
    resumed = job.events("resume")
    assert len(resumed) == 1 and resumed[0]["step"] == 4 and resumed[0]["exact"] is False
    assert resumed[0]["reason"] == "world size changed from 4 to 2"
    assert "world size changed from 4 to 2" in job.text()      # rank 0's note on stderr as well
    assert job.events("exit")[-1]["status"] == "completed"

    # The epoch interrupted at step 4 goes on with the samples the 4 ranks had not reached:
    # together the two runs see each of its 40 clips once.
    epoch = max(rec["epoch"] for rec in _records(tmp_path / "four", 4) if rec["step"] == 4)
    before = _consumed(tmp_path / "four", 4, steps=range(1, 5), epoch=epoch)
    after = _consumed(tmp_path / "two", 2, steps=range(5, 17), epoch=epoch)
    assert before and after and not before & after
    assert len(before | after) == 40


def _records(prefix: Path, world: int) -> list[dict[str, Any]]:
    import json

    out = []
    for r in range(world):
        out += [json.loads(line) for line in Path(f"{prefix}.rank-{r}").read_text().splitlines() if line.strip()]
    return out


def _consumed(prefix: Path, world: int, steps: range, epoch: int) -> set[int]:
    return {i for rec in _records(prefix, world) if rec["step"] in steps and rec["epoch"] == epoch
            for i in rec["indices"]}
