"""Fencing: the checkpoint root remembers the newest attempt started on it, and an older attempt
that is still running (a partition, a hung node the supervisor gave up on) can no longer commit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.runtime import checkpoint as ck
from orchestrator.runtime.checkpoint import (ATTEMPT_FILE, CheckpointError, latest_complete, list_checkpoints,
                                             read_attempt)
from tests.runtime.conftest import committed_step, restored, run_gloo_ranks
from tests.runtime.test_checkpoint import Toy


def test_an_older_attempts_save_is_refused_once_a_newer_one_started(tmp_path: Path) -> None:
    old = Toy()
    m0 = old.manager(tmp_path, attempt=0)
    old.step()
    m0.save(1)
    assert read_attempt(tmp_path) == 0

    new = Toy(seed=1)
    m1 = new.manager(tmp_path, attempt=1)     # the supervisor gave up on attempt 0 and started 1
    assert (tmp_path / ATTEMPT_FILE).read_text().strip() == "1"
    old.step()
    with pytest.raises(CheckpointError) as err:
        m0.save(2)
    assert "attempt 0" in str(err.value) and "attempt 1" in str(err.value) and "stale" in str(err.value)
    assert committed_step(tmp_path) == 1
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]     # refused before it wrote anything

    new.step()
    new.step()
    m1.save(2)
    assert committed_step(tmp_path) == 2
    assert restored(Toy(seed=2).manager(tmp_path, attempt=1)).step == 2


def test_a_newer_attempt_starting_during_a_save_stops_its_commit(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    old = Toy()
    m0 = old.manager(tmp_path, attempt=2, async_save=True)
    old.step()
    real = ck._test_sleep_before_commit

    def newer_attempt_starts(step: int) -> None:   # between the rank files and the marker
        Toy(seed=3).manager(tmp_path, attempt=3)
        real(step)
    monkeypatch.setattr(ck, "_test_sleep_before_commit", newer_attempt_starts)
    m0.save(5)
    with pytest.raises(CheckpointError, match="this is attempt 2, but attempt 3 has started"):
        m0.wait()
    assert latest_complete(tmp_path) is None
    assert [(c.step, c.committed) for c in list_checkpoints(tmp_path)] == [(5, False)]


def test_the_recorded_attempt_never_goes_back_within_a_submission(tmp_path: Path) -> None:
    Toy().manager(tmp_path, attempt=4)
    Toy().manager(tmp_path, attempt=2)           # a stale attempt that started late
    assert read_attempt(tmp_path) == 4
    # A new submission of the run starts at attempt 0 again and resumes from the same root.
    m = Toy().manager(tmp_path, attempt=0)
    assert read_attempt(tmp_path) == 0
    m.save(1)
    assert committed_step(tmp_path) == 1


def test_without_an_attempt_number_nothing_is_fenced(tmp_path: Path) -> None:
    Toy().manager(tmp_path, attempt=7)
    toy = Toy()
    m = toy.manager(tmp_path)                    # outside wmctl: no WMCTL_ATTEMPT
    assert m.attempt is None
    m.save(1)
    assert committed_step(tmp_path) == 1 and read_attempt(tmp_path) == 7


# Two gloo ranks, sync saves: a newer attempt starts between the rank files and rank 0's marker.
# The refusal happens on rank 0 alone; rank 1 must fail too, not hang in the closing barrier.
RANKS = textwrap.dedent("""
    import json, sys
    import torch
    from orchestrator.runtime import checkpoint as ck
    from orchestrator.runtime import dist
    dist.init_from_env()
    root = sys.argv[1]
    m = ck.CheckpointManager(root, attempt=0)
    m.register(model=torch.nn.Linear(2, 2))
    m.save(1)
    if dist.rank() == 0:
        ck._test_sleep_before_commit = lambda step: ck.record_attempt(root, 1)
    try:
        m.save(2)
        print(json.dumps({"rank": dist.rank(), "error": None}), flush=True)
    except ck.CheckpointError as err:
        print(json.dumps({"rank": dist.rank(), "error": str(err)}), flush=True)
    dist.barrier()
    dist.destroy()
""")


@pytest.mark.timeout(180)
def test_a_refused_commit_fails_every_rank(tmp_path: Path) -> None:
    done = run_gloo_ranks(RANKS, tmp_path, str(tmp_path / "ckpt"))
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    results = [json.loads(p.stdout.splitlines()[-1]) for p in done]
    assert "this is attempt 0, but attempt 1 has started" in results[0]["error"]
    assert "rank 0 failed to commit it" in results[1]["error"]
    assert committed_step(tmp_path / "ckpt") == 1


def test_a_round_a_spare_replaced_cannot_commit_once_the_next_round_started(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Spare nodes: each in-place recovery opens a new fencing epoch (WMCTL_FENCE_EPOCH), so a node
    of the older round that was cut off, not dead, can no longer commit."""
    from orchestrator.launch import fence_epoch
    from orchestrator.runtime.protocol import ENV_FENCE_EPOCH

    monkeypatch.setenv(ENV_FENCE_EPOCH, str(fence_epoch(1, 0)))
    old = Toy()
    m0 = old.manager(tmp_path, attempt=1)
    old.step()
    m0.save(1)
    monkeypatch.setenv(ENV_FENCE_EPOCH, str(fence_epoch(1, 1)))     # round 1: a spare took a node's place
    Toy(seed=1).manager(tmp_path, attempt=1)
    old.step()
    with pytest.raises(CheckpointError, match="fencing epoch 1000 of attempt 1, but epoch 1001"):
        m0.save(2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]
    # the next attempt outranks every round of this one
    assert fence_epoch(2, 0) > fence_epoch(1, 999)
