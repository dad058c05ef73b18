"""A followed container log read again after a dropped stream: no line lost, none repeated.

Both engines stamp a line when the copier of its stream reads it, then write it through the one
log writer stdout and stderr share: moby daemon/logger/copier.go (copySrc, a goroutine per
stream: ``Timestamp: time.Now()``, then ``dst.Log``) and containerd internal/cri/io/logger.go
(redirectLogs, a goroutine per stream: ``time.Now()``, then ``w.Write``). So the stamps in a log
are not sorted: a stdout line can follow a stderr line stamped after it (on this machine 26 of
20,000 lines written alternately to stdout and stderr). A reader that drops every line older than
the newest it has read loses such a line -- in CI a job's ``resume`` progress line, printed just
after its own stderr note about the checkpoint it resumed from.

The cursor drops a line only if it has read that line (its stamp and text), or if the line is
stamped more than REORDER_WINDOW_NS before the newest line read; a resumed read asks the engine
for everything from that far back (``resume_from_ns``), so no line within the window is missed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

# How far out of order the engines' stamps may be: goroutine scheduling, microseconds to
# milliseconds; five seconds covers a loaded host many times over.
REORDER_WINDOW_NS = 5 * 10**9


def parse_rfc3339_ns(value: str) -> int | None:
    """RFC 3339 (up to nanoseconds, 'Z' or an offset) -> integer epoch nanoseconds, exact (the
    cursor compares stamps to the nanosecond)."""
    try:
        head, _, rest = value.partition(".")
        if not rest:  # no fraction: "...:05Z" or "...:05+00:00"
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()) * 10**9
        n = len(rest) - len(rest.lstrip("0123456789"))
        digits, tz = rest[:n], rest[n:]
        tz = "+00:00" if tz in ("Z", "") else tz
        whole = datetime.fromisoformat(head + tz)
        return int(whole.timestamp()) * 10**9 + int(digits.ljust(9, "0")[:9])
    except ValueError:
        return None


def split_timestamp(raw: str) -> tuple[int | None, str]:
    """'2026-12-04T15:10:00.123456789Z text' (a log line read with timestamps, Docker's or the
    kubelet's) -> (unix nanoseconds, 'text'); (None, raw) for a line without a stamp."""
    head, sep, text = raw.partition(" ")
    if sep and head[:1].isdigit() and "T" in head:
        stamp = parse_rfc3339_ns(head)
        if stamp is not None:
            return stamp, text.rstrip("\r")
    return None, raw.rstrip("\r")


@dataclass
class LogCursor:
    """What a followed log has delivered: the newest stamp, and the lines read within
    REORDER_WINDOW_NS of it."""

    newest: int | None = None
    _read: set[tuple[int, str]] = field(default_factory=set)
    _order: deque[tuple[int, str]] = field(default_factory=deque)

    def fresh(self, stamp: int | None, text: str) -> bool:
        """Is this line new? Records it if so. A line without a stamp always is."""
        if stamp is None:
            return True
        key = (stamp, text)
        if key in self._read:
            return False
        if self.newest is not None and stamp < self.newest - REORDER_WINDOW_NS:
            return False            # before the window: a resumed read's replay of what was read
        self._read.add(key)
        self._order.append(key)
        if self.newest is None or stamp > self.newest:
            self.newest = stamp
            floor = stamp - REORDER_WINDOW_NS
            while self._order and self._order[0][0] < floor:
                self._read.discard(self._order.popleft())
        return True

    def resume_from_ns(self) -> int | None:
        """The earliest stamp a resumed read must include (None: read from the start)."""
        return None if self.newest is None else self.newest - REORDER_WINDOW_NS
