"""The job's side of the progress channel: one ``WMCTL-PROGRESS {json}`` line per event.

Only global rank 0 speaks (every rank would otherwise multiply the lines in `docker logs`).
Thread-safe: an async checkpoint commits from a background thread.

``callback``: called with each event as a dict (the line's JSON: ``event``, ``time`` and the
fields), on rank 0, after the line is written, one call at a time, in the thread that emitted it.
It forwards the same events to TensorBoard, W&B or anything else without parsing logs. An
exception it raises never reaches the training loop: the first is reported on stderr (once), all
are counted in ``callback_errors``, and later events still reach the callback. A line the
callback itself emits is written, not forwarded to it again.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, TextIO

from orchestrator.runtime import protocol
from orchestrator.runtime.dist import env_int, rank

DEFAULT_HEARTBEAT_EVERY = 10


class Progress:
    def __init__(
        self,
        every: int | None = None,
        stream: TextIO | None = None,
        path: str | None = None,
        enabled: bool | None = None,
        callback: Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        default_every = env_int(protocol.ENV_HEARTBEAT_EVERY, DEFAULT_HEARTBEAT_EVERY)
        self.every = max(1, every if every is not None else default_every)
        self.path = path if path is not None else (os.environ.get(protocol.ENV_PROGRESS_FILE) or None)
        self.enabled = (rank() == 0) if enabled is None else enabled
        self._stream = stream
        # Reentrant: the callback runs under it and may itself emit (its line is written, not
        # forwarded again); a plain Lock would hang training there.
        self._lock = threading.RLock()
        self._forwarding = False
        self.run = os.environ.get(protocol.ENV_RUN, "")
        self.attempt = env_int(protocol.ENV_ATTEMPT, 0)
        self.callback = callback
        self.callback_errors = 0

    def emit(self, event: str, **fields: Any) -> str | None:
        if not self.enabled:
            return None
        # format_progress + our own write (not protocol.emit_progress): its ``path`` argument would
        # collide with the checkpoint event's ``path`` field.
        line = protocol.format_progress(event, **fields)
        with self._lock:
            out = self._stream or sys.stdout
            out.write(line + "\n")
            out.flush()
            if self.path:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            if self.callback is not None and not self._forwarding:
                self._forwarding = True
                try:
                    self._forward(line)
                finally:
                    self._forwarding = False
        return line

    def _forward(self, line: str) -> None:
        event, callback = protocol.parse_progress(line), self.callback
        if event is None or callback is None:
            return
        try:
            callback(event)
        except Exception as exc:     # the user's code: training goes on whatever it raises
            self.callback_errors += 1
            if self.callback_errors == 1:
                sys.stderr.write(f"wmctl: the progress callback raised {type(exc).__name__}: {exc}; training "
                                 "goes on, later events still reach it (further errors are counted, not shown)\n")
                sys.stderr.flush()

    def start(self, world_size: int, **fields: Any) -> str | None:
        return self.emit("start", run=self.run, attempt=self.attempt, world_size=world_size, **fields)

    def resume(self, step: int, path: str, **fields: Any) -> str | None:
        return self.emit("resume", step=step, path=path, **fields)

    def step(self, step: int, loss: float, samples: int, timing: dict[str, Any] | None = None,
             force: bool = False, **fields: Any) -> str | None:
        """Heartbeat: emitted every ``every`` steps (WMCTL_HEARTBEAT_EVERY) or when forced."""
        if not force and step % self.every != 0:
            return None
        return self.emit("step", step=step, loss=loss, samples=samples, timing=timing or {}, **fields)

    def checkpoint(self, step: int, path: str, seconds: float, **fields: Any) -> str | None:
        return self.emit("checkpoint", step=step, path=path, seconds=round(seconds, 4), **fields)

    def checkpoint_damaged(self, path: str, reason: str, damaged_step: int | None = None,
                           **fields: Any) -> str | None:
        """A checkpoint restore skipped as damaged. ``damaged_step``, not ``step``: a step field
        reads as the job's progress, and the damaged one may be ahead of where it resumes."""
        return self.emit("checkpoint_damaged", path=path, reason=reason, damaged_step=damaged_step, **fields)

    def preempted(self, step: int, **fields: Any) -> str | None:
        return self.emit("preempted", step=step, exit_code=protocol.PREEMPTED_EXIT_CODE, **fields)

    def exit(self, status: str, **fields: Any) -> str | None:
        return self.emit("exit", status=status, **fields)
