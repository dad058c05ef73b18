"""Where a torn-down node's output is kept, for every backend that loses it on teardown.

Docker removes an attempt's containers and Kubernetes its pods, and their logs go with them;
`wmctl logs` of a failed attempt is the first thing a user asks for, so teardown copies the tail
of each node's log into the run folder, in the local backend's layout.
"""

from __future__ import annotations

from pathlib import Path

from ..render.local import run_dir
from .base import AttemptRef

ARCHIVE_TAIL_LINES = 20000


def archive_path(ref: AttemptRef, node: int) -> Path:
    return run_dir(ref.run) / f"attempt-{ref.attempt}" / f"node-{node}.log"


def write_archive(ref: AttemptRef, node: int, data: bytes) -> None:
    path = archive_path(ref, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def read_archive(ref: AttemptRef, node: int):
    """The archived lines of ``node``, or None when teardown kept none."""
    path = archive_path(ref, node)
    if not path.exists():
        return None
    with open(path, encoding="utf-8", errors="replace") as fh:
        return [line.rstrip("\n") for line in fh]
