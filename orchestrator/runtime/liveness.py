"""A per-node liveness beat, gathered by global rank 0: node loss seen in seconds.

Kubernetes calls a dead machine ``Ready=Unknown`` only after the node-monitor grace period (40 s,
50 s from 1.32), and a stopped host (SIGSTOP, a hung kernel) may never be called anything. This
module lets the job say it sooner, without the supervisor following every node's log:

- one thread per node (in local rank 0) adds 1 to a counter ``wmctl/beat/<group rank>`` in the
  rendezvous store every BEAT_S (torchrun's own c10d TCPStore, reached at MASTER_ADDR /
  MASTER_PORT over a connection of its own: the training's collectives never wait on it);
- a thread in global rank 0 reads every node's counter each BEAT_S in one ``multi_get`` and, on
  its own clock (no clock sync needed), notes when each last moved. A node whose counter has not
  moved for SUSPECT_S is reported on rank 0's stdout as a progress event, repeated every
  REPORT_S while it stays silent, and once more when it beats again. A node whose process ended
  by itself (atexit: it finished, or raised and its exit status tells) is never reported:

      WMCTL-PROGRESS {"event": "node_silent", "group_rank": 1, "host": "node-b", "silent_s": 4.0, ...}
      WMCTL-PROGRESS {"event": "node_beat", "group_rank": 1, "host": "node-b", ...}

The supervisor, which reads rank 0's output anyway, declares the node lost once it has been
silent for ``restart.node_silence_timeout`` (orchestrator/silence.py). The threshold lives in the
spec, not here, so the job needs no setting of its own.

When the dead node is rank 0's own (on Kubernetes also the store's host), the reader is gone with
it. So group rank 1's node keeps a WITNESS: a thread (in its local rank 0) that watches group
rank 0's counter alone and reports it the same way on its own stdout, which the backends follow
as well (one more log stream per attempt, whatever the job's size). A store that stops answering
counts as silence too: the store's host is node 0's machine. ``"witness": 1`` marks its lines:

      WMCTL-PROGRESS {"event": "node_silent", "group_rank": 0, "host": "node-a", "silent_s": 4.0, "witness": 1}

Started by ``runtime.dist.init_from_env``; a job that never imports the runtime keeps the
backends' signals only. Standard library plus torch.distributed's TCPStore.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import threading
import time
from typing import Any, Callable

from orchestrator.runtime.protocol import ENV_NODE_NAME, emit_progress

BEAT_S = 1.0
SUSPECT_S = 3.0          # silent this long: reported (the supervisor's timeout decides what it means)
REPORT_S = 2.0           # a silent node is reported again this often, with how long it has been silent
KEY = "wmctl/beat/{}"
HOST_KEY = "wmctl/host/{}"
DONE_KEY = "wmctl/done/{}"     # set when the node's process exits by itself: its silence is no loss
WITNESS = 1                    # the group rank whose node watches group rank 0's (the reader's own)
STORE_TIMEOUT_S = 5.0          # short: a store host that is gone must not hold this process's exit for long

_started: dict[str, Any] = {}


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def host_name() -> str:
    return os.environ.get(ENV_NODE_NAME) or socket.gethostname()


def start(store: Any = None, *, group_rank: int | None = None, nodes: int | None = None, rank: int | None = None,
          local_rank: int | None = None, emit: Callable[..., Any] = emit_progress) -> list[threading.Thread]:
    """Start this process's part: the beat (local rank 0 of each node) and the reader (global
    rank 0). Needs torchrun's environment (GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR/PORT); does
    nothing in a single-node job or twice in one process."""
    group_rank = _env_int("GROUP_RANK", 0) if group_rank is None else group_rank
    nodes = _env_int("GROUP_WORLD_SIZE", 1) if nodes is None else nodes
    rank = _env_int("RANK", 0) if rank is None else rank
    local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
    if nodes <= 1 or _started or (local_rank != 0 and rank != 0):
        return []
    threads = []
    stop = threading.Event()
    beat_store = None
    try:
        if local_rank == 0:
            beat_store = store if store is not None else _connect()
            beat_store.set(HOST_KEY.format(group_rank), host_name())
            threads.append(threading.Thread(target=_beat, args=(beat_store, group_rank), kwargs={"stop": stop},
                                            daemon=True, name="wmctl-node-beat"))
        if rank == 0:
            read_store = store if store is not None else _connect()
            threads.append(threading.Thread(target=_read, args=(read_store, nodes, emit), kwargs={"stop": stop},
                                            daemon=True, name="wmctl-node-beat-reader"))
        if local_rank == 0 and group_rank == WITNESS:
            connect: Callable[[], Any] = (lambda: store) if store is not None else _connect
            threads.append(threading.Thread(target=_witness, args=(connect, emit), kwargs={"stop": stop},
                                            daemon=True, name="wmctl-node-beat-witness"))
    except (RuntimeError, OSError, KeyError, ValueError) as exc:
        # No store to beat into (a launcher other than torchrun): the backends' signals remain.
        print(f"wmctl: node liveness beat not started ({exc}); node loss is seen by the backend only", flush=True)
        return []
    _started["threads"] = threads
    # At exit, the threads stop before the interpreter finalizes: a daemon thread still inside a
    # store call (C++, the GIL released) when finalization starts is ended by pthread_exit on its
    # way back, an unwind through C++ frames that aborts the process (SIGABRT: a job that
    # finished, failed by its last breath). Then a node that finished (or raised: its exit status
    # tells) is marked done: it stops beating on purpose, while torchrun's exit barrier keeps the
    # others waiting for rank 0's last save.
    atexit.register(_stop, stop, threads, beat_store, group_rank)
    for t in threads:
        t.start()
    return threads


def _stop(stop: threading.Event, threads: list[threading.Thread], beat_store: Any, group_rank: int) -> None:
    stop.set()
    for t in threads:
        t.join(timeout=STORE_TIMEOUT_S + BEAT_S)     # a call in flight ends within the store's timeout
    if beat_store is not None:
        _done(beat_store, group_rank)


def _connect() -> Any:
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))


def _done(store: Any, group_rank: int) -> None:
    try:
        store.set(DONE_KEY.format(group_rank), "1")
    except (RuntimeError, OSError):
        pass


def _beat(store: Any, group_rank: int, *, stop: threading.Event) -> None:
    key = KEY.format(group_rank)
    while not stop.is_set():
        try:
            store.add(key, 1)
        except (RuntimeError, OSError):      # the store's host is gone: nothing to tell anyone
            return
        stop.wait(BEAT_S)


def _read(store: Any, nodes: int, emit: Callable[..., Any], *, stop: threading.Event,
          clock: Callable[[], float] = time.monotonic) -> None:
    keys = [KEY.format(g) for g in range(nodes)]
    try:
        for k in keys:
            store.add(k, 0)                  # every counter exists, so multi_get never waits
    except (RuntimeError, OSError):
        return
    last: dict[int, bytes] = {}
    moved: dict[int, float] = {}
    reported: dict[int, float] = {}
    hosts: dict[int, str] = {}
    while not stop.is_set():
        try:
            values = store.multi_get(keys)
        except (RuntimeError, OSError):
            return
        now = clock()
        for g, v in enumerate(values):
            if last.get(g) != v:
                last[g], moved[g] = v, now
                if g in reported:
                    del reported[g]
                    emit("node_beat", group_rank=g, host=_host(store, g, hosts))
                continue
            silent = now - moved[g]
            if silent >= SUSPECT_S and now - reported.get(g, -1e9) >= REPORT_S and not _finished(store, g):
                reported[g] = now
                emit("node_silent", group_rank=g, host=_host(store, g, hosts), silent_s=round(silent, 1))
        stop.wait(BEAT_S)


def _witness(connect: Callable[[], Any], emit: Callable[..., Any], *, stop: threading.Event,
             clock: Callable[[], float] = time.monotonic) -> None:
    """Group rank 1's watch over group rank 0's node: its counter not moving, or the store not
    answering (its host is that machine, or the store is out of reach from here), for SUSPECT_S
    is reported as ``_read`` reports other nodes, again every REPORT_S, and ``node_beat`` once it
    moves again. A node 0 that finished (its done key) is never reported: the watch ends.

    The store is asked from a thread of its own (``_ask_node0``): a store whose host process is
    frozen (SIGSTOP, a hung machine whose kernel still accepts the connection) never answers a
    call, whatever its timeout (measured: TCPStore.add blocks for good), and this watch must
    still see the time pass."""
    seen: dict[str, Any] = {"value": None, "host": None, "done": False}
    asker = threading.Thread(target=_ask_node0, args=(connect, seen), kwargs={"stop": stop}, daemon=True,
                             name="wmctl-node-beat-witness-ask")
    asker.start()
    last: int | None = None
    moved = clock()
    reported: float | None = None
    while not stop.is_set():
        if seen["done"]:
            return
        value, host = seen["value"], seen["host"]
        now = clock()
        if value is not None and value != last:
            last, moved = value, now
            if reported is not None:
                reported = None
                emit("node_beat", group_rank=0, host=host, witness=WITNESS)
        elif now - moved >= SUSPECT_S and (reported is None or now - reported >= REPORT_S):
            reported = now
            emit("node_silent", group_rank=0, host=host, silent_s=round(now - moved, 1), witness=WITNESS)
        stop.wait(BEAT_S)


def _ask_node0(connect: Callable[[], Any], seen: dict[str, Any], *, stop: threading.Event) -> None:
    """Group rank 0's counter (and host, and done key) into ``seen``, every BEAT_S; ``value`` None
    while the store does not answer. A call that never returns leaves ``seen`` as it was."""
    key, host_key, done_key = KEY.format(0), HOST_KEY.format(0), DONE_KEY.format(0)
    store: Any = None
    while not stop.is_set():
        try:
            if store is None:
                store = connect()        # a reconnect: a store host that was away may answer again
            if store.check([done_key]):
                seen["done"] = True
                return
            seen["value"] = int(store.add(key, 0))
            if seen["host"] is None and store.check([host_key]):
                seen["host"] = store.get(host_key).decode()
        except (RuntimeError, OSError, ValueError, UnicodeDecodeError):
            store, seen["value"] = None, None
        stop.wait(BEAT_S)


def _finished(store: Any, g: int) -> bool:
    try:
        return bool(store.check([DONE_KEY.format(g)]))
    except (RuntimeError, OSError):
        return False


def _host(store: Any, g: int, cache: dict[int, str]) -> str | None:
    if g not in cache:
        try:
            if store.check([HOST_KEY.format(g)]):
                cache[g] = store.get(HOST_KEY.format(g)).decode()
        except (RuntimeError, OSError, UnicodeDecodeError):
            return None
    return cache.get(g)
