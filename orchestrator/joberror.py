"""A job's failure in its own words: the end of the failing node's output, read from its
backend before a teardown takes the node away, and what that output says the failure was
(the job's traceback, the agent's rendezvous, a device fault, a full disk)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

from . import failures as F
from .backends import base as b
from .errors import WmctlError
from .vendors import VendorProfile

LOG_TAIL_LINES = 400      # of a failed node's output, searched for the failing rank's error


def with_job_error(backend: b.Backend[Any], ref: b.AttemptRef, failure: F.Failure, lines: list[str] | None = None,
                   profile: VendorProfile | None = None) -> tuple[F.Failure, F.JobError | None]:
    """An application error is reported in the failing rank's own words: its traceback's end,
    read from its node's output (``lines``, when already read) before a teardown takes the
    node away. An exit that was the torchrun agent's own rendezvous failure is infrastructure."""
    if failure.kind != F.APP_ERROR or failure.node is None:
        return failure, None
    lines = lines if lines is not None else node_tail(backend, ref, failure.node)
    if lines is None:
        return failure, None
    rendezvous = F.rendezvous_failure(lines)
    if rendezvous is not None:      # the agent's, not the job's: infrastructure, retried
        return replace(failure, kind=F.RENDEZVOUS, evidence=f"{failure.evidence}; {rendezvous}"), None
    error = F.job_error(lines)
    device = F.device_fault(lines, profile.device_fault_patterns if profile is not None else [])
    if device is not None:          # the vendor's words for a failed device: the node, not the job
        return replace(failure, kind=F.DEVICE_FAULT, evidence=f"{failure.evidence}; {device}"), error
    if error is None:
        return failure, None
    full = F.storage_full(error)
    if full is not None:
        return replace(failure, kind=F.STORAGE_FULL, evidence=f"{full}; {error.summary}"), error
    return replace(failure, evidence=f"{failure.evidence}; {error.summary}"), error


def node_tail(backend: b.Backend[Any], ref: b.AttemptRef, node: int) -> list[str] | None:
    """The end of one node's output (None when it cannot be read)."""
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    try:
        tail.extend(backend.logs(ref, node=node, follow=False))
    except WmctlError:
        return None
    return list(tail)
