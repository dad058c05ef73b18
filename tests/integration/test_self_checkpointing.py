"""A job that checkpoints itself (no orchestrator.runtime: plain torch.save and its own
``latest`` file, jobs/selfsave.py) still auto-resumes: the supervisor relaunches it after a
SIGKILL of its node, the job's own resume runs, and its hand-written progress lines give the
supervisor the checkpoint and resume steps it reports and bases its no-progress rule on."""

from __future__ import annotations

import pytest
import torch

from . import harness as h

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def expected(steps: int) -> str:
    state = torch.zeros((), dtype=torch.float64)
    for step in range(1, steps + 1):
        state += (step * 0.37) ** 0.5 / 3.0
    return float(state.item()).hex()


def test_a_self_checkpointing_job_is_resumed_and_its_checkpoints_reported(tmp_path):
    home, run = tmp_path / "home", "selfsave"
    home.mkdir()
    spec = h.write_spec(home, run, nodes=1, steps=40, every=10, sleep=0.2, job="selfsave.py")
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 10)
    assert h.kill_node(run, 0, 0) > 0
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    first, second = rec["attempts"]
    assert [first["outcome"], second["outcome"]] == ["node_lost", "succeeded"], w.output
    assert first["last_checkpoint_step"] >= 10
    assert second["resumed_from_step"] == first["last_checkpoint_step"]     # its own resume, reported
    assert second["last_checkpoint_step"] == 40
    assert f"attempt 1: resumed from step {first['last_checkpoint_step']}" in w.output
    assert "attempt 1: checkpoint committed at step 40" in w.output
    assert h.final_state(spec) == expected(40)
    assert not h.leftover_processes(run)
