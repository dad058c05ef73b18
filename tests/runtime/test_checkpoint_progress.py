"""The Progress helper: rank 0 only, heartbeat cadence, progress file, parseable lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.runtime.progress import Progress
from tests.runtime.conftest import progress_payload


def test_rank0_lines_cadence_and_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WMCTL_HEARTBEAT_EVERY", "3")
    monkeypatch.setenv("WMCTL_PROGRESS_FILE", str(tmp_path / "p.log"))
    monkeypatch.setenv("WMCTL_RUN", "wm")
    monkeypatch.setenv("WMCTL_ATTEMPT", "2")
    out = io.StringIO()
    p = Progress(stream=out)
    p.start(world_size=4)
    p.resume(step=40, path="/ck/step-00000040")
    for s in range(41, 48):
        p.step(step=s, loss=0.5, samples=s * 8, timing={"comm_share": 0.1})
    p.checkpoint(step=45, path="/ck/step-00000045", seconds=0.123456)
    p.preempted(step=47)
    p.exit(status="preempted")
    events = [progress_payload(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["start", "resume", "step", "step", "checkpoint", "preempted", "exit"]
    assert events[0]["run"] == "wm" and events[0]["attempt"] == 2 and events[0]["world_size"] == 4
    assert events[1]["step"] == 40 and events[1]["path"] == "/ck/step-00000040"
    assert [e["step"] for e in events if e["event"] == "step"] == [42, 45]
    assert events[4]["seconds"] == 0.1235 and events[5]["exit_code"] == 83
    assert (tmp_path / "p.log").read_text() == out.getvalue()


def test_other_ranks_are_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WMCTL_PROGRESS_FILE", raising=False)
    out = io.StringIO()
    p = Progress(stream=out)
    assert p.start(world_size=2) is None and p.exit(status="completed") is None
    assert out.getvalue() == ""
    assert p.step(step=10, loss=1.0, samples=1, force=True) is None
