"""A run's state: what was asked (the resolved spec), what each attempt did, who watches it, and
what its torn-down nodes printed. Every piece of it goes through one ``RunStore``.

The live truth is where the run lives (processes, containers, Kubernetes objects, labelled
with run and attempt); the store adds what those cannot hold: the resolved spec, the excluded
nodes, each attempt's failure and decision, the logs of nodes that are gone. ``LocalRunStore``
keeps it in files under ``$WMCTL_HOME/runs/<run>``, each written atomically; a store kept in the
cluster can implement the same interface. The store is the one owner of the watcher lease.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from . import layout, storehook
from .errors import OptionError, RecordDamaged, RunExists, RunNotFound
from .runtime.protocol import ENV_RUN_STORE


def _hostname() -> str:
    """This machine's name, as socket.gethostname() says it (loaded only when a lease is taken:
    a dry run does not pay for the socket module)."""
    import socket

    return socket.gethostname()


# The watcher lease: a live watcher beats every LEASE_BEAT_S; on this host its flock is the proof
# of life, and a lease from another host (a shared run folder) is live while its beat is younger
# than LEASE_STALE_S. A stale lease is taken over; a live one is refused.
LEASE_BEAT_S = 5.0
LEASE_STALE_S = 60.0
# Readers (`status`, `list`) never hold the lease. A starting watcher that finds its lock held by
# no watcher (a reader asking who watches) waits up to READER_LOOK_S for that look to end; one
# that finds a reader folding what it saw into the record (the reconcile lock) waits up to
# READER_RECONCILE_S for it, then reads what it recorded. A reader waits up to READER_QUEUE_S for
# another reader's reconcile before it shows the record as it stands.
READER_LOOK_S = 5.0
READER_RECONCILE_S = 60.0
READER_QUEUE_S = 10.0

# Version 1 records (before the resolved spec was kept) carry no "version" key.
RECORD_VERSION = 2


@dataclass
class AttemptRecord:
    attempt: int
    submitted_at: float
    excluded_nodes: list[str] = field(default_factory=list)
    # of those, the ones remembered from earlier runs on the cluster (restart.remember_exclusions)
    remembered_nodes: list[str] = field(default_factory=list)
    resumed_from_step: int | None = None
    resume_not_exact: str | None = None  # why its resume was not exact (the job's reason); None: exact, or none
    last_step: int | None = None
    last_checkpoint_step: int | None = None
    ended_at: float | None = None
    outcome: str | None = None          # succeeded, or a failure class
    evidence: str | None = None
    decision: str | None = None
    failed_node: int | None = None
    failed_host: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: list[str] = field(default_factory=list)   # the failing rank's traceback tail (its own words)
    # in-place recoveries inside the attempt (spare nodes): each a lost node replaced by a spare
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    # nodes named stragglers (orchestrator/stragglers.py): their figures and what was done
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    paced: bool = False     # the job's ranks sent their step pace (StepTimer): stragglers are looked for


@dataclass
class RunRecord:
    run: str
    backend: str
    spec_path: str
    overrides: dict[str, Any]
    spec_hash: str
    auto_resume: bool
    kube_context: str | None = None
    kubeconfig: str | None = None       # `submit --kubeconfig`: every later command reads the same file
    namespace: str | None = None        # where the run's objects live, on a namespaced backend
    created_at: float = field(default_factory=time.time)
    status: str = "running"             # running, succeeded, failed
    final_report: str | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    # The spec as submitted (overrides applied, image pinned): every attempt, and a watcher
    # started again later, runs this, not what the YAML file on disk says by then.
    spec: dict[str, Any] | None = None
    source_dir: str | None = None       # the spec file's folder: relative paths resolve against it
    # Random per run: what the run's processes are tagged with, so teardown signals only them,
    # never another run of the same name (another WMCTL_HOME, another user). "" before run ids.
    run_id: str = ""
    # `--resume-from`: another run's checkpoint folder (as the job sees it), used until this run
    # has a checkpoint of its own.
    resume_from: str | None = None
    version: int = RECORD_VERSION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        """Read a record of this or an older version; keys a newer wmctl added are ignored."""
        data = dict(data)
        data.setdefault("version", 1)
        attempt_keys = {f.name for f in fields(AttemptRecord)}
        attempts = [AttemptRecord(**{k: v for k, v in a.items() if k in attempt_keys})
                    for a in data.pop("attempts", None) or []]
        known = {f.name for f in fields(cls)} - {"attempts"}
        return cls(**{k: v for k, v in data.items() if k in known}, attempts=attempts)


@dataclass(frozen=True)
class Lease:
    """Who watches a run: the process, its host, when it started and last beat."""

    pid: int
    host: str
    started: float
    beat: float

    def age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.beat)

    def describe(self, now: float | None = None) -> str:
        who = f"{self.pid}@{self.host}" if self.pid else f"a process on {self.host}"
        return f"watched by {who} (beat {self.age(now):.0f}s ago)"

    @classmethod
    def mine(cls, started: float | None = None) -> "Lease":
        now = time.time()
        return cls(os.getpid(), _hostname(), started or now, now)


class RunStore(ABC):
    """Where one run's state is kept."""

    def __init__(self, run: str):
        self.run = run

    @abstractmethod
    def exists(self) -> bool:
        """Is there a record of this run?"""

    @abstractmethod
    def load(self) -> RunRecord:
        """The record; RunNotFound when there is none, RecordDamaged when it cannot be read."""

    @abstractmethod
    def save(self, record: RunRecord) -> None:
        """Replace the record, atomically: a reader sees the old one or the new one."""

    @abstractmethod
    def acquire_watcher(self) -> str | None:
        """Become the only watcher of this run, or raise naming the one that is. Returns a note
        when a stale lease (a watcher that died on another host) was taken over."""

    @abstractmethod
    def release_watcher(self) -> None:
        """Give the watcher lease up (idempotent)."""

    @abstractmethod
    def beat(self) -> None:
        """The watcher is alive (cheap to call often: written at most every LEASE_BEAT_S)."""

    @abstractmethod
    def lease(self) -> Lease | None:
        """The live watcher's lease, or None when nobody watches the run."""

    @abstractmethod
    def watcher_log(self) -> Path:
        """Where a detached watcher writes its lines."""

    @abstractmethod
    def archive_log(self, attempt: int, node: int, data: bytes) -> None:
        """Keep a torn-down node's output."""

    @abstractmethod
    def archived_log(self, attempt: int, node: int) -> list[str] | None:
        """A torn-down node's kept output, or None when teardown kept none."""

    @abstractmethod
    def request_cancel(self, *, by: str, graceful: bool) -> dict[str, Any]:
        """Record that the run is to be cancelled, before anything is torn down: every watcher,
        in this process or another, sees it and never resubmits. Returns the intent."""

    @abstractmethod
    def cancel_intent(self) -> dict[str, Any] | None:
        """The recorded cancel intent (time, by, graceful), or None."""

    def watched(self) -> bool:
        """Does a live watcher hold this run's lease?"""
        return self.lease() is not None

    @contextmanager
    def reconciling(self) -> Iterator[str | None]:
        """While a reader (`status`, `list`) folds what it saw of an unwatched run into the record:
        yields None when it may (no watcher holds the lease, and none starts deciding until the
        block ends), else why not: "" when there is nothing to do (a watcher holds the run), or a
        note to show. This default holds the lease itself; a store with a lock of its own for
        readers overrides it, so that no reader ever refuses a starting watcher."""
        try:
            self.acquire_watcher()
        except RunExists:
            yield ""
            return
        try:
            yield None
        finally:
            self.release_watcher()

    @abstractmethod
    def append_metric(self, event: dict[str, Any]) -> None:
        """Keep one progress event (step, loss, timing, checkpoint, resume, failure) as it arrives."""

    @abstractmethod
    def metrics(self) -> list[dict[str, Any]]:
        """Every kept event, oldest first; a line torn by a crash is skipped."""

    def iter_metrics(self) -> Iterator[dict[str, Any]]:
        """``metrics()`` one event at a time: a store that can read its events as a stream holds
        one at a time, whatever the run's length (`wmctl metrics`, a watcher adopting a run)."""
        yield from self.metrics()

    @abstractmethod
    def delete(self) -> None:
        """Remove the run's state (record, lease, logs, metrics): `wmctl delete`, `--replace`."""


def iter_metrics(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a metrics.jsonl, in order, one at a time. A line that is not a JSON object
    (the torn end of an append cut short) is skipped: the others still count."""
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            yield item


def parse_metrics(lines: Iterable[str]) -> list[dict[str, Any]]:
    """``iter_metrics`` as a list."""
    return list(iter_metrics(lines))


def parse_record(read: Callable[[], str], run: str, where: str, *, hint: str) -> RunRecord:
    """A store's record text (``read()``) -> RunRecord, for every store: RecordDamaged naming
    ``where`` when it cannot be read or parsed, or when a newer wmctl wrote it."""
    try:
        data = json.loads(read())
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {json.dumps(data)[:40]}")
        record = RunRecord.from_dict(data)
    except (OSError, KeyError, ValueError, TypeError) as exc:    # UnicodeDecodeError is a ValueError
        raise RecordDamaged(f"the record of run {run!r} ({where}) is damaged: {exc}", hint=hint) from None
    if record.version > RECORD_VERSION:
        raise RecordDamaged(f"the record of run {run!r} was written by a newer wmctl "
                            f"(record version {record.version}, this one reads up to {RECORD_VERSION})",
                            hint="upgrade wmctl on this machine")
    return record


class LocalRunStore(RunStore):
    """Files under ``$WMCTL_HOME/runs/<run>``: ``run.json``, the watcher lock, ``attempt-N/``."""

    def __init__(self, run: str, home: Path | None = None):
        super().__init__(run)
        self.home = home or layout.wmctl_home()
        self.dir = layout.run_dir(run, self.home)
        self.path = self.dir / layout.RECORD_FILE
        self._lock_fh: IO[str] | None = None
        self._lease: Lease | None = None
        self._metrics_fh: IO[str] | None = None     # kept open: a watcher appends up to 1,000 lines a second

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> RunRecord:
        if not self.path.exists():
            known = ", ".join(local_runs(self.home)) or "none"
            raise RunNotFound(f"no run named {self.run!r} under {self.home} (known runs: {known})")
        return parse_record(lambda: self.path.read_text(encoding="utf-8"), self.run, str(self.path),
                            hint=f"the run's objects are untouched; look at the file, then move it aside "
                                 f"(mv {self.path} {self.path}.bad) to forget the run")

    def save(self, record: RunRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(asdict(record), indent=1))

    def acquire_watcher(self) -> str | None:
        if self._lock_fh is not None:
            return None             # held by this store already (submit takes it before the record exists)
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / layout.WATCHER_LOCK, "a+")
        # Held by a watcher: refused at once. Held by no watcher: a reader looking who watches
        # (``lease``), for an instant: waited for, never a reason to refuse.
        if not _flock(fh, fcntl.LOCK_EX, READER_LOOK_S, give_up=self._watcher_lease_live):
            fh.close()
            held = self._read_lease()
            holder = held.describe() if held else "another process on this host"
            raise RunExists(f"run {self.run!r} is already {holder}" if held else
                            f"run {self.run!r} is already watched by {holder}",
                            hint=f"stop that watcher first, or use `wmctl status {self.run}` to look without "
                                 "acting") from None
        note = None
        held = self._read_lease()
        if held is not None and held.host != _hostname():
            # The flock proves nothing across hosts (a run folder on shared storage): the beat does.
            if held.age() < LEASE_STALE_S:
                fh.close()
                raise RunExists(f"run {self.run!r} is already {held.describe()}",
                                hint=f"stop that watcher first (on its host), or use `wmctl status {self.run}` to look "
                                     f"without acting; its lease goes stale {LEASE_STALE_S:.0f} s after its last beat")
            note = f"took over the stale lease of {held.pid}@{held.host} (last beat {held.age():.0f}s ago)"
        # A reader reconciling the run (``reconciling``) decided while no watcher held the lock:
        # let it record what it saw, so this watcher reads that and decides from it.
        try:
            with open(self.dir / layout.RECONCILE_LOCK, "a+") as gate:
                if not _flock(gate, fcntl.LOCK_EX, READER_RECONCILE_S):
                    raise RunExists(f"run {self.run!r} is being checked by `wmctl status` or `list` for over "
                                    f"{READER_RECONCILE_S:.0f} s (its backend answers slowly)",
                                    hint=f"try again in a moment; `wmctl status {self.run}` shows what it recorded")
        except BaseException:
            fh.close()
            raise
        self._lock_fh = fh
        self._lease = Lease.mine()
        self._write_lease(self._lease)
        return note

    @contextmanager
    def reconciling(self) -> Iterator[str | None]:
        """Under the run's reconcile lock, never the watcher's: a watcher starting meanwhile waits
        for it (``acquire_watcher``) instead of being refused. Reading needs no lock at all: a
        user who may not write the run folder gets a note, not an error."""
        try:
            gate = open(self.dir / layout.RECONCILE_LOCK, "a+")
        except OSError as exc:
            yield (f"not checked against where it runs: {exc.strerror or exc} ({self.dir}); "
                   "only a user who may write the run folder records its true state")
            return
        with gate:
            if not _flock(gate, fcntl.LOCK_EX, READER_QUEUE_S):
                yield ""            # another reader is still at it: the record as it stands
                return
            # Taken before this lock or while a watcher waits for it: the watcher decides.
            yield "" if self.lease() is not None else None

    def _watcher_lease_live(self) -> bool:
        """Does the lease file name a watcher that is alive (its process on this host, or a
        beat from another host): the holder of the lock is then that watcher, not a reader."""
        held = self._read_lease()
        if held is None:
            return False
        if held.host != _hostname():
            return held.age() < LEASE_STALE_S
        return held.pid > 0 and _alive(held.pid)

    def release_watcher(self) -> None:
        if self._lock_fh is not None:
            held = self._read_lease()
            mine = self._lease
            if held is not None and mine is not None and (held.pid, held.host) == (mine.pid, mine.host):
                try:
                    (self.dir / layout.WATCHER_LEASE).unlink()
                except FileNotFoundError:
                    pass
            self._lock_fh.close()
            self._lock_fh = None
            self._lease = None

    def beat(self) -> None:
        if self._lease is None or time.time() - self._lease.beat < LEASE_BEAT_S:
            return
        self._lease = Lease.mine(started=self._lease.started)
        self._write_lease(self._lease)

    def lease(self) -> Lease | None:
        if self._lease is not None:
            return self._lease
        held = self._read_lease()
        if held is not None and held.host != _hostname():
            return held if held.age() < LEASE_STALE_S else None
        if not self._flock_held():
            return None
        now = time.time()
        return held or Lease(0, _hostname(), now, now)   # locked, lease not written yet

    def watcher_log(self) -> Path:
        return self.dir / layout.WATCHER_LOG

    def _flock_held(self) -> bool:
        """Is the lease lock held? Opened for reading (a user who may only read the run folder
        can ask) and locked shared for an instant (a watcher taking it meanwhile waits)."""
        try:
            fh = open(self.dir / layout.WATCHER_LOCK, "r")
        except FileNotFoundError:
            return False
        except OSError:             # unreadable: the lease file, if any, is all there is to go by
            return self._read_lease() is not None
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    def _read_lease(self) -> Lease | None:
        try:
            data = json.loads((self.dir / layout.WATCHER_LEASE).read_text(encoding="utf-8"))
            return Lease(int(data["pid"]), str(data["host"]), float(data["started"]), float(data["beat"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_lease(self, lease: Lease) -> None:
        write_atomic(self.dir / layout.WATCHER_LEASE, json.dumps(asdict(lease)))

    def archive_log(self, attempt: int, node: int, data: bytes) -> None:
        path = layout.node_log(self.run, attempt, node, self.home)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)

    def archived_log(self, attempt: int, node: int) -> list[str] | None:
        path = layout.node_log(self.run, attempt, node, self.home)
        if not path.exists():
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n") for line in fh]

    def request_cancel(self, *, by: str, graceful: bool) -> dict[str, Any]:
        intent = self.cancel_intent()
        if intent is None:
            intent = {"time": time.time(), "by": by, "graceful": graceful}
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / layout.CANCEL_FILE, json.dumps(intent))
        return intent

    def cancel_intent(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.dir / layout.CANCEL_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # Written atomically, so unreadable means edited by hand: still an intent to cancel.
            return {"time": time.time(), "by": "an unreadable cancel file", "graceful": False}
        return data if isinstance(data, dict) else {"time": time.time(), "by": "?", "graceful": False}

    def append_metric(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n"
        fh = self._metrics_fh
        if fh is None or fh.closed:
            self.dir.mkdir(parents=True, exist_ok=True)
            fh = self._metrics_fh = open(self.dir / layout.METRICS_FILE, "a", encoding="utf-8")
        fh.write(line)
        fh.flush()             # one write per line: a crash tears at most the last one

    def metrics(self) -> list[dict[str, Any]]:
        return list(self.iter_metrics())

    def iter_metrics(self) -> Iterator[dict[str, Any]]:
        path = self.dir / layout.METRICS_FILE
        if not path.exists():
            return
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield from iter_metrics(fh)

    def delete(self) -> None:
        if self._metrics_fh is not None:
            self._metrics_fh.close()
        # The record goes first: a folder without one is no run (list_runs), whatever is left.
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _store_module() -> Any:
    """Where run state is kept: this machine's files (WMCTL_RUN_STORE unset), or the module a
    backend declares as its ``run_store`` (WMCTL_RUN_STORE=<backend name>)."""
    kind = (os.environ.get(ENV_RUN_STORE) or "").strip().lower()
    if not kind:
        return None
    module, offered = storehook.resolve(kind)     # the backend registry's answer
    if module is None:
        raise OptionError(f"{ENV_RUN_STORE}={kind!r} names no run store",
                          hint=f"use one of: {', '.join(offered) or 'none'}, or unset it to keep run state "
                               "in this machine's files")
    return importlib.import_module(module)


def open_store(run: str) -> RunStore:
    """The store of ``run``: this machine's files, or the cluster's (WMCTL_RUN_STORE)."""
    module = _store_module()
    return LocalRunStore(run) if module is None else module.open_store(run)


def list_runs(home: Path | None = None) -> list[str]:
    """Every run the chosen store keeps (``home``: the local store's root, for tests)."""
    module = _store_module()
    return local_runs(home) if module is None or home is not None else module.list_runs()


def _flock(fh: IO[str], mode: int, wait_s: float, give_up: Callable[[], bool] = lambda: False) -> bool:
    """Take ``mode`` (LOCK_EX, LOCK_SH) on ``fh``, waiting up to ``wait_s`` while another holds
    it, unless ``give_up()`` says its holder is not worth waiting for. True when taken."""
    deadline = time.monotonic() + wait_s
    pause = 0.001               # a look lasts microseconds: try again soon, then less often
    while True:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline or give_up():
                return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # another user's process: alive
        return True
    return True


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary name beside ``path``, fsync, rename: never a torn file."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def local_runs(home: Path | None = None) -> list[str]:
    root = layout.runs_root(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / layout.RECORD_FILE).exists())
