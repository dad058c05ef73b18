"""Readers (`status`, `list`) never hold the watcher lease (issue 22 item 3): a reader that
reconciles a run nobody watches does it under a lock of its own, and a watcher that starts
meanwhile waits for that reader, then reads what it recorded, instead of being refused."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from orchestrator import api, backends, runs
from orchestrator.backends import base as b
from orchestrator.errors import RunExists, RunFailed
from orchestrator.state import AttemptRecord, LocalRunStore, RunRecord
from orchestrator.watchview import EchoView

from .helpers import full_spec

REPO = Path(__file__).resolve().parents[2]

GATE = threading.Event()        # the gated backend's poll waits for it
INSIDE = threading.Event()      # set once a reader is inside the gated poll


class GatedBackend(b.Backend[b.Any]):
    """A backend whose one attempt is found failed (node 1 exited 1), once GATE opens."""

    name = "gated"
    runs_image = False

    @classmethod
    def render(cls, spec, profile, ctx, host):      # never planned: the record exists already
        raise NotImplementedError

    def submit(self, plan):
        raise NotImplementedError

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        INSIDE.set()
        assert GATE.wait(60), "the test never opened the gate"
        return b.Observation([b.Event(b.NODE_EXITED, 100.0, 1, "h1", exit_code=1)],
                             [b.NodeStatus(0, b.SUCCEEDED, "h0", 0), b.NodeStatus(1, b.FAILED, "h1", 1)])

    def logs(self, ref, node=0, follow=False, query=None) -> Iterator[str]:
        return iter(())

    def cancel(self, ref, graceful=False) -> None:
        pass

    def attempts(self, run: str) -> list[b.AttemptRef]:
        return [b.AttemptRef(self.name, run, 0)]


BACKEND = GatedBackend


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(backends.REGISTRY, "gated", __name__)
    GATE.clear()
    INSIDE.clear()
    yield tmp_path / "home"
    GATE.set()


def running_record(run: str, backend: str = "gated") -> RunRecord:
    spec = full_spec("cpu")
    record = RunRecord(run=run, backend=backend, spec_path="", overrides={}, spec_hash=spec.spec_hash(),
                       auto_resume=False, spec=spec.to_dict(), source_dir=str(spec.source_dir))
    record.attempts.append(AttemptRecord(attempt=0, submitted_at=time.time()))
    LocalRunStore(run).save(record)
    return record


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_watcher_starting_while_a_reader_reconciles_waits_for_it_and_reads_what_it_saw(home):
    running_record("r")
    views: list[runs.RunView] = []
    reader = threading.Thread(target=lambda: views.append(runs.status("r")))
    reader.start()
    assert INSIDE.wait(30), "the reader never looked at the backend"

    watcher = LocalRunStore("r")
    taken: list[object] = []

    def take() -> None:
        try:
            watcher.acquire_watcher()
            taken.append(watcher.load().status)     # what the watcher reads once it holds the lease
        except RunExists as exc:
            taken.append(exc)
    starting = threading.Thread(target=take)
    starting.start()
    # The watcher holds its lock (waiting for the reader), or was refused (the bug).
    wait_until(lambda: taken or LocalRunStore("r").lease() is not None, "the watcher to take its lock")
    assert not taken, f"a starting watcher was refused while a reader looked: {taken}"
    GATE.set()
    reader.join(30)
    starting.join(30)
    assert taken == ["failed"], taken           # it waited, then read the reader's reconciled record
    assert views and views[0].record is not None and views[0].record.attempts[0].outcome == "app_error"
    assert LocalRunStore("r").lease() is not None and watcher.lease() is not None
    second = LocalRunStore("r")
    with pytest.raises(RunExists, match="already watched by"):
        second.acquire_watcher()       # a live watcher is still refused to a second one, at once
    watcher.release_watcher()


def test_watch_started_while_a_reader_reconciles_takes_up_what_the_reader_recorded(home):
    running_record("v")
    reader = threading.Thread(target=lambda: runs.status("v"))
    reader.start()
    assert INSIDE.wait(30), "the reader never looked at the backend"
    lines: list[str] = []
    codes: list[int] = []
    watching = threading.Thread(
        target=lambda: codes.append(api.watch("v", auto_resume=False, view=EchoView(lines.append))))
    watching.start()
    wait_until(lambda: LocalRunStore("v").lease() is not None, "the watcher to take its lock")
    GATE.set()
    reader.join(30)
    watching.join(30)
    # It read the record after the reader wrote it: the run failed unwatched (app_error, no retry).
    assert codes == [RunFailed.exit_code], (codes, lines)
    assert any("app_error" in line and "no watcher ran" in line for line in lines), lines
    assert LocalRunStore("v").lease() is None      # and it let the lease go


def test_a_reader_never_reconciles_a_run_a_watcher_holds(home):
    running_record("w")
    watcher = LocalRunStore("w")
    watcher.acquire_watcher()
    GATE.set()
    view = runs.status("w")
    assert not INSIDE.is_set()                 # it never looked at the backend, let alone recorded
    assert view.record is not None and view.record.status == "running" and view.lease is not None
    assert [v.record.status for v in runs.runs() if v.record is not None] == ["running"]
    assert watcher.lease() is not None
    watcher.release_watcher()


def test_a_watcher_is_never_refused_by_a_reader_asking_who_watches(home, monkeypatch):
    """`status` and `list` ask who watches with an instant's lock on the lease lock: a watcher
    starting at that instant waits for the look to end instead of being refused."""
    running_record("p", backend="local")
    contended: list[int] = []
    real_flock = fcntl.flock

    def flock(fh, op):          # the real lock, counting the watcher's tries that found it held
        try:
            return real_flock(fh, op)
        except BlockingIOError:
            contended.append(threading.get_ident())
            raise
    monkeypatch.setattr(fcntl, "flock", flock)
    look = open(home / "runs" / "p" / "watcher.lock", "a+")
    real_flock(look, fcntl.LOCK_SH)             # a reader's look, caught in the act
    store = LocalRunStore("p")
    taken: list[object] = []

    def take() -> None:
        try:
            taken.append(store.acquire_watcher())
        except RunExists as exc:
            taken.append(exc)
    starting = threading.Thread(target=take)
    starting.start()
    wait_until(lambda: starting.ident in contended, "the watcher to find the lock held")
    look.close()                                # the look ends
    starting.join(30)
    assert taken == [None], taken
    assert (lease := store.lease()) is not None and lease.pid == os.getpid()
    store.release_watcher()


READ_ONLY = """
import json, os, sys
from orchestrator import api, runs, supervisor  # noqa: F401  everything a look imports, before losing the right to
from orchestrator.backends.local import engine  # noqa: F401
if os.getuid() == 0:            # root reads everything: look as nobody, who may read but not write
    os.setegid(65534)
    os.seteuid(65534)
view = runs.status(sys.argv[1])
listed = [(v.run, v.record.status if v.record else v.problem) for v in runs.runs()]
print(json.dumps({"status": view.record.status, "watcher": view.watcher, "note": view.note, "list": listed}))
"""


def test_a_user_who_may_read_but_not_write_the_runs_sees_them(monkeypatch):
    """Issue 22 item 9: `status` and `list` need no lock to read; what they cannot record is said."""
    # Outside pytest's own folder, which it keeps closed to other users.
    home = Path(tempfile.mkdtemp(prefix="wmctl-read-only-")) / "home"
    monkeypatch.setenv("WMCTL_HOME", str(home))
    try:
        running_record("ro", backend="local")
        LocalRunStore("ro").lease()              # as after any earlier look: the lock files exist
        (home / "runs" / "ro" / "watcher.lock").touch()
        (home / "runs" / "ro" / "reconcile.lock").touch()
        for path in [home.parent, home, *home.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        looked = subprocess.run([sys.executable, "-c", READ_ONLY, "ro"], capture_output=True, text=True,
                                timeout=120, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        for path in [home.parent, home, *home.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(home.parent)
    assert looked.returncode == 0, looked.stderr
    seen = json.loads(looked.stdout)
    assert (seen["status"], seen["watcher"], seen["list"]) == ("running", "unwatched", [["ro", "running"]]), seen
    assert "not checked against where it runs" in seen["note"] and "Permission denied" in seen["note"], seen
