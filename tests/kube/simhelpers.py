"""Helpers for backend simulations: poll a backend until a condition holds."""

from __future__ import annotations

import time
from typing import Callable

from orchestrator.backends.base import Event, Observation


class Collector:
    """Accumulates every event a backend reports across polls."""

    def __init__(self, backend, ref):
        self.backend, self.ref = backend, ref
        self.events: list[Event] = []
        self.last: Observation | None = None

    def poll(self) -> Observation:
        self.last = self.backend.poll(self.ref)
        self.events.extend(self.last.events)
        return self.last

    def until(self, pred: Callable[["Collector"], bool], timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if pred(self):
                return True
            time.sleep(0.02)
        self.poll()
        return pred(self)

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]
