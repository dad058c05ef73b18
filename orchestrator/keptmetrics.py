"""Which progress lines of an attempt the run store already has, so a watcher that adopts a
running attempt (and reads its output again from the start) keeps each line once, and what an
adopted run's panel shows of the earlier attempts. What it holds stays flat however long the run."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any, Iterable


# How many of the newest progress lines a watcher remembers to keep a line delivered twice once,
# and how many of the earlier attempts' step events it shows an adopted run's panel (its loss trend
# shows panel.SPARK_POINTS of them): what it holds stays flat, however long the run.
RECENT_KEYS = 4096
HISTORY_STEPS = 256


class KeptMetrics:
    """Which progress lines of an attempt the run store has: those an earlier watcher kept (a
    watcher adopting a running attempt reads its output again from the start; each such line is
    forgotten once seen again, since a replay shows it once) and the newest RECENT_KEYS seen."""

    def __init__(self, stored: set[tuple[Any, ...]] | None = None):
        self.stored = stored or set()
        self.recent: set[tuple[Any, ...]] = set()
        self.order: deque[tuple[Any, ...]] = deque()

    def first(self, key: tuple[Any, ...]) -> bool:
        """Is this line new to the store? Remembers it if so."""
        if key in self.stored:
            self.stored.discard(key)
            return False
        if key in self.recent:
            return False
        self.recent.add(key)
        self.order.append(key)
        if len(self.order) > RECENT_KEYS:
            self.recent.discard(self.order.popleft())
        return True


def adopted_metrics(events: Iterable[dict[str, Any]], attempt: int, *,
                    history: bool) -> tuple[KeptMetrics, list[dict[str, Any]]]:
    """From the run store's events, read as a stream: which of ``attempt``'s it has, and (with
    ``history``) what the panel shows of the earlier attempts: every event but steps, and the
    newest HISTORY_STEPS steps, in order."""
    stored: set[tuple[Any, ...]] = set()
    others: list[tuple[int, dict[str, Any]]] = []
    steps: deque[tuple[int, dict[str, Any]]] = deque(maxlen=HISTORY_STEPS)
    for n, m in enumerate(events):
        if m.get("attempt") == attempt:
            stored.add(metric_key(m))
        elif history and isinstance(m.get("attempt"), int) and m["attempt"] < attempt:
            (steps if m.get("event") == "step" else others).append((n, m))
    # back in the store's order: the panel folds them as they were kept
    return KeptMetrics(stored), [m for _, m in sorted([*others, *steps], key=lambda t: t[0])]


def metric_key(progress: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one progress line from another within an attempt: its event, step and the job's
    time, and a digest of everything it says. Event, step and time alone are not enough: a restore
    that walks past four damaged checkpoints reports them within one millisecond, without a step,
    and three of them were lost. What the store adds to a kept line (its attempt, when the watcher
    saw it) is left out, so a line read back from the store has the key it had when kept."""
    said = {k: v for k, v in progress.items() if k not in _ADDED_BY_THE_STORE}
    digest = hashlib.blake2b(json.dumps(said, sort_keys=True, separators=(",", ":"), default=str).encode(),
                             digest_size=12).digest()
    return progress.get("event"), progress.get("step"), progress.get("time"), digest


_ADDED_BY_THE_STORE = ("attempt", "seen")
