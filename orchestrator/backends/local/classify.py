"""Local node facts -> events: pure, from what the node's keeper left (its exit file, its pid
file) and the states /proc gives for its processes."""

from __future__ import annotations

import signal
from typing import Any

from .. import base as b


class NodeView:
    """What has been reported of one local node so far."""

    def __init__(self, node: int, host: str):
        self.node, self.host = node, host
        self.reported_start = False
        self.reported_end = False
        self.reported_pause = False
        self.phase = b.PENDING
        self.exit_code: int | None = None
        self.reason: str | None = None


def node_events(w: NodeView, exit_data: dict[str, Any] | None, pids: dict[str, Any] | None,
                keeper_state: str | None, agent_state: str | None,
                last_alive: float | None = None) -> list[b.Event]:
    """The events since ``w`` was last updated, given the node's files and process states
    (``/proc/PID/stat`` letters: R, S, T stopped, Z zombie; None: no such process).
    ``last_alive``: the node's last sign of life (its start, its last output), the earliest its
    processes can have vanished: nobody may have looked until long after."""
    if exit_data is not None:
        w.exit_code = exit_data["exit_code"]
        w.reason = "SIGKILL" if exit_data.get("signal") == signal.SIGKILL else None
        w.phase = b.SUCCEEDED if w.exit_code == 0 else b.FAILED
        w.reported_end = True
        killed = exit_data.get("oom_kills")
        if killed and w.exit_code != 0:
            # The keeper saw its cgroup's oom_kill count rise while the node ran (cgroup v2).
            w.reason = "OOMKilled"
            return [b.Event(b.OOM_KILLED, time=exit_data["time"], node=w.node, host=w.host,
                            exit_code=w.exit_code, reason=w.reason,
                            message=f"the kernel's OOM killer killed {killed} process(es) of node {w.node} "
                                    f"({exit_data.get('oom_cgroup')} counts oom_kill) and its torchrun agent "
                                    f"exited with {w.exit_code}: a rank needs more memory than it may use "
                                    "(lower its batch or model size per rank, or raise the memory limit)")]
        return [b.Event(b.NODE_EXITED, time=exit_data["time"], node=w.node, host=w.host,
                        exit_code=w.exit_code, reason=w.reason,
                        message=f"torchrun agent exited with {w.exit_code}")]
    if pids is None:
        return []
    if keeper_state in (None, "Z", "X"):
        w.phase, w.reason, w.reported_end = b.LOST, "gone", True
        return [b.Event(b.NODE_LOST, node=w.node, host=w.host, reason="gone", since=last_alive,
                        message="the node's processes vanished without an exit status (killed)")]
    events = []
    if not w.reported_start:
        w.reported_start, w.phase = True, b.RUNNING
        events.append(b.Event(b.NODE_STARTED, time=pids["started"], node=w.node, host=w.host))
    if agent_state == "T" and not w.reported_pause:
        w.reported_pause, w.phase = True, b.PAUSED
        events.append(b.Event(b.NODE_PAUSED, node=w.node, host=w.host, message="torchrun agent is stopped (SIGSTOP)"))
    elif agent_state not in ("T", None) and w.reported_pause:
        w.reported_pause, w.phase = False, b.RUNNING
    return events
