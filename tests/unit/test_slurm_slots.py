"""Spare nodes on Slurm: what the engine reads from an attempt's folder (slots.py), on real files
written as the keeper and the batch script write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import layout
from orchestrator.backends.slurm import slots as S
from orchestrator.runtime import keeper as r


@pytest.fixture
def attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    folder = layout.attempt_dir("run", 0)
    layout.rounds_dir("run", 0).mkdir(parents=True)
    return folder


def _pid_file(folder: Path, slot: int, round_: int) -> None:
    (folder / f"node-{slot}.pid.json").write_text(json.dumps(
        {"keeper": 1, "agent": None if round_ < 0 else 2, "started": 0.0, "round": round_}))


def test_a_keepers_end_counts_in_its_own_round_only(attempt: Path):
    path = attempt / "node-1.exit.json"
    path.write_text(json.dumps({"exit_code": 1, "signal": None, "time": 5.0, "round": 0, "signalled": False}))
    end = S.keeper_end(path, 1, "n3", "42", 0)
    assert end is not None
    assert (end.node, end.host, end.exit_code, end.job_id, end.signalled) == (1, "n3", 1, "42", False)
    assert S.keeper_end(path, 1, "n3", "42", 1) is None          # round 1's slot has not ended
    path.write_text(json.dumps({"exit_code": 83, "time": 6.0, "round": 1, "signalled": True}))
    end = S.keeper_end(path, 1, None, "42", 1)
    assert end is not None and end.signalled and end.host == ""
    path.write_text("{half")
    assert S.keeper_end(path, 1, None, "42", 1) is None
    assert S.keeper_end(attempt / "node-9.exit.json", 9, None, "42", 0) is None


def test_idle_spares_are_the_waiting_slots_no_round_named_lowest_first(attempt: Path):
    rounds = layout.rounds_dir("run", 0)
    r.write_round(rounds, 0, [0, 1], "run-a0", {})
    for slot, round_ in ((0, 0), (1, 0), (2, -1), (3, -1)):
        _pid_file(attempt, slot, round_)
    history = r.all_rounds(rounds)
    assert S.idle_spares(history, attempt, [0, 1, 2, 3, 4]) == [2, 3]     # slot 4's keeper never started
    assert S.idle_spares(history, attempt, [0, 1, 3]) == [3]               # slot 2's node is not heard from
    n = S.next_round("run", 0, history, lost=1, spare=2)
    newest = r.newest_round(rounds)
    assert n == 1 and newest is not None
    assert newest["active"] == [0, 2] and newest["rdzv_id"] == "run-a0-r1"
    assert newest["env"] == {"WMCTL_RESUME": "1", "WMCTL_FENCE_EPOCH": "1"}
    assert S.idle_spares(r.all_rounds(rounds), attempt, [0, 1, 2, 3]) == [3]


def test_a_round_has_ended_when_every_slot_it_names_recorded_its_end_in_it(attempt: Path):
    rounds = layout.rounds_dir("run", 0)
    r.write_round(rounds, 0, [0, 1], "run-a0", {})
    r.write_round(rounds, 1, [0, 2], "run-a0-r1", {})
    assert not S.round_ended("run", 0, "42")
    for slot in (0, 1):
        (attempt / f"node-{slot}.exit.json").write_text(json.dumps({"exit_code": 83, "time": 1.0, "round": 1}))
    assert not S.round_ended("run", 0, "42")          # slot 2 of round 1 has not, slot 1 is not in it
    (attempt / "node-2.exit.json").write_text(json.dumps({"exit_code": 83, "time": 1.0, "round": 1}))
    assert S.round_ended("run", 0, "42")


def test_slot_hosts_and_step_ids_as_the_batch_script_writes_them(attempt: Path):
    assert S.slot_hosts(attempt) == [] and S.step_id(attempt, 0) is None
    (attempt / "slots.txt").write_text("n2\nn3\nn1\n")
    (attempt / "node-0.step").write_text("1\n")
    (attempt / "node-1.step").write_text("x; rm -rf /\n")
    assert S.slot_hosts(attempt) == ["n2", "n3", "n1"]
    assert S.step_id(attempt, 0) == "1" and S.step_id(attempt, 1) is None
