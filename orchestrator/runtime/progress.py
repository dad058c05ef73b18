"""The job's side of the progress channel: one ``WMCTL-PROGRESS {json}`` line per event.

Only global rank 0 speaks (every rank would otherwise multiply the lines in `docker logs`).
Thread-safe: an async checkpoint commits from a background thread.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TextIO

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
    ) -> None:
        default_every = env_int(protocol.ENV_HEARTBEAT_EVERY, DEFAULT_HEARTBEAT_EVERY)
        self.every = max(1, every if every is not None else default_every)
        self.path = path if path is not None else (os.environ.get(protocol.ENV_PROGRESS_FILE) or None)
        self.enabled = (rank() == 0) if enabled is None else enabled
        self._stream = stream
        self._lock = threading.Lock()
        self.run = os.environ.get(protocol.ENV_RUN, "")
        self.attempt = env_int(protocol.ENV_ATTEMPT, 0)

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
        return line

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
