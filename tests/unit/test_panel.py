"""The live panel's model (orchestrator/panel.py): news in, rows out, no terminal.

Each piece of news is what the supervisor sends (tests/unit/test_watch_view.py checks that it
does); the rows are what the panel shows at a given moment."""

from __future__ import annotations

from orchestrator import panel as P
from orchestrator.backends import base as b
from orchestrator.state import AttemptRecord, RunRecord
from orchestrator.watchview import News

T = 2_000_000_000.0
TIMING = {"step_s": 0.05, "compute_share": 0.6, "data_share": 0.3, "comm_share": 0.1, "other_share": 0.0,
          "bottleneck": "compute"}


def record(*attempts: AttemptRecord, status: str = "running") -> RunRecord:
    rec = RunRecord(run="wm", backend="local", spec_path="", overrides={}, spec_hash="", auto_resume=True,
                    created_at=T - 100, status=status)
    rec.attempts = list(attempts)
    return rec


def prog(event: str, at: float, **fields) -> b.Event:
    # the event's time is the job's own (the line's "time"), not when the watcher read it
    return b.Event(b.PROGRESS, at + 1000, 0, "h0", progress={"event": event, "time": at, **fields})


def running(n: int = 2) -> list[b.NodeStatus]:
    return [b.NodeStatus(i, b.RUNNING, f"h{i}") for i in range(n)]


def steps(first: int, last: int, t0: float, every_s: float = 0.5, batch: int = 8) -> list[b.Event]:
    return [prog("step", t0 + (s - first) * every_s, step=s, loss=1.0 / s, samples=batch * s, timing=TIMING)
            for s in range(first, last + 1)]


def shown(state: P.PanelState, now: float) -> dict[str, str]:
    return {r.label: r.value for r in P.rows(state, now)}


def test_progress_throughput_eta_and_trend_come_from_the_lines_own_times():
    a0 = AttemptRecord(0, T - 90, last_step=20, last_checkpoint_step=20)
    state = P.PanelState()
    events = [prog("start", T - 30, max_steps=100)] + steps(1, 20, T - 10) + [prog("checkpoint", T - 0.5, step=20)]
    state.fold(News(record(a0), a0, running(), events, T - 0.5, 60.0))
    rows = shown(state, T)
    assert rows["step"].startswith("20 / 100   20%")
    assert rows["throughput"] == "16.0 samples/s  2.00 steps/s"        # last 10 lines: 9 steps in 4.5 s
    assert rows["time"] == "elapsed 1m40s   ETA 40s"
    assert rows["checkpoint"] == "step 20, 0s ago"
    assert rows["split"] == "50.0 ms/step, compute-bound: compute 60% data 30% comm 10%"
    assert rows["loss"].startswith("0.05 ")
    trend = rows["loss"].split()[-1]
    assert len(trend) == 20 and trend[0] == "█" and trend[-1] == "▁"     # a falling loss
    # a replayed attempt (read long after) shows the same rates: only the lines' times count
    later = P.PanelState()
    later.fold(News(record(a0), a0, running(), events, T - 0.5, 60.0))
    assert shown(later, T)["throughput"] == rows["throughput"]


def test_nodes_show_phase_host_and_when_each_last_printed():
    a0 = AttemptRecord(0, T - 90, last_step=3)
    state = P.PanelState()
    quiet = b.Event(b.OUTPUT, T - 40, 1, "h1", message="torchrun says hi")
    state.fold(News(record(a0), a0, [b.NodeStatus(0, b.RUNNING, "h0"), b.NodeStatus(1, b.PAUSED, "h1")],
                    [quiet] + steps(1, 3, T - 2), T - 1, 60.0))
    rows = {r.label: r for r in P.rows(state, T)}
    assert rows["node 0"].value == "running on h0, last line 1s ago" and rows["node 0"].tone == P.OK
    assert rows["node 1"].value == "paused on h1, last line 40s ago" and rows["node 1"].tone == P.WARN
    assert rows["heartbeat"].value == "1s ago; silent for 1m00s is a hang"
    assert {r.tone for r in P.rows(state, T + 40) if r.label == "heartbeat"} == {P.WARN}
    assert {r.tone for r in P.rows(state, T + 55) if r.label == "heartbeat"} == {P.BAD}


def test_failures_backoff_countdown_and_the_checkpoint_resumed_from():
    a0 = AttemptRecord(0, T - 90, last_step=23, last_checkpoint_step=20, outcome="node_lost", decision="retry",
                       failed_node=1, evidence="the node's processes vanished without an exit status (killed)")
    state = P.PanelState()
    state.fold(News(record(a0), a0, running(), steps(18, 23, T - 20) + [prog("checkpoint", T - 18, step=20)],
                    T - 10, 60.0, backoff_until=T + 4.2))
    rows = shown(state, T)
    assert rows["failure a0"] == "node_lost node 1 -> retry: the node's processes vanished without an exit status " \
                                 "(killed)"
    assert rows["backoff"] == "next attempt (1) in 5s"
    assert shown(state, T + 2)["backoff"] == "next attempt (1) in 3s"     # it counts down on its own
    a1 = AttemptRecord(1, T + 5)
    state.fold(News(record(a0, a1), a1, [], [], None, 60.0))
    rows = shown(state, T + 6)
    assert "backoff" not in rows and rows["failure a0"].startswith("node_lost")
    assert rows["checkpoint"] == "step 20, 24s ago"                       # still the newest checkpoint
    assert rows["heartbeat"].startswith("not yet")
    a1.resumed_from_step, a1.last_step = 20, 21
    state.fold(News(record(a0, a1), a1, running(), [prog("resume", T + 7, step=20)], T + 7, 60.0))
    assert shown(state, T + 8)["checkpoint"] == "step 20, 26s ago (resumed from it)"
    a1.last_checkpoint_step = 25
    state.fold(News(record(a0, a1), a1, running(), [prog("checkpoint", T + 9, step=25)], T + 9, 60.0))
    assert shown(state, T + 10)["checkpoint"] == "step 25, 1s ago (resumed from 20)"


def test_without_max_steps_or_timing_the_rows_say_what_is_missing():
    a0 = AttemptRecord(0, T - 90, last_step=5)
    state = P.PanelState()
    state.fold(News(record(a0), a0, running(), [prog("step", T - 1, step=5, loss="nan")], T - 1, 60.0))
    rows = {r.label: r for r in P.rows(state, T)}
    assert rows["step"].value == "5"
    assert "no max_steps" in rows["time"].value
    assert rows["split"].value.startswith("-") and rows["throughput"].value == "-"
    assert rows["loss"].value.startswith("nan") and rows["loss"].tone == P.BAD


def test_many_nodes_and_failures_are_summarised():
    attempts = [AttemptRecord(i, T - 90 + i, outcome="hang", decision="retry_elsewhere", evidence="silent")
                for i in range(9)] + [AttemptRecord(9, T)]
    state = P.PanelState()
    nodes = [b.NodeStatus(i, b.RUNNING if i != 11 else b.PENDING, f"h{i}") for i in range(12)]
    state.fold(News(record(*attempts), attempts[-1], nodes, [], None, 60.0))
    rows = P.rows(state, T)
    labels = [r.label for r in rows]
    assert labels.count("failures") == 1 and sum(lb.startswith("failure a") for lb in labels) == P.MAX_FAILURE_ROWS - 1
    assert "failure a8" in labels and "failure a0" not in labels
    assert sum(lb.startswith("node ") for lb in labels) == P.MAX_NODE_ROWS
    assert any(r.value == "and 4 more: 1 pending, 3 running" for r in rows)


def test_every_line_is_exactly_the_width_whatever_it_holds():
    a0 = AttemptRecord(0, T - 90, last_step=123456789, outcome="app_error", decision="stop",
                       evidence="Traceback\n\x1b[31mValueError: " + "x" * 300)
    state = P.PanelState()
    state.fold(News(record(a0, status="failed"), a0, running(), steps(1, 3, T - 5), None, 60.0))
    for width in (76, 56):
        lines = P.fit(P.rows(state, T), width)
        assert lines and all(len(text) == width for text, _ in lines)
        failure = next(text for text, _ in lines if text.startswith("failure a0"))
        assert failure.endswith("…") and "\n" not in failure and "\x1b" not in failure
    ascii_lines = P.fit(P.rows(state, T, unicode=False), 76, unicode=False)
    assert all(text.isascii() and len(text) == 76 for text, _ in ascii_lines)


def test_sparkline_and_durations():
    assert P.sparkline([3, 2, 1]) == "█▅▁"
    assert P.sparkline([1, 1, 1]) == "▅▅▅"
    assert P.sparkline([1, 2], unicode=False) == "_#"
    assert [P.duration(s) for s in (0, 59.4, 61, 3599, 7380)] == ["0s", "59s", "1m01s", "59m59s", "2h03m"]


def test_a_watcher_taking_up_a_run_starts_from_what_earlier_attempts_kept():
    a0 = AttemptRecord(0, T - 90, last_step=12, last_checkpoint_step=10, outcome="node_lost", decision="retry")
    a1 = AttemptRecord(1, T - 20, resumed_from_step=10, last_step=11)
    kept = [{"event": "start", "max_steps": 40, "time": T - 80, "attempt": 0}]
    kept += [{"event": "step", "step": s, "loss": 1.0 / s, "samples": 8 * s, "time": T - 80 + s, "attempt": 0}
             for s in range(1, 13)]
    kept.append({"event": "checkpoint", "step": 10, "time": T - 70, "attempt": 0})
    state = P.PanelState()
    state.fold(News(record(a0, a1), a1, running(), [prog("step", T - 1, step=11, loss=0.1)], T - 1, 60.0,
                    history=kept))
    rows = shown(state, T)
    assert rows["step"].startswith("11 / 40")
    assert rows["checkpoint"] == "step 10, 1m10s ago (resumed from it)"
    assert len(rows["loss"].split()[-1]) == 13                      # attempt 0's twelve losses, then this one
    assert rows["throughput"] == "-"                               # rates are this attempt's alone


def test_a_waiting_attempt_shows_the_cluster_s_or_the_queue_s_reason_until_it_runs():
    a0 = AttemptRecord(0, T - 5, evidence="queued: Kueue Pending: couldn't assign flavors to pod set main: "
                                          "insufficient unused quota for cpu in flavor default-flavor, 2 more needed")
    pending = [b.NodeStatus(i, b.PENDING, None) for i in range(2)]
    state = P.PanelState()
    state.fold(News(record(a0), a0, pending, [], None, 60.0))
    assert shown(state, T)["waiting"] == a0.evidence
    a0.evidence = None                      # every node runs: the supervisor clears it
    state.fold(News(record(a0), a0, running(), [], T + 1, 60.0))
    assert "waiting" not in shown(state, T + 2)


def test_in_place_recoveries_show_inside_the_running_attempt_newest_last():
    """Spare nodes: a recovery is no failed attempt; the panel says which node a spare replaced,
    at which step, from which checkpoint, and the new spare started for it; past three, a count."""
    a0 = AttemptRecord(0, T - 90, last_step=31, last_checkpoint_step=30)
    a0.recoveries = [{"round": 1, "lost_node": 1, "spare_node": 2, "step": 11, "checkpoint_step": 10,
                      "replenished": 3},
                     {"round": 2, "lost_node": 0, "spare_node": 3, "step": 31, "checkpoint_step": 30}]
    state = P.PanelState()
    state.fold(News(record(a0), a0, running(), steps(28, 31, T - 5), T - 1, 60.0))
    rows = [(r.label, r.value, r.tone) for r in P.rows(state, T) if r.label in ("in place", "failure a0")]
    assert rows == [("in place", "node 1 -> spare node 2 at step 11, from checkpoint 10; new spare node 3", P.WARN),
                    ("in place", "node 0 -> spare node 3 at step 31, from checkpoint 30", P.WARN)]
    a0.recoveries += [{"round": n, "lost_node": 0, "spare_node": n + 1, "step": 40 + n, "checkpoint_step": 40}
                      for n in (3, 4)]
    shown_rows = [r.value for r in P.rows(state, T) if r.label == "in place"]
    assert shown_rows[0] == "4 recoveries in this attempt; the newest:" and len(shown_rows) == 3
    assert shown_rows[-1].startswith("node 0 -> spare node 5 at step 44")
