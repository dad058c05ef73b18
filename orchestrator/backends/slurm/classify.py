"""Slurm's evidence -> events: pure. Here, the records a job leaves in its attempt folder (the
node script and the batch script of render.py): how each node ended, and how srun ended. They
outlive Slurm's memory of the job (MinJobAge, 300 s by default), so a watcher that was away for
longer still learns the end. Queue and node states (squeue, sacct, scontrol) come with the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import base as b

KILLED_EXIT = 128 + 9    # what bash reports for a process SIGKILLed (128 + the signal's number)


@dataclass(frozen=True)
class NodeEnd:
    """A node's exit record: what its torchrun exited with, as the node script saw it."""

    node: int
    host: str
    exit_code: int
    job_id: str
    time: float


@dataclass(frozen=True)
class JobEnd:
    """The job's exit record: srun's exit status (the highest of its tasks')."""

    job_id: str
    exit_code: int
    time: float


def node_end(text: str) -> NodeEnd | None:
    """The record's content, or None while it is not a whole, well-formed record (the script
    writes it to a temporary name and renames it, so a partial one means another writer)."""
    data = _object(text)
    if data is None or not _ints(data, "node", "exit_code") or not isinstance(data.get("host"), str):
        return None
    when = data.get("time")
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return None
    return NodeEnd(data["node"], data["host"], data["exit_code"], str(data.get("job_id") or ""), float(when))


def job_end(text: str) -> JobEnd | None:
    data = _object(text)
    if data is None or not _ints(data, "exit_code") or not isinstance(data.get("time"), (int, float)):
        return None
    return JobEnd(str(data.get("job_id") or ""), data["exit_code"], float(data["time"]))


def node_exited(end: NodeEnd) -> b.Event:
    """The NODE_EXITED event a node's exit record makes (exit code 137: SIGKILLed, as bash says)."""
    reason = "SIGKILL" if end.exit_code == KILLED_EXIT else None
    how = " (SIGKILL)" if reason else ""
    return b.Event(b.NODE_EXITED, time=end.time, node=end.node, host=end.host, exit_code=end.exit_code,
                   reason=reason, message=f"torchrun exited with {end.exit_code}{how} on {end.host}")


def _object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _ints(data: dict[str, Any], *keys: str) -> bool:
    return all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) for k in keys)
