"""Spare nodes on the Docker backend (restart.spares, docs/spares.md): the engine's side of an
in-place recovery (the lost container killed, the next round written) and of replenishing (a new
spare container made from the lost slot's). A mixin of DockerBackend (engine.py): what it uses of
the backend is ``_Engine``."""

from __future__ import annotations

import threading
import time
import types
from typing import Any, Callable, Protocol

from ...adaptors import docker as sdk
from ...errors import BackendError
from .. import base as b
from . import slotfiles
from . import spares as S
from .evidence import AttemptState


class _Engine(Protocol):
    _log_follow: bool

    @property
    def client(self) -> Any: ...

    def _state_for(self, ref: b.AttemptRef) -> AttemptState: ...

    def _quiet_kill(self, cid: str) -> None: ...

    def _ensure_container(self, res: dict[str, Any], plan: Any, undo: list[Callable[[], None]]) -> str: ...

    def _start(self, cid: str) -> None: ...

    def _rollback(self, undo: list[Callable[[], None]]) -> None: ...

    def _follow_progress(self, st: AttemptState, name: str, node: int = 0, witness: bool = False) -> None: ...

    def _running(self, name: str) -> bool: ...


class SpareSlots:
    """recover_in_place and replenish_spare of the Docker backend."""

    def recover_in_place(self: _Engine, ref: b.AttemptRef, node: int) -> b.InPlaceRecovery | None:
        """Replace lost slot ``node`` with an idle spare container: the lost container is killed
        (`docker kill`: fenced off, a paused one too) and the next round names the spare in its
        place; every keeper of the round restarts its torchrun (runtime/keeper.py). No container is
        created or removed. None when the attempt has no spare left."""
        current = slotfiles.current(ref.run, ref.attempt)
        if current is None or node not in current["active"]:
            return None
        with sdk.engine(f"replacing node {node} of {ref.attempt_name} with a spare"):
            st = self._state_for(ref)
            used = slotfiles.used_slots(ref.run, ref.attempt)
            idle = [slot for slot in sorted(st.names) if slot not in used and self._running(st.names[slot])]
            if not idle:
                return None
            spare = idle[0]
            self._quiet_kill(st.names[node])
            n, active = slotfiles.next_round(ref.run, ref.attempt, node, spare)
        with st.lock:
            for slot in active:      # the new round's news only: each keeper starts over (its log goes on)
                st.status.pop(slot, None)
        return b.InPlaceRecovery(round=n, lost=node, spare=spare, spares_left=len(idle) - 1)

    def replenish_spare(self: _Engine, ref: b.AttemptRef, lost: int) -> int | None:
        """A new spare container in a new slot (the next number), made from the lost slot's (its
        CPUs and devices are free now: its container was killed), created and started; its keeper
        imports torchrun in the container while it waits, not waited for here. None when the
        attempt is over or the engine refuses."""
        if not slotfiles.has_rounds(ref.run, ref.attempt) or slotfiles.closed(ref.run, ref.attempt):
            return None
        res = slotfiles.slot_resource(ref.run, ref.attempt, lost)
        if res is None:
            return None
        errors, _ = sdk.errors()
        with sdk.engine(f"starting a new spare for {ref.attempt_name}"):
            st = self._state_for(ref)
            slot = max(st.names) + 1
            fresh = S.for_slot(res, ref.run, ref.attempt, slot)
            owner = types.SimpleNamespace(run=ref.run, attempt=ref.attempt, attempt_name=ref.attempt_name)
            undo: list[Callable[[], None]] = []
            try:
                self._start(self._ensure_container(fresh, owner, undo))
            except (errors.APIError, BackendError):     # never the watcher's end: the next loss resubmits
                self._rollback(undo)
                return None
        with st.lock:
            st.names[slot] = fresh["create"]["name"]
            st.alive_at[slot] = time.time()
        if self._log_follow and not st.stop.is_set():
            t = threading.Thread(target=self._follow_progress, args=(st, st.names[slot], slot, False), daemon=True,
                                 name=f"wmctl-docker-log-{slot}-{ref.attempt_name}")
            st.threads.append(t)
            t.start()
        return slot

    def _running(self: _Engine, name: str) -> bool:
        errors, _ = sdk.errors()
        try:
            return self.client.api.inspect_container(name)["State"].get("Status") == "running"
        except errors.NotFound:
            return False
