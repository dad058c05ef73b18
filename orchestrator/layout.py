"""Every derived name and path, in one place: the ground floor every other module builds on.

A run ``R`` has attempts ``R-a0``, ``R-a1``, ...; the attempt name is also its rendezvous id
(a late agent of attempt N can never join attempt N+1) and the prefix of its node names
(containers, pods' hostnames). The run folder under ``$WMCTL_HOME/runs/R`` holds the record
and one folder per attempt with each node's log, whatever the backend.
"""

from __future__ import annotations

import os
from pathlib import Path

from .runtime.protocol import ENV_HOME

RUNS = "runs"
RECORD_FILE = "run.json"
WATCHER_LOCK = "watcher.lock"
RECONCILE_LOCK = "reconcile.lock"  # held by a reader (status, list) folding what it saw into the record
WATCHER_LEASE = "watcher.json" # who watches: pid, host, last beat (read across hosts sharing the folder)
WATCHER_LOG = "watcher.log"   # a detached watcher's output (`wmctl logs RUN --watcher`)
CANCEL_FILE = "cancel.json"   # the cancel intent, written before anything is torn down
METRICS_FILE = "metrics.jsonl"
PLAN_FILE = "plan.json"
CHECKPOINTS = "checkpoints"   # the default checkpoint folder of a local run without checkpoint.dir


def attempt_name(run: str, attempt: int) -> str:
    """Deterministic per-attempt name: a second submit of the same attempt is a conflict."""
    return f"{run}-a{attempt}"


def rendezvous_id(run: str, attempt: int) -> str:
    """Unique per attempt: a late agent of attempt N can never join attempt N+1's rendezvous."""
    return attempt_name(run, attempt)


def node_name(run: str, attempt: int, node: int) -> str:
    """A node's container name and hostname (Docker), and its pod hostname (Indexed Job)."""
    return f"{attempt_name(run, attempt)}-{node}"


def round_rendezvous_id(run: str, attempt: int, round_: int) -> str:
    """Round ``round_`` of an attempt with spare nodes (0: as submitted; each in-place recovery
    opens the next, docs/spares.md): a fresh rendezvous that no agent of an older round can join."""
    return rendezvous_id(run, attempt) if round_ == 0 else f"{rendezvous_id(run, attempt)}-r{round_}"


def local_host(node: int) -> str:
    """The host name a local node reports: every local node is on this machine."""
    return f"localhost-{node}"


# ---- the run folder ------------------------------------------------------------------------

def wmctl_home() -> Path:
    """$WMCTL_HOME (default ~/.wmctl). A path that exists and is not a folder is refused here,
    once, instead of failing later in whichever command first writes under it."""
    home = Path(os.environ.get(ENV_HOME) or Path.home() / ".wmctl")
    if os.path.lexists(home) and not os.path.isdir(home):
        from .errors import OptionError

        raise OptionError(f"{ENV_HOME}={home} is not a folder: wmctl keeps its runs in a folder there",
                          hint=f"point {ENV_HOME} at a folder (it is created if missing), or unset it for ~/.wmctl")
    return home


def runs_root(home: Path | None = None) -> Path:
    return (home or wmctl_home()) / RUNS


def run_dir(run: str, home: Path | None = None) -> Path:
    return runs_root(home) / run


def attempt_dir(run: str, attempt: int, home: Path | None = None) -> Path:
    return run_dir(run, home) / f"attempt-{attempt}"


def attempt_number(folder_name: str) -> int | None:
    """``attempt-3`` -> 3; None for any other name."""
    prefix, _, number = folder_name.partition("-")
    return int(number) if prefix == "attempt" and number.isdigit() else None


def node_log(run: str, attempt: int, node: int, home: Path | None = None) -> Path:
    """A node's output: written live by the local backend, archived at teardown by the others."""
    return attempt_dir(run, attempt, home) / f"node-{node}.log"


def node_exit_file(run: str, attempt: int, node: int, home: Path | None = None) -> Path:
    return attempt_dir(run, attempt, home) / f"node-{node}.exit.json"


def rounds_dir(run: str, attempt: int, home: Path | None = None) -> Path:
    """An attempt's rounds with spare nodes (local): round-N.json says which slots run in round N."""
    return attempt_dir(run, attempt, home) / "rounds"


def node_pid_file(run: str, attempt: int, node: int, home: Path | None = None) -> Path:
    return attempt_dir(run, attempt, home) / f"node-{node}.pid.json"
