"""Helpers for tests that run processes: read a process's output as it comes, so a test waits for a
line instead of sleeping a guess of how long the process takes to print it."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest


class Lines:
    """A process's output, read as it comes (a thread), so a test waits for what a watcher says
    instead of sleeping a guess of how long it takes to say it (the watcher needs
    PYTHONUNBUFFERED=1, as the in-cluster watcher's Deployment sets)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self, join: bool = False) -> str:
        if join:
            self._reader.join(timeout=10)
        return "".join(self.lines)

    def wait_for(self, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.text():
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._reader.is_alive()):
                pytest.fail(f"the process never said {what!r}:\n" + self.text()[-3000:])
            time.sleep(0.1)
