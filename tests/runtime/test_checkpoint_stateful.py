"""register(states=...): any object with state_dict()/load_state_dict() (torch's Stateful), as
torchtitan checkpoints one dict of them, beside the model, optimizer and the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.runtime.checkpoint import (COMMIT_MARKER, META_FILE, CheckpointError, CheckpointManager, Stateful,
                                             file_digest, rank_file_name, read_marker)
from tests.runtime.test_checkpoint import Toy, same


class TrainState:
    """A user's own state: counters, a tensor history and nested plain data."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens = 0
        self.losses = torch.zeros(0)
        self.best: dict[str, Any] = {"loss": float("inf"), "at": None}

    def advance(self, loss: float) -> None:
        self.step += 1
        self.tokens += 1000 + self.step
        self.losses = torch.cat([self.losses, torch.tensor([loss])])
        if loss < self.best["loss"]:
            self.best = {"loss": loss, "at": [self.step, "epoch-0"]}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "losses": self.losses, "best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = state_dict["step"]
        self.tokens = state_dict["tokens"]
        self.losses = state_dict["losses"].clone()
        self.best = dict(state_dict["best"])

    def fingerprint(self) -> tuple[Any, ...]:
        return self.step, self.tokens, self.losses.tolist(), self.best


def train(toy: Toy, state: TrainState, steps: int) -> None:
    for _ in range(steps):
        toy.step()
        state.advance(float(torch.rand(1)))


@pytest.mark.parametrize("async_save", [False, True])
def test_a_user_stateful_is_saved_and_restored_exactly(tmp_path: Path, async_save: bool) -> None:
    toy, state = Toy(), TrainState()
    assert isinstance(state, Stateful)
    mgr = toy.manager(tmp_path, async_save=async_save)
    mgr.register(states={"train_state": state})
    train(toy, state, 3)
    mgr.save(3)
    expected, expected_toy = state.fingerprint(), toy.fingerprint()
    train(toy, state, 2)              # training goes on: the checkpoint keeps step 3
    mgr.close()
    assert state.fingerprint() != expected

    fresh, fresh_state = Toy(seed=5), TrainState()
    resumed = fresh.manager(tmp_path)
    resumed.register(states={"train_state": fresh_state})
    info = resumed.restore()
    assert info is not None and info.step == 3 and info.exact and not info.warnings
    assert fresh_state.fingerprint() == expected
    assert same(fresh.fingerprint(), expected_toy)
    # Each rank's own: in the rank file, beside its RNG and sampler.
    saved = torch.load(info.path / rank_file_name(0), weights_only=False)
    assert saved["states"]["train_state"]["step"] == 3


def test_a_state_the_checkpoint_lacks_is_left_as_it_is_with_a_word(tmp_path: Path) -> None:
    toy = Toy()
    mgr = toy.manager(tmp_path)
    toy.step()
    mgr.save(1)
    later = TrainState()
    later.advance(0.5)
    resumed = Toy(seed=2).manager(tmp_path)
    resumed.register(states={"ema": later})
    info = resumed.restore()
    assert info is not None and info.step == 1
    assert later.step == 1 and any("'ema' is not in this checkpoint" in w for w in info.warnings)


class OnlySaves:
    def state_dict(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize(("states", "match"), [
    ({"lr": 0.1}, r"register\(states=\{'lr': \.\.\.\}\): a float has no state_dict\(\) and no load_state_dict\(\)"),
    ({"half": OnlySaves()}, r"'half'.*OnlySaves has no load_state_dict\(\)\. register\(\) takes objects with both"),
    ({"cls": TrainState}, r"'cls'.*TrainState is a class; register an instance of it"),
    ({"": TrainState()}, r"the name '' is not a non-empty string"),
    ([TrainState()], r"register\(states=\.\.\.\) takes a dict of name -> object, not a list"),
])
def test_a_wrong_object_is_refused_naming_what_it_needs(tmp_path: Path, states: Any, match: str) -> None:
    mgr = CheckpointManager(tmp_path)
    good = TrainState()
    with pytest.raises(CheckpointError, match=match):
        mgr.register(model=torch.nn.Linear(2, 2), states=states)
    # Refused whole: nothing of that call was taken.
    mgr.register(states={"ok": good})
    assert mgr.save(1).exists() and "model" not in mgr._objects


def test_the_keywords_refuse_a_wrong_object_too(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"register\(scheduler=\.\.\.\): a str has no state_dict\(\)"):
        CheckpointManager(tmp_path).register(scheduler="cosine")


def test_on_another_world_size_every_rank_gets_rank_0s_states(tmp_path: Path) -> None:
    """A checkpoint of 2 ranks resumed by 1: no rank file of its own, so rank 0's (as for the
    sampler). Simulated by a meta.json that says 2 ranks, its marker entry updated to match."""
    toy, state = Toy(), TrainState()
    mgr = toy.manager(tmp_path)
    mgr.register(states={"train_state": state})
    train(toy, state, 2)
    path = mgr.save(2)
    expected = state.fingerprint()
    meta = json.loads((path / META_FILE).read_text())
    (path / META_FILE).write_text(json.dumps({**meta, "world_size": 2}))
    marker = read_marker(path)
    assert marker is not None
    marker["files"][META_FILE] = (path / META_FILE).stat().st_size
    marker["digests"][META_FILE] = file_digest(path / META_FILE)
    (path / COMMIT_MARKER).write_text(json.dumps(marker))

    fresh = TrainState()
    resumed = Toy(seed=4).manager(tmp_path)
    resumed.register(states={"train_state": fresh})
    info = resumed.restore()
    assert info is not None and not info.exact and "world size changed from 2 to 1" in info.reason
    assert fresh.fingerprint() == expected
