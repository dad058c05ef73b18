"""One line of a node's output into an event, the same on the local, Docker and Kubernetes
backends (base.line_event): progress lines, the output heartbeat, the witness's stream."""

from __future__ import annotations

import json
import time

from orchestrator.backends import base as b
from orchestrator.runtime.protocol import PROGRESS_PREFIX, format_progress


def _line(**payload: object) -> str:
    return "[rank0]: " + PROGRESS_PREFIX + json.dumps(payload)


def test_a_progress_line_is_a_progress_event_at_its_own_time():
    ev = b.line_event(format_progress("step", step=7), 0, "host-0", {}, stamp=1.0)
    assert ev is not None and ev.kind == b.PROGRESS and (ev.node, ev.host) == (0, "host-0")
    assert ev.progress is not None and ev.progress["step"] == 7
    assert ev.time == ev.progress["time"] != 1.0


def test_a_progress_line_without_a_numeric_time_takes_the_engines_stamp_else_now():
    for bad in ({}, {"time": "soon"}, {"time": True}):
        ev = b.line_event(_line(event="step", **bad), 2, None, {}, stamp=1234.5)
        assert ev is not None and ev.kind == b.PROGRESS and ev.time == 1234.5 and ev.node == 2
    before = time.time()
    ev = b.line_event(_line(event="step", time="soon"), 0, None, {})
    assert ev is not None and isinstance(ev.time, float) and before <= ev.time <= time.time()


def test_any_other_line_is_the_output_heartbeat_once_per_node_per_interval():
    seen: dict[int, float] = {}
    ev = b.line_event("loss 0.25\n", 1, "host-1", seen)
    assert ev is not None and ev.kind == b.OUTPUT and ev.message == "loss 0.25" and ev.node == 1
    assert seen[1] == ev.time
    seen[1] = time.time() + 3600          # the last heartbeat is (far) within OUTPUT_EVERY_S
    assert b.line_event("loss 0.24", 1, "host-1", seen) is None
    assert b.line_event("   ", 0, "host-0", seen) is None     # an empty line is no sign of life


def test_the_witness_stream_gives_only_its_reports_about_group_rank_0():
    out: dict[int, float] = {}
    assert b.line_event("loss 0.25", 1, "host-1", out, witness=True) is None
    assert out == {}                     # nor does it use up node 1's heartbeat
    assert b.line_event(format_progress("step", step=3), 1, "host-1", out, witness=True) is None
    assert b.line_event(format_progress("node_silent", group_rank=2), 1, "host-1", out, witness=True) is None
    ev = b.line_event(format_progress("node_silent", group_rank=0), 1, "host-1", out, witness=True)
    assert ev is not None and ev.kind == b.PROGRESS and ev.node == 1 and ev.progress is not None
    assert ev.progress["event"] == "node_silent"
