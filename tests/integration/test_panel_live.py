"""The live panel on real runs, in a real pseudo-terminal read through pyte: a local run of a
tiny job (tests/integration/jobs/timed.py) whose node is killed, so the failure row and the
backoff countdown appear; and Ctrl-C on the foreground watchers, then a watcher in a pipe that
attaches to the running attempt and replays its lines at their own times, without escape codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from tests.terminal import Terminal, panel_lines, row

from . import harness as h

pytest.importorskip("pyte")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-home")


def env_for(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    return {**env, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO), "TERM": "xterm-256color",
            "PYTHONFAULTHANDLER": "1"}


def wmctl_in_terminal(home, *args: str) -> Terminal:
    return Terminal([sys.executable, "-m", "orchestrator.cli", *args], cols=80, rows=40, env=env_for(home),
                    cwd=str(h.REPO))


def test_a_killed_node_shows_its_failure_the_backoff_countdown_and_the_resume(home):
    run = "panel-kill"
    # 0.3 s a step: checkpoints 1.5 s apart, so the panel (polled every 0.25 s, through the pty)
    # shows step 10 before step 15 replaces it, and the kill lands between them even on a loaded
    # machine; where it lands is read back from the record, not assumed.
    spec = h.write_spec(home, run, nodes=1, steps=25, every=5, sleep=0.3, job="timed.py",
                        restart={"backoff": "3s", "heartbeat_timeout": "25s"})   # the panel shows it
    with wmctl_in_terminal(home, "submit", str(spec), "--auto-resume") as t:
        t.wait_for(lambda t: (row(t.screen.display, "checkpoint") or "").startswith("step 10"), 120,
                   "checkpoint 10 on the panel")
        assert t.screen.cursor.hidden
        assert h.kill_node(run, 0, 0) > 0
        assert t.wait_exit(180) == 0, t.text
    resumed = h.record(home, run)["attempts"][1]["resumed_from_step"]
    assert resumed in (10, 15, 20), resumed
    screens = [s for s in t.screens if panel_lines(s)]
    assert {len(line) for s in screens for line in panel_lines(s)} == {80}, "the panel changed width"
    assert t.hidden_seen and not t.screen.cursor.hidden

    def seen(label: str) -> list[str]:
        return [v for v in (row(s, label) for s in screens) if v]

    assert any(re.match(r"1\d / 25   [4-7]\d%  [█░]{16}$", v) for v in seen("step")), seen("step")
    assert any("samples/s" in v and "steps/s" in v for v in seen("throughput"))
    assert any("-bound: " in v for v in seen("split"))
    assert any("ETA" in v for v in seen("time"))
    assert any(v.startswith("running on localhost-0") for v in seen("node 0"))
    assert any("silent for 25s is a hang" in v for v in seen("heartbeat"))
    assert any(v.startswith("node_lost node 0 -> retry") for v in seen("failure a0"))
    countdown = set(seen("backoff"))
    assert len(countdown) >= 2 and all(v.startswith("next attempt (1) in ") for v in countdown), countdown
    assert any("(resumed from it)" in v for v in seen("checkpoint")), seen("checkpoint")
    final = panel_lines(t.screen.display)
    assert "attempt 1 · succeeded" in final[0]
    assert row(t.screen.display, "step").startswith("25 / 25  100%")
    assert row(t.screen.display, "checkpoint").startswith("step 25") and f"(resumed from {resumed})" in \
        row(t.screen.display, "checkpoint")


def stamp_of(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def test_ctrl_c_leaves_the_run_going_and_a_piped_watcher_replays_at_event_time(home):
    run = "panel-ctrl-c"
    # 0.3 s a step (30 s): the run must outlast two watchers started and stopped on a loaded
    # machine (not more steps: timed.py's loss overflows past step 100)
    spec = h.write_spec(home, run, nodes=1, steps=100, every=10, sleep=0.3, job="timed.py")
    with wmctl_in_terminal(home, "submit", str(spec), "--auto-resume") as t:
        t.wait_for(lambda t: (row(t.screen.display, "step") or "-")[0].isdigit(), 120, "a step on the panel")
        t.send(b"\x03")                    # the keyboard's Ctrl-C: SIGINT from the line discipline
        assert t.wait_exit(30) == 130, t.text
    said = " ".join(t.text.split())
    assert f"stopped the watcher that `wmctl submit` ran in the foreground (no --detach) for {run}" in said
    assert "the run goes on" in said and f"wmctl watch {run} --auto-resume" in said and f"wmctl cancel {run}" in said
    assert not t.screen.cursor.hidden and "Traceback" not in t.text
    assert h.node_pids(run, 0, 0), "Ctrl-C stopped the run"

    with wmctl_in_terminal(home, "watch", run) as t:
        t.wait_for(lambda t: (row(t.screen.display, "step") or "-")[0].isdigit(), 60, "a step on the panel")
        t.send(b"\x03")
        assert t.wait_exit(30) == 130, t.text
    said = " ".join(t.text.split())
    assert f"stopped watching {run}; the run goes on" in said and f"wmctl cancel {run}" in said
    assert h.node_pids(run, 0, 0), "Ctrl-C stopped the run"

    # The steps so far are over a second old when the piped watcher attaches (the two watchers above
    # may take under a second together), so a line stamped at replay time cannot pass for one
    # stamped at the step's own time.
    first = json.loads((h.run_folder(home, run) / "metrics.jsonl").read_text().splitlines()[0])["time"]
    time.sleep(max(0.0, first + 2.5 - time.time()))
    attached = time.time()
    piped = subprocess.run([sys.executable, "-m", "orchestrator.cli", "watch", run, "--auto-resume"],
                           capture_output=True, text=True, env=env_for(home), cwd=str(h.REPO), timeout=180)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert "\x1b" not in piped.stdout + piped.stderr
    lines = piped.stdout.splitlines()
    stamped = [line for line in lines if not line.startswith(" ") and not line.startswith("run ")]
    assert stamped and all(stamp_of(line) for line in stamped)        # ISO 8601 with date and zone
    steps = [line for line in stamped if ": step " in line]
    assert steps[0].split(": ", 1)[1].startswith("step 1 ")            # the attempt replayed from its start ...
    assert stamp_of(steps[0]) < attached - 1, steps[0]                  # ... at the steps' own times
    assert all(len(line) <= 100 for line in steps), max(steps, key=len)
    # three watchers read the attempt from its start; metrics.jsonl keeps each progress line once
    kept = [(m["event"], m.get("step"), m.get("time")) for m in map(json.loads, (
        h.run_folder(home, run) / "metrics.jsonl").read_text().splitlines())]
    assert len(kept) == len(set(kept)) == len(h.progress(home, run, 0))
