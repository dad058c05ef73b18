"""The straggler detector (orchestrator/stragglers.py): pace figures in, verdict out. No clock,
no processes: each case feeds the events a job's rank 0 would print, step by step."""

from __future__ import annotations

import random

import pytest

from orchestrator.errors import SpecError
from orchestrator.stragglers import Stragglers

from .helpers import spec_from


def pace(step: int, **ms: float) -> dict:
    return {"event": "pace", "steps": step,
            "nodes": {k.lstrip("n"): {"reach_ms": v, "host": f"host-{k.lstrip('n')}"} for k, v in ms.items()}}


def run(det: Stragglers, figures, steps: range, every: int = 1):
    """Feed one event per ``every`` steps; ``figures(step)`` gives the nodes' ms. Returns (step, new)
    for each event that declared someone, and the steps at which someone was cleared."""
    declared, cleared = [], []
    for step in steps[every - 1::every]:
        new, gone = det.feed(pace(step, **figures(step)), now=float(step))
        declared += [(step, s) for s in new]
        cleared += [(step, g) for g in gone]
    return declared, cleared


def test_noise_alone_is_never_a_straggler():
    rng = random.Random(7)
    det = Stragglers(ratio=1.3, window=20)
    declared, _ = run(det, lambda s: {f"n{g}": 100 * rng.uniform(0.85, 1.15) for g in range(4)}, range(1, 2001))
    assert declared == []


def test_a_brief_spike_is_not_flagged_a_sustained_slowdown_is():
    det = Stragglers(ratio=1.3, window=20)
    spike = set(range(50, 65))            # 15 slow steps: under the window
    declared, cleared = run(det, lambda s: {"n0": 100, "n1": 300 if s in spike else 100, "n2": 100}, range(1, 120))
    assert declared == [] and cleared == []
    # from step 200 on node 1 stays slow: named once the run of slow steps reaches 20
    declared, _ = run(det, lambda s: {"n0": 100, "n1": 150 if s >= 200 else 100, "n2": 101}, range(120, 300))
    assert [(step, s.group_rank) for step, s in declared] == [(219, 1)]
    s = declared[0][1]
    assert (s.host, s.ms, s.median_ms, s.since_step) == ("host-1", 150, 100.5, 200)
    text = s.describe(1.3)
    assert "host-1 is a straggler: 150.0 ms/step" in text and "median of 100.5 ms" in text and "since step 200" in text


def test_a_window_counts_steps_whatever_the_events_cover():
    det = Stragglers(ratio=1.3, window=20)
    declared, _ = run(det, lambda s: {"n0": 10, "n1": 20}, range(1, 100), every=7)
    # slow from the first event (step 7): step 7 + 20 - 1 = 26 is covered by the event at step 28
    assert [(step, s.group_rank) for step, s in declared] == [(28, 1)]


def test_a_straggler_that_recovers_is_cleared_and_counted_afresh():
    det = Stragglers(ratio=1.3, window=5)
    declared, cleared = run(det, lambda s: {"n0": 10, "n1": 30 if s < 20 or s >= 40 else 10}, range(1, 60))
    assert [step for step, _ in declared] == [5, 44]
    assert cleared == [(20, 1)]


def test_two_nodes_each_compared_with_the_median_of_the_others():
    det = Stragglers(ratio=1.3, window=10)
    declared, _ = run(det, lambda s: {"n0": 100, "n1": 100, "n2": 200, "n3": 210, "n4": 100}, range(1, 40))
    assert sorted(s.group_rank for _, s in declared) == [2, 3]
    # with two nodes only the slower one is over the other's figure
    det = Stragglers(ratio=1.3, window=10)
    declared, _ = run(det, lambda s: {"n0": 100, "n1": 140}, range(1, 40))
    assert [s.group_rank for _, s in declared] == [1]


def test_a_one_node_job_and_sub_millisecond_gaps_are_never_flagged():
    det = Stragglers(ratio=1.3, window=3)
    assert run(det, lambda s: {"n0": 500}, range(1, 50)) == ([], [])
    det = Stragglers(ratio=1.3, window=3)
    assert run(det, lambda s: {"n0": 0.02, "n1": 0.5}, range(1, 50)) == ([], [])


def test_events_that_are_not_pace_or_malformed_are_ignored():
    det = Stragglers(window=1)
    assert det.feed({"event": "step", "step": 3}, 0.0) == ([], [])
    assert det.feed({"event": "pace", "steps": "x", "nodes": {"0": {"reach_ms": 1}}}, 0.0) == ([], [])
    assert det.feed({"event": "pace", "steps": 1, "nodes": {"0": {"reach_ms": "9"}, "b": {}, "1": 3}}, 0.0) == ([], [])


BASE = {"name": "st", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "x:1"}}


def test_straggler_fields_default_and_leave_the_spec_hash_alone():
    plain = spec_from(BASE)
    r = plain.restart
    assert (r.stragglers, r.straggler_ratio, r.straggler_window) == ("warn", 1.3, 20)
    same = spec_from({**BASE, "restart": {"stragglers": "warn", "straggler_ratio": 1.3, "straggler_window": 20}})
    assert same.spec_hash() == plain.spec_hash()


@pytest.mark.parametrize("field,value", [("stragglers", "kill"), ("straggler_ratio", 1.0), ("straggler_ratio", "x"),
                                         ("straggler_window", 0)])
def test_bad_straggler_fields_are_refused_naming_the_field(field, value):
    with pytest.raises(SpecError) as err:
        spec_from({**BASE, "restart": {field: value}})
    assert f"restart.{field}" in str(err.value)
