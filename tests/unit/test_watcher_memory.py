"""The watcher's memory stays flat for a run of any length (issue 22, item 5): what it holds per
attempt does not grow with the number of lines a job prints."""

from __future__ import annotations

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.supervisor import AttemptTracker


def test_a_tracker_fed_many_progress_events_holds_a_bounded_number():
    t = AttemptTracker(started_at=0.0)
    nodes = [b.NodeStatus(0, b.RUNNING), b.NodeStatus(1, b.RUNNING)]
    for step in range(1, 20001):
        evs = [b.Event(b.PROGRESS, float(step), 0, progress={"event": "step", "step": step, "loss": 1.0}),
               b.Event(b.OUTPUT, float(step), 0, message=f"line {step}")]
        if step % 1000 == 0:
            evs.append(b.Event(b.PROGRESS, float(step), 0, progress={"event": "checkpoint", "step": step}))
        t.feed(b.Observation(evs, nodes), float(step))
    assert len(t.events) == 0          # nothing a root cause is found in: nothing kept
    assert t.last_step == 20000 and t.last_checkpoint_step == 20000 and t.first_step_at == 1.0
    # the evidence of a failure is still kept, and found
    t.feed(b.Observation([b.Event(b.NODE_EXITED, 20001.0, 1, exit_code=1)], nodes), 20001.0)
    assert len(t.events) == 1
    found = t.failure(20001.0, heartbeat_timeout=600.0)
    assert found is not None and found.kind == F.APP_ERROR and found.node == 1
