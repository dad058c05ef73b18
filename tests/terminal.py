"""A real pseudo-terminal for the live panel's tests, read through a terminal emulator (pyte).

``Terminal(argv, cols, rows)`` starts a command on the slave side of a new pty (its controlling
terminal, so Ctrl-C written as ``\\x03`` is turned into SIGINT by the kernel's line discipline, as
a keyboard's is), feeds everything it writes to a pyte screen of that size, and keeps the raw
bytes too. ``wait_for`` polls the screen; ``screens`` keeps every distinct screen seen, so a test
can check what was shown for a moment (a countdown) after the fact.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time

import pyte

SETTLE_S = 0.03      # a pause this long ends a frame

class Terminal:
    def __init__(self, argv: list[str], *, cols: int = 80, rows: int = 40, env: dict[str, str] | None = None,
                 cwd: str | None = None):
        self.cols, self.rows = cols, rows
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.screens: list[list[str]] = []
        self.hidden_seen = False          # was the cursor hidden at some point while it ran?
        self.status: int | None = None
        pid, fd = pty.fork()
        if pid == 0:                      # the child: the pty is its controlling terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                if cwd:
                    os.chdir(cwd)
                os.execvpe(argv[0], argv, env if env is not None else dict(os.environ))
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd

    # -- reading ---------------------------------------------------------------------------------
    def pump(self, timeout: float = 0.1) -> bool:
        """Read what is there (waiting up to ``timeout`` for the first byte, then until the
        program pauses for SETTLE_S, so a frame the pty split is seen whole); False once the
        child closed the pty."""
        wait, alive, got = timeout, True, False
        while True:
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                break
            try:
                data = os.read(self.fd, 65536)
            except OSError:               # EIO: every slave fd is closed
                data = b""
            if not data:
                alive = False
                break
            self.raw += data
            self.stream.feed(data)
            got, wait = True, SETTLE_S
        if got:
            self.hidden_seen = self.hidden_seen or self.screen.cursor.hidden
            shown = list(self.screen.display)
            if not self.screens or self.screens[-1] != shown:
                self.screens.append(shown)
        return alive

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "the screen") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return
            if not self.pump(0.1):
                if predicate(self):
                    return
                raise AssertionError(f"the program ended before {what}:\n{self.text}")
        raise AssertionError(f"timed out waiting for {what}:\n{self.text}")

    def wait_text(self, needle: str, timeout: float = 60.0) -> None:
        self.wait_for(lambda t: needle in t.text, timeout, repr(needle))

    # -- writing and ending ----------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait_exit(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = self.pump(0.1)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                while self.pump(0.05):    # what it wrote last
                    pass
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            if not alive:
                time.sleep(0.05)
        # Where it is stuck: with PYTHONFAULTHANDLER=1 in its environment, SIGABRT prints every
        # thread's stack before it dies.
        os.kill(self.pid, signal.SIGABRT)
        end = time.monotonic() + 5
        while time.monotonic() < end and self.pump(0.1):
            pass
        raise AssertionError(f"still running after {timeout} s:\n{self.text}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def panel_lines(screen: list[str]) -> list[str]:
    """The panel's lines on a screen: from its top border to its bottom border."""
    top = next((i for i, line in enumerate(screen) if line.startswith(("╭", "+-"))), None)
    if top is None:
        return []
    for j in range(top + 1, len(screen)):
        if screen[j].startswith(("╰", "+-")):
            return [line.rstrip() for line in screen[top:j + 1]]
    return [line.rstrip() for line in screen[top:]]


def row(screen: list[str], label: str) -> str | None:
    """The value of the panel row ``label`` on a screen, or None."""
    for line in panel_lines(screen):
        line = line.rstrip()
        inner = line[2:-2] if len(line) >= 4 else ""
        if inner.startswith(label + " "):
            return inner[len(label):].strip()
    return None
