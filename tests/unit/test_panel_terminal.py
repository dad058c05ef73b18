"""The live panel in a real pseudo-terminal, read through a terminal emulator (pyte), and the
same display in a pipe. The display is driven by tests/unit/panel_driver.py with a supervisor's
news after a lost node; tests/integration/test_panel_live.py does it with a real run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.terminal import Terminal, panel_lines, row

pytest.importorskip("pyte")

REPO = Path(__file__).resolve().parents[2]
DRIVER = [sys.executable, str(Path(__file__).with_name("panel_driver.py"))]
# SGR colour parameters: 30-37, 39, 40-47, 49, 90-97, 100-107, 38;..., 48;...
COLOUR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d) ")


def term_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES", "FORCE_COLOR")}
    return {**env, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", **extra}


def drive(*args: str, cols: int = 80, **env: str) -> Terminal:
    t = Terminal(DRIVER + list(args), cols=cols, rows=30, env=term_env(**env), cwd=str(REPO))
    assert t.wait_exit(60) == 0, t.text
    t.close()
    return t


def test_the_panel_rows_width_countdown_and_cursor_on_a_wide_terminal():
    t = drive("--backoff", "3", "--hold", "1.6", cols=120)
    panels = [panel_lines(s) for s in t.screens if panel_lines(s)]
    assert panels and {len(line) for p in panels for line in p} == {80}     # 80 wide on a 120-column terminal
    final = t.screen.display
    for label in ("step", "loss", "throughput", "time", "checkpoint", "split", "heartbeat", "node 0", "node 1",
                  "failure a0", "backoff"):
        assert row(final, label) is not None, (label, t.text)
    assert (step := row(final, "step")) is not None and step.startswith("12 / 40   30%")
    assert (failure := row(final, "failure a0")) is not None and failure.startswith("node_lost node 0 -> retry")
    countdown = [row(s, "backoff") for s in t.screens if row(s, "backoff")]
    assert "next attempt (1) in 3s" in countdown and "next attempt (1) in 2s" in countdown, countdown
    assert t.hidden_seen and not t.screen.cursor.hidden          # hidden while it ran, given back at the end
    assert COLOUR.search(bytes(t.raw))                           # colours on a colour terminal ...


def test_no_color_keeps_the_panel_without_colours():
    t = drive("--backoff", "1", cols=80, NO_COLOR="1")
    assert row(t.screen.display, "failure a0") and not COLOUR.search(bytes(t.raw))   # ... and none under NO_COLOR


def test_a_narrow_terminal_gets_a_narrower_panel_that_fits():
    t = drive("--backoff", "1", cols=60)
    panels = [panel_lines(s) for s in t.screens if panel_lines(s)]
    assert panels and {len(line) for p in panels for line in p} == {60}


@pytest.mark.parametrize("how", ["dumb", "plain", "pipe"])
def test_lines_without_any_escape_code(how):
    if how == "pipe":
        proc = subprocess.run(DRIVER + ["--backoff", "1"], capture_output=True, env=term_env(), cwd=str(REPO),
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        raw = proc.stdout + proc.stderr
    else:
        t = drive("--backoff", "1", *(["--plain"] if how == "plain" else []),
                  TERM="dumb" if how == "dumb" else "xterm-256color")        # term_env's own TERM otherwise
        raw = bytes(t.raw)
    assert b"\x1b" not in raw
    lines = raw.decode().replace("\r\n", "\n").splitlines()
    assert len(lines) == 3 and all(ISO_LINE.match(line) for line in lines), lines


@pytest.mark.parametrize("plain", [False, True])
def test_plain_flag_forces_lines_on_a_terminal(tmp_path, plain):
    from orchestrator.state import LocalRunStore, RunRecord

    LocalRunStore("ended", home=tmp_path).save(RunRecord(
        run="ended", backend="local", spec_path="", overrides={}, spec_hash="", auto_resume=True,
        status="succeeded", final_report="run ended succeeded on attempt 0 at step 5"))
    argv = [sys.executable, "-m", "orchestrator.cli", "watch", "ended"] + (["--plain"] if plain else [])
    t = Terminal(argv, cols=80, rows=10, env=term_env(WMCTL_HOME=str(tmp_path)), cwd=str(REPO))
    assert t.wait_exit(60) == 0, t.text
    t.close()
    first = t.text.splitlines()[0]
    assert first.endswith("run ended succeeded on attempt 0 at step 5")
    assert bool(ISO_LINE.match(first)) == plain and first.startswith("[") != plain    # the terminal's form: [HH:MM:SS]
