"""What the Docker backend knows of one attempt between looks: the engine's events applied to
its evidence (kill signals, exit codes of die events, the engine's own times), and the lines of a
`docker logs --timestamps` stream. Pure of the engine: the backend (engine.py) feeds it."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ... import labels as L
from .. import base as b
from ..logcursor import LogCursor, split_timestamp


@dataclass
class AttemptState:
    """What is known of one attempt's containers: what the engine's events said (signals, exit
    codes, times) and the phase each node was last seen in."""

    ref: b.AttemptRef
    names: dict[int, str]                       # node -> container name
    inbox: "queue.Queue[tuple[str, Any]]" = field(default_factory=queue.Queue)
    stop: threading.Event = field(default_factory=threading.Event)
    streams: list[Any] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    status: dict[int, b.NodeStatus] = field(default_factory=dict)
    signals: dict[int, int] = field(default_factory=dict)       # last outside kill signal per node
    event_times: dict[tuple[int, str], float] = field(default_factory=dict)  # (node, action) -> latest time
    died: dict[int, int] = field(default_factory=dict)          # node -> exit code of its last die event
    alive_at: dict[int, float] = field(default_factory=dict)    # node -> when last seen alive (or the start)
    seen: set[tuple[Any, ...]] = field(default_factory=set)      # docker events already applied
    cancelled: bool = False
    cancel_reported: bool = False
    spares: bool = False            # slots with spare nodes: rounds decide which are active (slotfiles.py)
    lock: threading.Lock = field(default_factory=threading.Lock)


def drain(st: AttemptState) -> list[b.Event]:
    """Apply queued docker events to the attempt's evidence; return queued PROGRESS events."""
    out: list[b.Event] = []
    while True:
        try:
            kind, item = st.inbox.get_nowait()
        except queue.Empty:
            return out
        if kind == "progress":
            out.append(item)
            continue
        key = (item.get("timeNano"), item.get("id"), item.get("Action") or item.get("status"))
        if key in st.seen:
            continue  # replayed after a resubscription
        st.seen.add(key)
        attrs = (item.get("Actor") or {}).get("Attributes") or {}
        node_s = attrs.get(L.NODE, "")
        if not node_s.isdigit():
            continue
        node = int(node_s)
        action = (item.get("Action") or item.get("status") or "").split(":")[0]
        t = item.get("timeNano", 0) / 1e9 or float(item.get("time", time.time()))
        if action == "kill" and not st.cancelled:
            sig = attrs.get("signal", "")
            st.signals[node] = int(sig) if sig.isdigit() else {"SIGKILL": 9, "SIGTERM": 15}.get(sig, 0)
        if action == "die" and attrs.get("exitCode", "").isdigit():
            st.died[node] = int(attrs["exitCode"])
        st.event_times[(node, action)] = t


def event_time(st: AttemptState, node: int, prev: b.NodeStatus | None, cur: b.NodeStatus) -> float | None:
    """The engine's own time for the transition, when its event has arrived already."""
    action = {b.PAUSED: "pause", b.LOST: "destroy", b.SUCCEEDED: "die", b.FAILED: "die"}.get(cur.phase)
    if cur.phase == b.RUNNING and prev is not None and prev.phase == b.PAUSED:
        action = "unpause"
    return st.event_times.get((node, action)) if action else None


def fresh_lines(stream: Iterable[bytes], cursor: LogCursor) -> Iterator[tuple[int, str]]:
    """(timestamp ns, line) of one `docker logs --timestamps` stream, each line the cursor has not
    yielded before. A line longer than base.MAX_LINE_BYTES comes out cut: the reader holds no more."""
    splitter = b.LineSplitter(ends=b.NEWLINE)
    for chunk in stream:
        for raw in splitter.feed(chunk):
            ns, line = split_timestamp(raw.decode("utf-8", "replace"))
            if cursor.fresh(ns, line):
                yield (ns or 0), line
    for raw in splitter.flush():
        ns, line = split_timestamp(raw.decode("utf-8", "replace"))
        if cursor.fresh(ns, line):
            yield (ns or 0), line
