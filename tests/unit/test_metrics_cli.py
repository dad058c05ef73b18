"""`wmctl metrics RUN`: the kept progress events in fixed columns, as a table, CSV or JSON, for one
attempt or all; unknown values empty (CSV), null (JSON) or - (table), never None."""

from __future__ import annotations

import csv
import io
import json

import pytest

from orchestrator.commands.metrics import METRICS_COLUMNS
from orchestrator.state import LocalRunStore, RunRecord

from .test_cli import run_main

EVENTS = [
    {"attempt": 0, "event": "start", "time": 10.0, "world_size": 2},
    {"attempt": 0, "event": "step", "step": 1, "loss": 2.5, "samples": 8, "time": 11.0,
     "timing": {"step_s": 0.5, "data_share": 0.1, "compute_share": 0.7, "comm_share": 0.2}},
    {"attempt": 0, "event": "checkpoint", "step": 1, "path": "/c/step-00000001", "seconds": 0.25, "time": 11.5},
    {"attempt": 1, "event": "resume", "step": 1, "exact": True, "time": 20.0},
    {"attempt": 1, "event": "step", "step": 2, "loss": 2.0, "samples": 16, "seen": 21.0, "timing": {}},
    {"attempt": 1, "event": "failure", "by": "watcher", "step": 2, "kind": "node_lost", "decision": "retry_elsewhere",
     "node": 1, "host": "h1", "time": 22.0},
]


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    store = LocalRunStore("m")
    store.save(RunRecord(run="m", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=True))
    for e in EVENTS:
        store.append_metric(e)
    return "m"


def test_json_has_the_fixed_columns_for_every_event(run, capsys):
    code, out, _ = run_main(["metrics", run, "-o", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and len(rows) == len(EVENTS) and all(tuple(r) == METRICS_COLUMNS for r in rows)
    assert rows[1] == {"time": 11.0, "attempt": 0, "event": "step", "step": 1, "loss": 2.5, "samples": 8,
                       "step_s": 0.5, "data": 0.1, "compute": 0.7, "comm": 0.2, "path": None, "seconds": None,
                       "exact": None, "class": None, "decision": None}
    assert rows[2]["path"] == "/c/step-00000001" and rows[3]["exact"] is True
    assert rows[4]["time"] == 21.0            # no job time: when the watcher saw it
    assert (rows[5]["event"], rows[5]["class"], rows[5]["decision"]) == ("failure", "node_lost", "retry_elsewhere")


def test_csv_and_one_attempt(run, capsys):
    code, out, _ = run_main(["metrics", run, "-o", "csv", "--attempt", "1"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["event"] for r in rows] == ["resume", "step", "failure"]
    assert rows[1]["loss"] == "2.0" and rows[1]["path"] == ""


def test_table_never_prints_none_and_an_unknown_run_is_6(run, capsys):
    code, out, _ = run_main(["metrics", run], capsys)
    assert code == 0 and "None" not in out and out.splitlines()[0].split()[:3] == ["ATTEMPT", "EVENT", "STEP"]
    code, _, err = run_main(["metrics", "nope"], capsys)
    assert code == 6 and "no run named 'nope'" in err
