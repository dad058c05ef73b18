"""Docker facts -> node phases and events: pure functions of what ``inspect`` and the events
API report (unit-tested without an engine)."""

from __future__ import annotations

import time
from typing import Any

from .. import base as b
from ..logcursor import parse_rfc3339_ns

TERMINAL = (b.SUCCEEDED, b.FAILED, b.LOST)


def parse_docker_time(value: str | None) -> float | None:
    """RFC 3339 with nanoseconds (Docker's format) -> epoch seconds; None for Docker's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    ns = parse_rfc3339_ns(value)
    return ns / 1e9 if ns is not None else None


def node_status(node: int, host: str, state: dict[str, Any] | None, *, signal: int | None,
                cancelled: bool, previous: b.NodeStatus | None, gone_exit: int | None = None) -> b.NodeStatus:
    """A container's inspect ``State`` (None: the container is gone) -> the node's phase.

    ``signal``: the last signal someone outside wmctl sent it (from a ``kill`` event). A terminal
    phase, once seen, sticks: a finished container that is later removed stays finished.
    ``gone_exit``: for a container that is gone, the exit code of its ``die`` event, when the
    engine still had that event: a container that had exited on its own before someone removed
    it ended with its own status; one killed (137, 143, a kill signal: `docker rm -f`) is lost.
    """
    if previous is not None and previous.phase in TERMINAL:
        return previous
    if state is None or state.get("Status") == "removing":
        if cancelled:
            return b.NodeStatus(node, b.FAILED, host, None, "cancelled")
        if gone_exit is not None and gone_exit not in (137, 143) and signal not in (9, 15):
            return node_status(node, host, {"Status": "exited", "ExitCode": gone_exit}, signal=None,
                               cancelled=False, previous=None)
        return b.NodeStatus(node, b.LOST, host, None, "ContainerRemoved")
    status = state.get("Status")
    if status == "created":
        return b.NodeStatus(node, b.PENDING, host)
    if status in ("running", "restarting"):
        return b.NodeStatus(node, b.RUNNING, host)
    if status == "paused":
        return b.NodeStatus(node, b.PAUSED, host, None, "paused")
    if status in ("exited", "dead"):
        code = state.get("ExitCode")
        if cancelled:
            return b.NodeStatus(node, b.FAILED, host, code, "cancelled")
        if state.get("OOMKilled"):
            return b.NodeStatus(node, b.FAILED, host, code, "OOMKilled")
        if code == 0 and status == "exited":
            return b.NodeStatus(node, b.SUCCEEDED, host, 0)
        return b.NodeStatus(node, b.FAILED, host, code, _exit_reason(code, signal, status))
    return b.NodeStatus(node, b.UNKNOWN, host, None, str(status))


def _exit_reason(code: int | None, signal: int | None, status: str) -> str | None:
    # 137 = 128 + SIGKILL. Without OOMKilled that is a kill from outside the job (`docker kill`,
    # a dying host): the classifier treats reason SIGKILL as a lost node.
    if signal == 9 or code == 137:
        return "SIGKILL"
    if signal == 15 or code == 143:
        return "SIGTERM"
    if status == "dead":
        return "dead"
    return None


def transition_events(previous: b.NodeStatus | None, current: b.NodeStatus, *,
                      started_at: float | None, finished_at: float | None, event_time: float | None,
                      name: str, last_alive: float | None = None) -> list[b.Event]:
    """The events that lead from the last reported phase to the current one (none if unchanged).
    ``last_alive``: when the container was last seen alive (a look that found it running, or
    the attempt's start for a reader that never saw it): a container found gone with no
    ``destroy`` event left to date it can have been removed any time since, and nobody may have
    looked until long after."""
    before = previous.phase if previous is not None else None
    now = current.phase
    if before == now:
        return []
    node, host = current.node, current.host
    out: list[b.Event] = []
    if now == b.RUNNING:
        reason = "unpaused" if before == b.PAUSED else None
        t = event_time if before == b.PAUSED and event_time else (started_at or time.time())
        out.append(b.Event(b.NODE_STARTED, t, node, host, reason=reason))
    elif now == b.PAUSED:
        out.append(b.Event(b.NODE_PAUSED, event_time or time.time(), node, host, reason="paused",
                           message=f"container {name} is paused (frozen): no exit will come"))
    elif now in (b.SUCCEEDED, b.FAILED):
        if current.reason == "cancelled":
            return []  # the attempt-level CANCELLED event covers it
        if before in (None, b.PENDING) and started_at is not None:
            out.append(b.Event(b.NODE_STARTED, started_at, node, host))
        t = finished_at or event_time or time.time()
        if current.reason == "OOMKilled":
            out.append(b.Event(b.OOM_KILLED, t, node, host, exit_code=current.exit_code, reason="OOMKilled",
                               message=f"container {name} exceeded its memory limit (OOMKilled, "
                                       f"exit {current.exit_code})"))
        else:
            msg = f"container {name} exited with {current.exit_code}"
            if current.reason == "SIGKILL":
                msg += " (killed with SIGKILL from outside the job)"
            out.append(b.Event(b.NODE_EXITED, t, node, host, exit_code=current.exit_code,
                               reason=current.reason, message=msg))
    elif now == b.LOST:
        out.append(b.Event(b.NODE_LOST, event_time or time.time(), node, host, reason="ContainerRemoved",
                           message=f"container {name} disappeared (removed by someone other than wmctl)",
                           since=None if event_time else last_alive))
    return out
