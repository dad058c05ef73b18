"""A run's record on the watcher's machine: what was asked, what each attempt did.

The live truth is where the run lives (processes, containers, Kubernetes objects, labelled
with run and attempt); this record adds what those cannot hold: the resolved spec, the
excluded nodes, each attempt's failure and decision. A watcher lock (flock) makes sure only
one watcher acts on a run; deterministic attempt names make a duplicate submit a conflict.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field

from typing import Any

from .errors import RunNotFound, WmctlError
from .render.local import run_dir, wmctl_home


@dataclass
class AttemptRecord:
    attempt: int
    submitted_at: float
    excluded_nodes: list[str] = field(default_factory=list)
    resumed_from_step: int | None = None
    last_step: int | None = None
    last_checkpoint_step: int | None = None
    ended_at: float | None = None
    outcome: str | None = None          # succeeded, or a failure class
    evidence: str | None = None
    decision: str | None = None
    failed_node: int | None = None
    failed_host: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class RunRecord:
    run: str
    backend: str
    spec_path: str
    overrides: dict[str, Any]
    spec_hash: str
    auto_resume: bool
    kube_context: str | None = None
    namespace: str | None = None        # Kubernetes: where the run's objects live
    created_at: float = field(default_factory=time.time)
    status: str = "running"             # running, succeeded, failed
    final_report: str | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        attempts = [AttemptRecord(**a) for a in data.pop("attempts", [])]
        return cls(**data, attempts=attempts)


class RunStore:
    def __init__(self, run: str):
        self.run = run
        self.dir = run_dir(run)
        self.path = self.dir / "run.json"
        self._lock_fh = None

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> RunRecord:
        if not self.path.exists():
            known = ", ".join(list_runs()) or "none"
            raise RunNotFound(f"no run named {self.run!r} under {wmctl_home()} (known runs: {known})")
        return RunRecord.from_dict(json.loads(self.path.read_text()))

    def save(self, record: RunRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(record), indent=1))
        os.replace(tmp, self.path)

    def lock_watcher(self) -> None:
        """Become the only watcher of this run, or fail at once naming the one that is."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / "watcher.lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise WmctlError(f"run {self.run!r} is already being watched by {holder}",
                             hint="stop that watcher first, or use `wmctl status` to look without acting")
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        self._lock_fh = fh

    def unlock_watcher(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None


def list_runs() -> list[str]:
    root = wmctl_home() / "runs"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "run.json").exists())


