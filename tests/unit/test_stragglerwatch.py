"""The watcher's side of stragglers (stragglerwatch.py): the pace events a job's rank 0 prints,
folded by a real AttemptTracker into a real run store; what is said, recorded and shown, and when
a replacement is due (only after a checkpoint committed since the node was named; never without a
warm spare)."""

from __future__ import annotations

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.backends.local.engine import LocalBackend
from orchestrator.display import summary
from orchestrator.inplace import STRAGGLER
from orchestrator.panel import PanelState, rows
from orchestrator.state import AttemptRecord, LocalRunStore, RunRecord
from orchestrator.stragglers import off_reason
from orchestrator.stragglerwatch import Pending, detector, settle, tend
from orchestrator.tracker import AttemptTracker
from orchestrator.watchview import News

from .helpers import spec_from

BASE = {"name": "sw", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "x:1"}}
NODES = [b.NodeStatus(0, b.RUNNING, "localhost-0"), b.NodeStatus(1, b.RUNNING, "localhost-1")]


def progress(p: dict) -> b.Observation:
    return b.Observation([b.Event(b.PROGRESS, node=0, host="localhost-0", progress=p)], NODES)


def pace(steps: int, slow: float = 50.0) -> dict:
    return {"event": "pace", "steps": steps, "nodes": {"0": {"reach_ms": 2.0, "host": "localhost-0"},
                                                       "1": {"reach_ms": slow, "host": "localhost-1"}}}


def setup(tmp_path, restart: dict):
    spec = spec_from({**BASE, "restart": {"straggler_window": 10, **restart}})
    store = LocalRunStore("sw", home=tmp_path)
    rec = AttemptRecord(attempt=0, submitted_at=0.0)
    record = RunRecord(run="sw", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=True,
                       attempts=[rec])
    tracker = AttemptTracker(started_at=0.0, stragglers=detector(spec))
    return spec, store, rec, record, tracker


def drive(spec, store, rec, record, tracker, pending, said, events):
    out = None
    for i, p in enumerate(events):
        tracker.feed(progress(p), float(i))
        out = tend(spec, LocalBackend(), rec, tracker, store, record, pending, said.append, float(i)) or out
    return out


def test_warn_names_the_node_with_its_figures_in_status_describe_and_the_panel(tmp_path):
    spec, store, rec, record, tracker = setup(tmp_path, {})
    said: list[str] = []
    due = drive(spec, store, rec, record, tracker, Pending(), said,
                [pace(s) for s in range(5, 30, 5)] + [{"event": "checkpoint", "step": 25}, pace(35)])
    assert due is None      # warn: never replaced
    assert said == ["attempt 0: node localhost-1 is a straggler: 50.0 ms/step to reach the collective against a "
                    "median of 2.0 ms on the other nodes (25.00x, restart.straggler_ratio 1.3) since step 5 "
                    "(restart.stragglers=warn: warned only)"]
    assert rec.paced and [(s["host"], s["ms_per_step"], s["median_ms"], s["since_step"]) for s in rec.stragglers] \
        == [("localhost-1", 50.0, 2.0, 5)]
    assert "straggler node localhost-1: 50.0 ms/step to reach the collective against a median of 2.0 ms" in \
        summary(record)
    state = PanelState()
    state.fold(News(record, rec, NODES, [], None, 600.0, None, []))
    assert any(r.label == "straggler" and "localhost-1: 50.0 ms/step" in r.value for r in rows(state, 1.0))


def test_replace_waits_for_a_checkpoint_committed_after_the_node_was_named(tmp_path):
    spec, store, rec, record, tracker = setup(tmp_path, {"stragglers": "replace", "spares": 1})
    tracker.feed(progress({"event": "checkpoint", "step": 10}), 0.0)
    said: list[str] = []
    pending = Pending()
    assert drive(spec, store, rec, record, tracker, pending, said, [pace(s) for s in range(5, 30, 5)]) is None
    assert "a spare takes its place at the next checkpoint" in said[0]
    due = drive(spec, store, rec, record, tracker, pending, said, [{"event": "checkpoint", "step": 30}])
    assert isinstance(due, F.Failure) and (due.kind, due.node, due.host) == (STRAGGLER, 1, "localhost-1")
    assert due.evidence.startswith("50.0 ms/step to reach the collective")
    settle(rec, "localhost-1", replaced=False)
    assert rec.stragglers[0]["action"] == "warned: no spare node was warm to replace it"


def test_replace_without_a_spare_warns_saying_why_and_a_node_that_catches_up_is_cleared(tmp_path):
    spec, store, rec, record, tracker = setup(tmp_path, {"stragglers": "replace"})
    said: list[str] = []
    pending = Pending()
    due = drive(spec, store, rec, record, tracker, pending, said,
                [pace(s) for s in range(5, 30, 5)]
                + [{"event": "checkpoint", "step": 30}, {"event": "step", "step": 33}, pace(35, slow=2.0)])
    assert due is None
    assert said[0].endswith("restart.stragglers=replace but restart.spares is 0: warned only")
    assert said[1] == "attempt 0: the node of group rank 1 is no longer a straggler"
    assert (rec.stragglers[0]["cleared_step"], rec.stragglers[0]["action"]) == (33, "warned")
    assert "caught up by step 33" in summary(record)


def test_a_one_node_job_has_no_detector_and_describe_says_why_nothing_was_looked_for():
    assert detector(spec_from({**BASE, "nodes": 1})) is None
    assert off_reason(1, False) == "not looked for: one node, nothing to compare it with"
    assert "StepTimer" in (off_reason(2, False) or "")
    assert off_reason(2, True) is None
