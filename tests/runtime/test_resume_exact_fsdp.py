"""The example world model sharded with FSDP2 (--fsdp) under real torchrun (gloo, CPU), its
checkpoints sharded through torch.distributed.checkpoint, killed with SIGKILL and resumed.

Chain on 2 ranks, async checkpoints: conftest.sigkill_resume_chain, the one test_resume_exact.py
runs for DDP (killed mid-accumulation, while checkpoint 12 is written, just after it committed;
then to the end), with the shards checked in the marker and the torn folder.
Final weights, optimizer state and scheduler equal an uninterrupted FSDP2 run's bit for bit,
and so does every rank's sequence of samples.

4 -> 2 is tested through the watcher (tests/integration/test_local_fsdp.py: not exact and why, no
sample repeated) and in the checkpoint manager (test_checkpoint_sharded.py: the same weights,
resharded).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.conftest import (TINY, assert_bit_identical, effective_samples, sigkill_resume_chain)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


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
