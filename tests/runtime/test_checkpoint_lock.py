"""One writer per checkpoint root: rank 0 holds <root>/.lock for the manager's life; another job
on the same root is refused with the holder's pid@host, except a newer attempt of the same run,
which takes over (the fence keeps the older one from committing)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.runtime.checkpoint import CheckpointError, read_attempt
from tests.runtime.conftest import committed_step
from tests.runtime.test_checkpoint import Toy

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, torch
from orchestrator.runtime.checkpoint import CheckpointManager
root, run, attempt, close = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "close"
m = CheckpointManager(root, run=run, attempt=attempt)
m.register(model=torch.nn.Linear(2, 2))
m.save(1)
if close:
    m.close()
print("ready", flush=True)
sys.stdin.readline()      # hold the manager (and its lock) until the test says so
"""


class Holder:
    def __init__(self, root: Path, run: str, attempt: int, close: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WMCTL_")}
        env.update({"PYTHONPATH": str(REPO), "WMCTL_TORCH_MODULE": "cpu"})
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), run, str(attempt),
                                      "close" if close else "keep"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", self.proc.stderr.read()

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = Holder(tmp_path, "wm", 0)
    try:
        with pytest.raises(CheckpointError) as err:
            Toy().manager(tmp_path, run="wm", attempt=0)
        msg = str(err.value)
        assert f"{holder.proc.pid}@{socket.gethostname()}" in msg and "attempt 0" in msg and ".lock" in msg
        with pytest.raises(CheckpointError, match="in use by another job"):
            Toy().manager(tmp_path, run="other")          # another run (or none) is refused too
        with pytest.raises(CheckpointError, match="in use by another job"):
            Toy().manager(tmp_path)
    finally:
        holder.stop()
    # The holder is gone: its lock went with it.
    toy = Toy()
    toy.manager(tmp_path, run="wm", attempt=0).save(2)
    assert committed_step(tmp_path) == 2
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


def test_a_newer_attempt_takes_over_from_a_lingering_older_one(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    holder = Holder(tmp_path, "wm", 0)
    try:
        toy = Toy()
        m = toy.manager(tmp_path, run="wm", attempt=1)
        assert "still locked by attempt 0" in capsys.readouterr().err
        assert read_attempt(tmp_path) == 1
        m.save(2)
        assert committed_step(tmp_path) == 2
    finally:
        holder.stop()


def test_close_lets_go_of_the_lock(tmp_path: Path) -> None:
    holder = Holder(tmp_path, "wm", 0, close=True)     # alive, but its manager is closed
    try:
        Toy().manager(tmp_path, run="wm", attempt=0).save(2)
        assert committed_step(tmp_path) == 2
    finally:
        holder.stop()
