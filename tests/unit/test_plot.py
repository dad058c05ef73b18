"""`wmctl plot`: the pure plot data (attempt boundaries at the resume step, failures with their
class, redone steps, throughput), the text chart, the picture file, and the command's errors
(matplotlib missing, an unknown format, an attempt the run lacks). The plot of a real run with a
killed node: tests/integration/test_plot_run.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.plot import data as plotdata
from orchestrator.plot import text
from orchestrator.state import AttemptRecord, LocalRunStore, RunRecord

from .test_cli import run_main

REPO = Path(__file__).resolve().parents[2]


def _step(attempt, step, t, samples=None, loss=None):
    return {"attempt": attempt, "event": "step", "step": step, "time": t, "loss": 10.0 / step if loss is None else loss,
            "samples": 8 * step if samples is None else samples}


# Attempt 0 checkpoints at 10, reaches 14, loses a node; attempt 1 resumes from 10 and finishes at 20.
EVENTS = [
    {"attempt": 0, "event": "start", "time": 100.0},
    *[_step(0, s, 100.0 + s) for s in range(1, 15)],
    {"attempt": 0, "event": "checkpoint", "step": 10, "path": "/c/step-10", "time": 110.5},
    {"attempt": 1, "event": "start", "time": 200.0},
    {"attempt": 1, "event": "resume", "step": 10, "exact": True, "time": 200.5},
    *[_step(1, s, 200.0 + 0.5 * (s - 10)) for s in range(11, 21)],
]
ATTEMPTS: list[dict[str, Any]] = [
    {"attempt": 0, "outcome": "node_lost", "last_step": 14, "resumed_from_step": None},
    {"attempt": 1, "outcome": "succeeded", "last_step": 20, "resumed_from_step": 10},
]


def test_boundary_at_the_resume_step_failure_with_its_class_and_the_redone_steps():
    d = plotdata.build("r", EVENTS, ATTEMPTS)
    assert [s.attempt for s in d.series] == [0, 1]
    assert d.series[0].steps == list(range(1, 15)) and d.series[1].steps == list(range(11, 21))
    assert d.boundaries == [plotdata.Boundary(1, 10, resumed=True, exact=True)]
    assert d.failures == [plotdata.Failure(0, 14, "node_lost")]
    assert d.redone == [plotdata.Redone(1, 11, 14)] and d.redone[0].count == 4
    assert d.checkpoints == [(0, 10)]
    assert d.title() == "r: 2 attempts, 1 failure, 4 steps redone"


def test_throughput_is_samples_per_second_between_step_lines_of_one_attempt():
    d = plotdata.build("r", EVENTS, ATTEMPTS)
    assert d.rate_unit == "samples/s"
    assert d.series[0].rate == [8.0] * 13 and d.series[0].rate_steps == list(range(2, 15))
    # attempt 1 runs twice as fast; no rate across the attempt boundary (its first line has no predecessor)
    assert d.series[1].rate == [16.0] * 9 and d.series[1].rate_steps[0] == 12


def test_without_samples_throughput_is_steps_per_second_and_nan_losses_are_left_out():
    events = [{"attempt": 0, "event": "step", "step": s, "time": float(s) / 2, "loss": "nan" if s == 3 else 1.0}
              for s in range(1, 6)]
    d = plotdata.build("r", events)
    assert d.rate_unit == "steps/s" and d.series[0].rate == [2.0] * 4
    assert d.series[0].steps == [1, 2, 4, 5]


def test_without_a_record_the_events_still_place_boundary_and_redone_steps():
    d = plotdata.build("r", EVENTS)
    assert d.boundaries == [plotdata.Boundary(1, 10, resumed=True, exact=True)]
    assert d.redone == [plotdata.Redone(1, 11, 14)] and d.failures == []


def test_a_restart_from_scratch_redoes_everything_and_one_attempt_keeps_its_own_marks():
    events = [_step(0, s, float(s)) for s in range(1, 4)] + [_step(1, s, 10.0 + s) for s in range(1, 6)]
    attempts: list[dict[str, Any]] = [{"attempt": 0, "outcome": "oom", "last_step": 3}, {"attempt": 1, "outcome": None}]
    d = plotdata.build("r", events, attempts)
    assert d.boundaries == [plotdata.Boundary(1, 0, resumed=False)] and d.redone == [plotdata.Redone(1, 1, 3)]
    assert "no step lines kept" not in text.render(d)
    bare = plotdata.build("r", [], [{"attempt": 0, "outcome": "app_error", "last_step": None}])
    chart = text.render(bare)
    assert bare.empty and "attempt 0: failed: app_error" in chart and "no step lines kept" in chart
    one = plotdata.build("r", events, attempts, only_attempt=1)
    assert [s.attempt for s in one.series] == [1] and one.redone == d.redone and one.failures == []


def test_a_node_replaced_in_place_marks_its_failure_and_redone_steps_inside_the_attempt():
    events = [_step(0, s, float(s)) for s in range(1, 13)] + [_step(0, s, 20.0 + s) for s in range(11, 21)]
    attempts = [{"attempt": 0, "outcome": "succeeded", "last_step": 20, "recoveries": [
        {"round": 1, "lost_node": 1, "spare_node": 2, "step": 12, "checkpoint_step": 10}]}]
    d = plotdata.build("r", events, attempts)
    assert d.failures == [plotdata.Failure(0, 12, "node 1 replaced in place by spare node 2")]
    assert d.redone == [plotdata.Redone(0, 11, 12, in_place=True)] and d.boundaries == []
    assert "2 steps redone" in d.title() and "lost with a node a spare replaced in place" in text.render(d)


def test_text_chart_fits_the_width_and_marks_boundary_failure_and_redone_columns():
    d = plotdata.build("r", EVENTS, ATTEMPTS)
    out = text.render(d, width=80, height=10)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert all(ch.isascii() for ch in out)
    chart = [line for line in lines if " |" in line[:11]]
    cols = 80 - text.LABEL - 1

    def col(step):
        return round((step - 1) / 19 * (cols - 1))
    body = [line[text.LABEL + 1:].ljust(cols) for line in chart]
    assert body[0][col(14)] == "X"                                   # the failure, at its step
    assert any(row[col(10)] == "|" for row in body)                 # attempt 1 starts at the resume step
    assert any(row[col(12)] == ":" for row in body)                 # redone steps shaded
    assert not any(row[col(16)] == ":" for row in body)             # new steps are not
    assert "0" in "".join(body) and "1" in "".join(body)
    assert "attempt 1: resumed from step 10 (exact)" in out
    assert "attempt 0: failed at step 14: node_lost" in out
    assert "attempt 1: redoes steps 11-14 (4), lost with attempt 0" in out


def test_the_picture_is_a_real_png_with_the_marks_drawn(tmp_path):
    from orchestrator.plot import image

    old = os.umask(0o027)
    try:
        path = image.save(plotdata.build("r", EVENTS, ATTEMPTS), tmp_path / "r.png")
    finally:
        os.umask(old)
    assert_real_picture(path)
    assert path.stat().st_mode & 0o777 == 0o640                     # as open() would make it, not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["r.png"]         # no temp file left behind


def assert_real_picture(path: Path, min_colours: int = 6) -> None:
    """A decodable PNG that is not blank: several distinct colours, a fair share of ink, and the
    redone shading's orange and the failure's red among them."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        assert rgb.width >= 600 and rgb.height >= 400
        colours = rgb.getcolors(maxcolors=1 << 20)
    assert colours is not None
    colours.sort(reverse=True)
    background = colours[0][1]
    ink = sum(n for n, c in colours if c != background) / (rgb.width * rgb.height)
    distinct = {c for n, c in colours if n >= 20}
    assert len(distinct) >= min_colours and ink > 0.02, (len(distinct), ink)
    # tab:red (214, 39, 40) for the failure; tab:orange at alpha 0.22 on white (255, 226, 199)
    assert any(abs(c[0] - 214) + abs(c[1] - 39) + abs(c[2] - 40) < 20 for c in distinct)
    assert any(abs(c[0] - 255) + abs(c[1] - 226) + abs(c[2] - 199) < 20 for c in distinct)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    store = LocalRunStore("p")
    store.save(RunRecord(run="p", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=True,
                         status="succeeded",
                         attempts=[AttemptRecord(**a, submitted_at=0.0) for a in ATTEMPTS]))
    for e in EVENTS:
        store.append_metric(e)
    return "p"


def test_command_writes_the_file_and_terminal_needs_no_file(run, tmp_path, capsys):
    code, out, err = run_main(["plot", run, "-o", str(tmp_path / "p.png")], capsys)
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'p.png'}", err
    code, out, _ = run_main(["plot", run, "--terminal"], capsys)
    assert code == 0 and "attempt 0: failed at step 14: node_lost" in out and "wrote" not in out


@pytest.mark.parametrize("argv, code, says", [
    (["-o", "p.gif"], 2, "-o p.gif: unknown picture format 'gif'"),
    (["-o", "nowhere/p.png"], 2, "does not exist"),
    (["--attempt", "5", "--terminal"], 6, "--attempt 5: run p has no attempt 5"),
])
def test_command_refuses_bad_options(run, argv, code, says, capsys):
    got, _, err = run_main(["plot", run, *argv], capsys)
    assert got == code and says in err and "Traceback" not in err, err


def test_unknown_run_is_6(run, capsys):
    code, _, err = run_main(["plot", "nope", "--terminal"], capsys)
    assert code == 6 and "no run named 'nope'" in err


def test_without_matplotlib_one_line_names_the_extra_and_terminal_still_works(run, tmp_path):
    """A real process where `import matplotlib` fails (a package of that name that raises first on
    the path): exit 10, one line naming `pip install 'wmctl[plot]'`, nothing written."""
    blocker = tmp_path / "blocker" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named matplotlib (test blocker)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(REPO)])}

    def wmctl(*args):
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", "plot", run, *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    r = wmctl("-o", "p.png")
    assert r.returncode == 10 and r.stdout == "", r.stderr
    assert len(r.stderr.splitlines()) == 1 and "pip install 'wmctl[plot]'" in r.stderr, r.stderr
    assert "--terminal" in r.stderr and not (tmp_path / "p.png").exists()
    r = wmctl("--terminal")
    assert r.returncode == 0 and "attempt 1: resumed from step 10 (exact)" in r.stdout, r.stderr


def test_two_failures_each_shade_what_they_lost():
    """Attempt 1 resumes from 10, fails at 12 (before catching up with 14); attempt 2 resumes from
    10 again. Each failure's lost steps are shaded, counted as `wmctl status` counts them."""
    from orchestrator.state import RunRecord as Rec
    from orchestrator.display import steps_redone

    attempts: list[dict[str, Any]] = [{"attempt": 0, "outcome": "node_lost", "last_step": 14},
                {"attempt": 1, "outcome": "oom", "last_step": 12, "resumed_from_step": 10},
                {"attempt": 2, "outcome": "succeeded", "last_step": 20, "resumed_from_step": 10}]
    events = [_step(0, s, float(s)) for s in range(1, 15)] + [_step(1, s, 20.0 + s) for s in (11, 12)]
    events += [_step(2, s, 40.0 + s) for s in range(11, 21)]
    d = plotdata.build("r", events, attempts)
    assert d.boundaries == [plotdata.Boundary(1, 10, True), plotdata.Boundary(2, 10, True)]
    assert d.failures == [plotdata.Failure(0, 14, "node_lost"), plotdata.Failure(1, 12, "oom")]
    assert d.redone == [plotdata.Redone(1, 11, 14), plotdata.Redone(2, 11, 12)]
    record = Rec(run="r", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=True,
                 attempts=[AttemptRecord(**a, submitted_at=0.0) for a in attempts])
    assert [r.count for r in d.redone] == steps_redone(record)


def test_a_resume_amended_to_not_exact_is_drawn_not_exact_with_its_reason():
    events = [e for e in EVENTS if e["event"] != "resume"] + [
        {"attempt": 1, "event": "resume", "step": 10, "exact": True, "time": 200.5},
        {"attempt": 1, "event": "resume", "step": 10, "exact": False, "reason": "unregistered DataLoader",
         "amended": True, "time": 201.0}]
    d = plotdata.build("r", events, ATTEMPTS)
    assert d.boundaries == [plotdata.Boundary(1, 10, resumed=True, exact=False, reason="unregistered DataLoader")]
    assert "attempt 1: resumed from step 10 (not exact: unregistered DataLoader)" in text.render(d)
