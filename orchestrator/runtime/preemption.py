"""Graceful preemption: a signal only sets a flag; ranks agree at a step boundary.

Kubernetes and ``docker stop`` send SIGTERM to PID 1; torchrun forwards SIGTERM/SIGINT to its
workers and SIGKILLs them 30 s later (Kubernetes' default grace period is also 30 s). Doing the
work in the handler (saving from inside a signal handler, in the middle of a collective) is
unsafe, so the handler records the signal and the loop checks ``should_stop()`` after each
optimizer step. The check is an all-reduce MAX so that all ranks stop at the same step even when
the signal reached only some of them.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any

from orchestrator.runtime import dist
from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE


class PreemptionHandler:
    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.received: int | None = None    # the first signal number seen by this rank
        self.received_at: float | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> PreemptionHandler:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def __enter__(self) -> PreemptionHandler:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Async-signal context: record only. A second signal changes nothing; torchrun's
        # SIGKILL after the grace period is the hard stop.
        if self.received is None:
            self.received = signum
            self.received_at = time.monotonic()

    @property
    def local_flag(self) -> bool:
        return self.received is not None

    def should_stop(self) -> bool:
        """Call at every optimizer-step boundary on every rank: True on all ranks or on none."""
        # One tiny all-reduce per optimizer step; the same call on every rank keeps them in step.
        return dist.all_reduce_max(1 if self.local_flag else 0) > 0

    @staticmethod
    def exit_preempted() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(PREEMPTED_EXIT_CODE)

    @staticmethod
    def exit_now() -> None:
        """Leave at once with PREEMPTED_EXIT_CODE, skipping interpreter shutdown.

        Call only after the checkpoint is committed and its manager closed: close() also
        finishes retention's deletes, and no thread outlives this exit. Once one worker exits,
        torchrun SIGTERMs the others; Python restores the default SIGTERM action during
        finalisation, so a rank still shutting down would die with -15 instead of reporting 83.
        """
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PREEMPTED_EXIT_CODE)
