"""`Progress(callback=...)`: every event a job prints also reaches the callback as the line's own
dict (to forward to TensorBoard or W&B without parsing logs); the printed lines are byte for byte
what they are without a callback; and a callback that raises never stops training: the line is
still written, the first error is said once on stderr, all are counted, later events still arrive."""

from __future__ import annotations

import io

import pytest

from orchestrator.runtime import protocol
from orchestrator.runtime.progress import Progress
from tests.runtime.conftest import progress_payload


def _drive(p: Progress) -> list[str]:
    lines = [p.start(world_size=2), p.step(step=5, loss=0.5, samples=40, timing={"step_s": 0.1}),
            p.checkpoint(step=5, path="/c/step-5", seconds=0.25), p.resume(step=5, path="/c/step-5", exact=True),
            p.exit(status="completed", step=10)]
    assert None not in lines, lines                   # every call printed its line
    return [line for line in lines if line is not None]


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    monkeypatch.setattr(protocol.time, "time", lambda: 1700000000.0)


def test_callback_gets_each_line_as_its_dict_and_the_lines_are_unchanged(tmp_path):
    seen: list[dict] = []
    plain, forwarded = io.StringIO(), io.StringIO()
    _drive(Progress(every=5, stream=plain, enabled=True))
    lines = _drive(Progress(every=5, stream=forwarded, enabled=True, path=str(tmp_path / "p.log"),
                            callback=seen.append))
    assert forwarded.getvalue() == plain.getvalue() == "".join(f"{line}\n" for line in lines)
    assert (tmp_path / "p.log").read_text() == plain.getvalue()
    assert seen == [protocol.parse_progress(line) for line in lines]
    assert [e["event"] for e in seen] == ["start", "step", "checkpoint", "resume", "exit"]
    assert seen[1] == {"event": "step", "time": 1700000000.0, "step": 5, "loss": 0.5, "samples": 40,
                       "timing": {"step_s": 0.1}}


def test_a_step_not_printed_is_not_forwarded_and_other_ranks_forward_nothing():
    seen: list[dict] = []
    Progress(every=5, stream=io.StringIO(), enabled=True, callback=seen.append).step(step=3, loss=1.0, samples=8)
    Progress(every=1, stream=io.StringIO(), enabled=False, callback=seen.append).step(step=5, loss=1.0, samples=8)
    assert seen == []


def test_a_raising_callback_never_stops_training(capsys):
    calls: list[str] = []

    def flaky(event: dict) -> None:
        calls.append(event["event"])
        if event["event"] != "resume":
            raise ConnectionError("wandb: network is unreachable")

    out = io.StringIO()
    p = Progress(every=5, stream=out, enabled=True, callback=flaky)
    lines = _drive(p)                                    # raises nothing
    assert out.getvalue() == "".join(f"{line}\n" for line in lines)
    assert calls == ["start", "step", "checkpoint", "resume", "exit"]
    assert p.callback_errors == 4
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ConnectionError: wandb: network is unreachable" in err[0] and "training goes on" in err[0]


def test_a_callback_that_emits_does_not_hang_training():
    """A callback may report through the same Progress (a note on each checkpoint): its line is
    written, not forwarded again (no recursion), and training goes on instead of waiting forever
    on the lock its own emit holds."""
    import threading

    seen: list[str] = []
    out = io.StringIO()
    p = Progress(every=1, stream=out, enabled=True)

    def noting(event: dict) -> None:
        seen.append(event["event"])
        if event["event"] == "checkpoint":
            p.emit("note", text="uploaded")

    p.callback = noting
    worker = threading.Thread(target=lambda: (p.checkpoint(step=1, path="/c/1", seconds=0.1),
                                              p.step(step=2, loss=1.0, samples=8)),
                              daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "emit from inside the callback deadlocked"
    assert [progress_payload(x)["event"] for x in out.getvalue().splitlines()] == ["checkpoint", "note", "step"]
    assert seen == ["checkpoint", "step"]
