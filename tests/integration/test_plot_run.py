"""`wmctl plot` of a real self-healing run: the tiny job (orchestrator.runtime's Progress and
CheckpointManager) on a local torchrun node under `wmctl submit --auto-resume`, the node SIGKILLed
a few steps past a checkpoint (one node: what is plotted is the run's story, not a second node's).
The plot data is checked against the job's own progress lines
(not the watcher's copy): the attempt boundary sits at the step attempt 1 resumed from, the shaded
steps are exactly those between that checkpoint and the last step attempt 0 reached, and the
failure carries its class. The picture is checked as a file: a decodable PNG, not blank."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from orchestrator.plot import data as plotdata

from ..unit.test_plot import assert_real_picture
from . import harness as h

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _wmctl(home, *args):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)},
                          cwd=str(home), timeout=120)


def test_plot_of_a_run_with_a_killed_node(tmp_path, monkeypatch):
    home, run = tmp_path / "home", "plotkill"
    spec = h.write_spec(tmp_path, run, nodes=1, job="tiny.py", steps=24, every=5, sleep=0.15)
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    committed = max(p["step"] for p in h.progress(home, run, 0) if p["event"] == "checkpoint")
    h.wait_step(home, run, 0, committed + 2)          # a few steps the next attempt has to redo
    assert h.kill_node(run, 0, 0) > 0
    assert w.wait() == 0, w.output

    # What the job itself printed, attempt by attempt.
    job0, job1 = h.progress(home, run, 0), h.progress(home, run, 1)
    reached = max(p["step"] for p in job0 if p["event"] == "step")
    resumed = next(p for p in job1 if p["event"] == "resume")
    assert reached > resumed["step"], (reached, resumed)
    # metrics.jsonl keeps every progress line of both attempts, the killed one's last included.
    kept = [json.loads(line) for line in (h.run_folder(home, run) / "metrics.jsonl").read_text().splitlines()]
    failures = [e for e in kept if e.get("by") == "watcher"]
    assert [(e["event"], e["attempt"], e["kind"], e["decision"]) for e in failures] == \
        [("failure", 0, "node_lost", "retry")], failures
    kept = [e for e in kept if e.get("by") != "watcher"]
    for n, job in ((0, job0), (1, job1)):
        assert [{k: v for k, v in e.items() if k != "seen"} for e in kept if e["attempt"] == n] == \
            [{**e, "attempt": n} for e in job]

    monkeypatch.setenv("WMCTL_HOME", str(home))
    from dataclasses import asdict

    from orchestrator import runs
    record = runs.status(run, reconcile=False).record
    assert record is not None
    d = plotdata.build(run, runs.metrics(run), [asdict(a) for a in record.attempts])
    assert d.boundaries == [plotdata.Boundary(1, resumed["step"], resumed=True, exact=True)]
    assert d.failures == [plotdata.Failure(0, reached, "node_lost")]
    assert d.redone == [plotdata.Redone(1, resumed["step"] + 1, reached)]
    # Each attempt's curve is its own step lines (tiny.py's loss overflows late in a run: left out).
    for s, job in zip(d.series, (job0, job1), strict=True):
        assert s.steps == [p["step"] for p in job if p["event"] == "step" and math.isfinite(p["loss"])]
    assert d.series[1].steps[0] == resumed["step"] + 1
    assert d.rate_unit == "samples/s" and all(r > 0 for s in d.series for r in s.rate)

    r = _wmctl(home, "plot", run, "-o", "run.png")
    assert r.returncode == 0 and r.stdout.strip() == "wrote run.png", r.stdout + r.stderr
    assert_real_picture(home / "run.png")
    r = _wmctl(home, "plot", run, "--terminal")
    assert r.returncode == 0, r.stderr
    assert f"attempt 1: resumed from step {resumed['step']} (exact)" in r.stdout
    assert f"attempt 0: failed at step {reached}: node_lost" in r.stdout
    assert (f"attempt 1: redoes steps {resumed['step'] + 1}-{reached} ({reached - resumed['step']}), lost with "
            "attempt 0") in r.stdout
