"""Every rank's pace, gathered by global rank 0: the figures the watcher finds stragglers in.

A rank's pace is the time it takes to REACH the step's first collective (``StepTimer`` measures
it: from the step's first phase to the start of its first ``backward(sync=True)`` or ``comm()``).
The wait inside the collective for a slow peer is not in it, so a slow node's figure grows and
its peers' do not (every rank's whole step grows alike: they wait for it).

- each rank (``record``, from ``StepTimer.end_step``) adds its step's figure to a running sum;
  a thread of its own writes the mean over the steps since its last write to the c10d store,
  ``wmctl/pace/<epoch>/<rank>`` = ``{"ms": ..., "steps": ..., "g": group rank, "host": ...}``,
  once every PUBLISH_S at most: one small write a second whatever the step time, never one per
  step, and never from the training thread (a store round trip there would be in the step);
- global rank 0's reader reads every rank's key each REPORT_S in one ``multi_get`` and prints a
  node's figure (its slowest rank's: one slow card makes the node slow) for the nodes with new
  figures, as one progress event:

      WMCTL-PROGRESS {"event": "pace", "steps": 240, "nodes": {"0": {"reach_ms": 3.1, "host": "a"},
                                                                "1": {"reach_ms": 52.4, "host": "b"}}}

The supervisor decides (orchestrator/stragglers.py: restart.straggler_ratio, straggler_window),
as it does for the liveness beat (liveness.py, whose store connection this copies). ``<epoch>``
is WMCTL_FENCE_EPOCH: a round of an attempt with spares never reads the round before's figures.
A job that does not use StepTimer, or runs on one node, publishes nothing: the feature is off.
"""

from __future__ import annotations

import json
import os
import atexit
import threading
from typing import Any, Callable

from orchestrator.runtime.liveness import STORE_TIMEOUT_S, _connect, _env_int, host_name
from orchestrator.runtime.protocol import emit_progress

PUBLISH_S = 1.0
REPORT_S = 2.0
KEY = "wmctl/pace/{}/{}"


def _epoch() -> str:
    return os.environ.get("WMCTL_FENCE_EPOCH", "0").strip() or "0"


class Publisher:
    """One rank's side: ``record`` is cheap (a lock and two additions); the thread writes."""

    def __init__(self, store: Any, rank: int, group_rank: int, *, stop: threading.Event | None = None):
        self._store, self._rank, self._group_rank = store, rank, group_rank
        self._lock = threading.Lock()
        self._sum, self._n, self._steps = 0.0, 0, 0
        self.stop = stop or threading.Event()
        self._key = KEY.format(_epoch(), rank)
        self._host = host_name()

    def record(self, reach_s: float, steps: int) -> None:
        with self._lock:
            self._sum += reach_s
            self._n += 1
            self._steps = steps

    def flush(self) -> bool:
        """Write the mean since the last write; False when the store is gone."""
        with self._lock:
            if not self._n:
                return True
            ms, steps = 1000.0 * self._sum / self._n, self._steps
            self._sum, self._n = 0.0, 0
        try:
            self._store.set(self._key, json.dumps({"ms": round(ms, 3), "steps": steps, "g": self._group_rank,
                                                   "host": self._host}))
        except (RuntimeError, OSError):
            return False
        return True

    def run(self) -> None:
        while not self.stop.wait(PUBLISH_S):
            if not self.flush():
                return


def read(store: Any, world: int, emit: Callable[..., Any], *, stop: threading.Event) -> None:
    """Global rank 0's reader: a ``pace`` event each REPORT_S with the nodes whose figures are new."""
    keys = [KEY.format(_epoch(), r) for r in range(world)]
    present: list[bool] = [False] * world
    seen: dict[int, bytes] = {}
    while not stop.wait(REPORT_S):
        try:
            for r, key in enumerate(keys):
                if not present[r]:
                    present[r] = bool(store.check([key]))   # multi_get would wait for a missing key
            ranks = [r for r in range(world) if present[r]]
            values = store.multi_get([keys[r] for r in ranks]) if ranks else []
        except (RuntimeError, OSError):
            return
        event = node_figures({r: v for r, v in zip(ranks, values, strict=True) if seen.get(r) != v})
        seen.update(zip(ranks, values, strict=True))
        if event is not None:
            emit("pace", **event)


def node_figures(raw: dict[int, bytes]) -> dict[str, Any] | None:
    """Ranks' published figures -> one per node (its slowest rank's) and the newest step count."""
    nodes: dict[str, dict[str, Any]] = {}
    steps = 0
    for value in raw.values():
        try:
            fig = json.loads(value)
            g, ms = str(int(fig["g"])), float(fig["ms"])
            steps = max(steps, int(fig["steps"]))
        except (ValueError, KeyError, TypeError):
            continue
        if g not in nodes or ms > nodes[g]["reach_ms"]:
            nodes[g] = {"reach_ms": round(ms, 3), "host": fig.get("host")}
    return {"steps": steps, "nodes": nodes} if nodes else None


_started: dict[str, Any] = {}


def publisher() -> Publisher | None:
    """This process's publisher, started on first use when the job runs on more than one node
    under torchrun (its store at MASTER_ADDR/MASTER_PORT); None otherwise, or when the store
    cannot be reached (the feature is then off, said once)."""
    if "pub" in _started:
        return _started["pub"]
    _started["pub"] = None
    nodes = _env_int("GROUP_WORLD_SIZE", 1)
    if nodes <= 1 or "MASTER_ADDR" not in os.environ:
        return None
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    try:
        pub = Publisher(_connect(), rank, _env_int("GROUP_RANK", 0))
        threads = [threading.Thread(target=pub.run, daemon=True, name="wmctl-pace")]
        if rank == 0:
            threads.append(threading.Thread(target=read, args=(_connect(), world, emit_progress),
                                            kwargs={"stop": pub.stop}, daemon=True, name="wmctl-pace-reader"))
    except (RuntimeError, OSError, KeyError, ValueError) as exc:
        print(f"wmctl: step pace not published ({exc}); stragglers are not detected", flush=True)
        return None

    def _stop() -> None:     # as liveness: threads out of store calls before the interpreter finalizes
        pub.stop.set()
        for t in threads:
            t.join(timeout=STORE_TIMEOUT_S + PUBLISH_S)

    atexit.register(_stop)
    for t in threads:
        t.start()
    _started["pub"] = pub
    return pub
