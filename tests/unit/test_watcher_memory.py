"""The watcher's memory stays flat for a run of any length (issue 22, item 5): what it holds per
attempt does not grow with the number of lines a job prints."""

from __future__ import annotations

from typing import Any

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.tracker import AttemptTracker


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


def test_carriage_returns_end_lines_so_a_progress_bar_is_a_sign_of_life_and_shown():
    # tqdm-like: one redraw after another, no newline for as long as it runs
    split = b.LineSplitter()
    lines = []
    for pct in range(100):
        lines += split.feed(f"\r{pct:3d}%|{'#' * (pct // 10):10s}| {pct}/100".encode())
    lines = [line for line in lines if line]      # the empty line before the first '\r'
    assert len(lines) == 99 and lines[-1] == b" 98%|######### | 98/100"
    assert len(split.pending) < 40          # only the redraw in progress is held
    out: dict[int, float] = {}
    ev = b.line_event(lines[-1].decode(), 0, "h", out, stamp=None)
    assert ev is not None and ev.kind == b.OUTPUT and ev.message == " 98%|######### | 98/100"
    # '\r\n' is one line end, a progress line after a redraw is still a progress line
    got = split.feed(b"\r\nWMCTL-PROGRESS {\"event\": \"step\", \"step\": 7}\n")
    assert [g for g in got if g] == [b" 99%|######### | 99/100", b'WMCTL-PROGRESS {"event": "step", "step": 7}']


def test_a_redrawn_line_read_whole_shows_its_last_redraw():
    # Docker and the kubelet stamp by newline: a redrawn bar arrives as one line
    ev = b.output_event({}, 0, None, "\r 10%|#\r 20%|##\r 30%|###\r", now=5.0)
    assert ev is not None and ev.message == " 30%|###"


def test_a_huge_line_is_cut_with_a_marker_not_dropped():
    split = b.LineSplitter(limit=1000)
    got = split.feed(b"before\n" + b"x" * 5000)
    assert got == [b"before", b"x" * 1000 + b.CUT_MARKER]
    assert split.pending == b""            # the rest of the line is not held
    got = split.feed(b"y" * 5000)
    assert got == [] and split.pending == b""
    got = split.feed(b"z" * 10 + b"\nafter\n")
    assert got == [b"after"]               # the cut line's tail skipped; the next line whole
    assert b.cut_line("a" * 70000).endswith(b.CUT_MARKER.decode())
    assert len(b.cut_line("a" * 70000)) == b.MAX_LINE_BYTES + len(b.CUT_MARKER)
    assert b.cut_line("short") == "short"


def test_the_default_splitter_holds_at_most_max_line_bytes_of_an_endless_line():
    split = b.LineSplitter()
    got = []
    for _ in range(100):
        got += split.feed(b"." * 10000)
        assert len(split.pending) <= b.MAX_LINE_BYTES
    assert got == [b"." * b.MAX_LINE_BYTES + b.CUT_MARKER]


def test_a_splitter_refuses_a_limit_below_one_byte():
    import pytest
    with pytest.raises(ValueError, match="limit"):
        b.LineSplitter(limit=0)


def test_the_local_engine_reads_a_progress_bar_without_newlines_as_liveness_and_shows_it(tmp_path, monkeypatch):
    from orchestrator.backends.local.engine import LocalBackend, _NodeWatch

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    ref = b.AttemptRef("local", "bar", 0)
    w = _NodeWatch(ref, 0)
    w.log.parent.mkdir(parents=True)
    with open(w.log, "wb") as fh:
        fh.write(b"starting\n" + b"".join(f"\r{i}/500 it".encode() for i in range(500)))
    events = LocalBackend._read_progress(LocalBackend.__new__(LocalBackend), w)
    # the output heartbeat: at most one per node per OUTPUT_EVERY_S, from the first line on
    assert [ev.kind for ev in events] == [b.OUTPUT] and events[0].message == "starting"
    w.output_at.clear()                     # a second later: the newest redraw is the one shown
    with open(w.log, "ab") as fh:
        fh.write(b"\r500/500 it")
    events = LocalBackend._read_progress(LocalBackend.__new__(LocalBackend), w)
    assert [ev.message for ev in events] == ["499/500 it"]
    assert len(w.lines.pending) < 20        # no redraw is held but the one in progress

    t = AttemptTracker(started_at=0.0)
    t.feed(b.Observation(events, [b.NodeStatus(0, b.RUNNING)]), 100.0)
    assert t.last_heartbeat == 100.0        # a sign of life


def test_the_watcher_remembers_a_bounded_number_of_progress_lines():
    from orchestrator.keptmetrics import RECENT_KEYS, KeptMetrics, metric_key

    once = metric_key({"event": "step", "step": 1, "time": 1.0, "attempt": 0, "seen": 9.0})
    kept = KeptMetrics({once})
    assert not kept.first(metric_key({"event": "step", "step": 1, "time": 1.0}))  # an earlier watcher kept it
    assert not kept.stored                          # ... and forgotten once seen again
    for step in range(2, 50002):
        assert kept.first(metric_key({"event": "step", "step": step, "time": float(step)}))
    assert not kept.first(metric_key({"event": "step", "step": 50001, "time": 50001.0}))  # delivered twice: kept once
    assert len(kept.recent) == len(kept.order) == RECENT_KEYS


def test_lines_alike_but_for_what_they_say_are_each_kept():
    """A restore that walks past damaged checkpoints reports each within one millisecond and
    without a step: each is its own line, where event, step and time alone made them one."""
    from orchestrator.keptmetrics import KeptMetrics, metric_key

    kept = KeptMetrics()
    said = [{"event": "checkpoint_damaged", "time": 5.123, "damaged_step": s, "reason": r}
            for s, r in ((25, "digest"), (20, "meta"), (15, "marker"))]
    assert [kept.first(metric_key(e)) for e in said] == [True, True, True]
    assert [kept.first(metric_key(e)) for e in said] == [False, False, False]


def test_an_adopting_watcher_reads_the_store_as_a_stream_and_keeps_a_bounded_history():
    from orchestrator.keptmetrics import HISTORY_STEPS, adopted_metrics

    def stream():
        yield {"event": "start", "attempt": 0, "max_steps": 30000, "time": 0.0}
        for step in range(1, 30001):
            yield {"event": "step", "attempt": 0, "step": step, "time": float(step)}
            if step % 10000 == 0:
                yield {"event": "checkpoint", "attempt": 0, "step": step, "time": float(step)}
        yield {"event": "resume", "attempt": 1, "step": 30000, "time": 30001.0}
        yield {"event": "step", "attempt": 1, "step": 30001, "time": 30002.0}

    kept, history = adopted_metrics(stream(), 1, history=True)
    assert len(history) == 1 + 3 + HISTORY_STEPS
    assert history[0]["event"] == "start" and history[-1]["event"] == "checkpoint"
    assert [h["step"] for h in history if h["event"] == "step"] == list(range(30001 - HISTORY_STEPS, 30001))
    assert {k[:3] for k in kept.stored} == {("resume", 30000, 30001.0), ("step", 30001, 30002.0)}
    assert adopted_metrics(stream(), 1, history=False)[1] == []


def _write_metrics(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for step in range(n):
            fh.write(f'{{"attempt":0,"event":"step","loss":0.5,"samples":{step * 32},"seen":{step}.5,'
                     f'"step":{step},"time":{step}.25,"timing":{{"step_s":0.1,"data_share":0.1}}}}\n')
        fh.write('{"attempt":0,"event":"st')           # a torn last line: skipped


def test_metrics_are_read_as_a_stream_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    from orchestrator import layout, runs
    from orchestrator.state import LocalRunStore, RunRecord

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    store = LocalRunStore("long")
    store.save(RunRecord(run="long", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=True))
    _write_metrics(layout.run_dir("long") / layout.METRICS_FILE, 50000)

    tracemalloc.start()
    try:
        count = last = 0
        for e in runs.iter_metrics("long", attempt=0):
            count, last = count + 1, e["step"]
        _, streamed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        whole = runs.metrics("long")
        _, list_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50000 and last == 49999 and len(whole) == 50000
    assert streamed_peak < 1_000_000            # one event at a time, whatever the file's length
    assert list_peak > 20 * streamed_peak       # what holding them all costs, for scale


def test_metrics_json_printed_a_row_at_a_time_is_what_one_dump_of_all_prints(capsys):
    import json

    from orchestrator.commands.metrics import _echo_json

    cases: list[list[dict[str, Any]]] = [[], [{"a": 1}], [{"a": 1, "b": {"c": [1, 2]}}, {"a": None}, {"a": "x"}]]
    for rows in cases:
        _echo_json(iter(rows))
        assert capsys.readouterr().out == json.dumps(rows, indent=2) + "\n"


def test_metrics_appended_through_one_open_file_are_read_at_once_and_after_a_delete_anew(tmp_path):
    from orchestrator.state import LocalRunStore

    store = LocalRunStore("m", home=tmp_path)
    store.append_metric({"event": "step", "step": 1})
    assert LocalRunStore("m", home=tmp_path).metrics() == [{"event": "step", "step": 1}]   # flushed per line
    store.append_metric({"event": "step", "step": 2})
    assert [e["step"] for e in LocalRunStore("m", home=tmp_path).metrics()] == [1, 2]
    store.delete()
    store.append_metric({"event": "step", "step": 3})
    assert LocalRunStore("m", home=tmp_path).metrics() == [{"event": "step", "step": 3}]
