"""What the supervisor tells a watcher's view (orchestrator.supervisor.WatchView): every line,
stamped with the time of what it reports (a replayed progress line keeps the job's own time), and
news the live panel folds: the attempt and its nodes, the events, the hang clock, the backoff."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.backends import base as b
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import AttemptRecord, RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile

from .helpers import spec_from
from .test_supervisor import START, Clock, ScriptedBackend, done, running

JOB_TIME = START - 500.0       # the job printed these lines long before this watcher read them


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    return tmp_path


class RecordingView:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lines: list[tuple[str, float | None]] = []
        self.news_seen: list = []
        self.told_at: list[float] = []

    def line(self, text: str, at: float | None = None) -> None:
        self.lines.append((text, at))

    def news(self, news) -> None:
        self.news_seen.append(news)
        self.told_at.append(self.clock.now)


def line_at(step: int) -> b.Event:
    return b.Event(b.PROGRESS, JOB_TIME + step, 0, "host-0",
                   progress={"event": "step", "step": step, "loss": 0.5, "time": JOB_TIME + step})


def test_lines_carry_event_times_and_news_carries_the_backoff(home):
    spec = spec_from({"name": "view", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 3, "backoff": "5s", "heartbeat_timeout": "60s"}})
    clock = Clock()
    backend: Any = ScriptedBackend(clock, {
        0: [([], [b.NodeStatus(i, b.PENDING) for i in range(2)]),
            ([line_at(1), b.Event(b.PROGRESS, JOB_TIME + 2, 0, "host-0",
                                  progress={"event": "checkpoint", "step": 2, "time": JOB_TIME + 2})], running()),
            ([b.Event(b.NODE_LOST, clock.now + 3, 1, None, reason="NodeNotReady")], running())],
        1: [([line_at(3)], done())],
    })
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend=backend.name, spec_path="v.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    view = RecordingView(clock)
    outcome = Supervisor(spec, load_profile("cpu"), backend, store, record, view,
                         SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0)).run()
    assert outcome.exit_code == 0

    stamped = dict(view.lines)
    assert stamped["attempt 0: step 1 loss 0.5"] == JOB_TIME + 1              # the job's time, not the read's
    assert stamped["attempt 0: checkpoint committed at step 2"] == JOB_TIME + 2
    assert stamped["attempt 1: step 3 loss 0.5"] == JOB_TIME + 3
    assert stamped["attempt 0 submitted on scripted (2 node(s))"] is None      # the watcher's own news: now

    first = view.news_seen[0]
    assert first.attempt.attempt == 0 and first.heartbeat_at is None           # nothing runs yet: no hang clock
    ticking = [n for n in view.news_seen if n.attempt.attempt == 0 and n.heartbeat_at is not None]
    assert ticking and ticking[0].heartbeat_timeout_s == 60.0
    backoff = [n for n in view.news_seen if n.backoff_until is not None]
    assert len(backoff) == 1
    failed = backoff[0]
    assert failed.attempt.attempt == 0 and failed.attempt.outcome == "node_lost" and failed.attempt.decision
    assert failed.backoff_until == view.told_at[view.news_seen.index(failed)] + 5.0
    after = view.news_seen[view.news_seen.index(failed) + 1]
    assert after.attempt.attempt == 1 and after.backoff_until is None
    assert any(ev.progress and ev.progress["step"] == 1 for n in view.news_seen for ev in n.events)
    assert view.news_seen[-1].record.status == "succeeded"


def test_a_watcher_adopting_a_running_attempt_keeps_each_replayed_event_once(home):
    """The attempt's output is read from the start again: lines are shown again, metrics kept once."""
    spec = spec_from({"name": "adopt", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 2, "backoff": "0s", "heartbeat_timeout": "60s"}})
    clock = Clock()
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="scripted", spec_path="a.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    record.attempts.append(AttemptRecord(0, START - 100))     # submitted by a watcher that has gone
    store.save(record)
    first = line_at(1)
    assert first.progress is not None
    store.append_metric({**first.progress, "attempt": 0, "seen": START - 50})    # kept by that watcher
    backend: Any = ScriptedBackend(clock, {0: [([first, line_at(2)], running()), ([], done())]})
    view = RecordingView(clock)
    Supervisor(spec, load_profile("cpu"), backend, store, record, view,
               SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0)).run()
    assert [m["step"] for m in store.metrics() if m["event"] == "step"] == [1, 2]
    assert ("attempt 0: step 1 loss 0.5", JOB_TIME + 1) in view.lines      # shown again, at its own time
    assert all(not n.history for n in view.news_seen)        # the backend replays this attempt: no history


def test_a_watcher_taking_up_a_later_attempt_hands_the_view_what_earlier_ones_kept(home):
    spec = spec_from({"name": "later", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s"}})
    clock = Clock()
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="scripted", spec_path="l.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    record.attempts += [AttemptRecord(0, START - 100, outcome="node_lost", decision="retry", last_step=1),
                        AttemptRecord(1, START - 50)]
    store.save(record)
    first = line_at(1)
    assert first.progress is not None
    store.append_metric({**first.progress, "attempt": 0, "seen": START - 90})
    backend: Any = ScriptedBackend(clock, {1: [([line_at(2)], running()), ([], done())]})
    view = RecordingView(clock)
    Supervisor(spec, load_profile("cpu"), backend, store, record, view,
               SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0)).run()
    assert [[m["step"] for m in n.history] for n in view.news_seen if n.history] == [[1]]
    assert view.news_seen[0].history and view.news_seen[0].attempt.attempt == 1
