"""What a watcher hands its view: lines, and the news the live panel folds (``News``).

The supervisor writes to one ``WatchView``; orchestrator.display draws it (plain lines, or lines
above a live panel) and orchestrator.panel folds the news. Here so that all three share these
types without importing one another.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .backends import base as b
from .state import AttemptRecord, RunRecord


@dataclass(frozen=True)
class News:
    """What the supervisor tells a watcher's view besides its lines: the run, the attempt it
    watches, that attempt's nodes, this round's events (as the backend reported them, event time
    included), and the supervisor's own clocks. The live panel folds these; nothing is read twice."""

    record: RunRecord
    attempt: AttemptRecord
    nodes: list[b.NodeStatus]
    events: list[b.Event] = field(default_factory=list)
    heartbeat_at: float | None = None     # the hang clock's last tick; None until it runs
    heartbeat_timeout_s: float = 0.0
    backoff_until: float | None = None    # waiting until then before the next attempt
    # Once, when a watcher takes up a run: the progress events earlier attempts kept in the run
    # store (metrics.jsonl), which no backend replays: the loss trend and checkpoints so far.
    history: list[dict[str, Any]] = field(default_factory=list)


class WatchView(Protocol):
    """Where a watcher's lines and news go (orchestrator.display)."""

    def line(self, text: str, at: float | None = None) -> None:
        """One line; ``at``: when what it reports happened (an event replayed on attach), else now."""

    def news(self, news: News) -> None:
        """The state changed (see News)."""



class EchoView:
    """A view for a caller that wants only the lines: each goes to ``echo`` (a list's append, a
    logger); the news, already said in lines, is dropped."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo

    def line(self, text: str, at: float | None = None) -> None:
        self.echo(text)

    def news(self, news: News) -> None:
        """Nothing to redraw."""


# Set by the watch commands' SIGINT handler (commands/_common.interrupted_watch). CPython may
# swallow the KeyboardInterrupt that handler raises when it lands inside a callback (seen in CI:
# "Exception ignored in _get_module_lock.<locals>.cb", and the watcher went on); the supervisor's
# sleep raises it again from its own loop.
INTERRUPTED = threading.Event()


def interruptible_sleep(seconds: float) -> None:
    """``time.sleep`` that raises KeyboardInterrupt once the user's Ctrl-C was seen."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
    time.sleep(seconds)
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
