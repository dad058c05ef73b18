"""`wmctl logs`: one node's or every node's output, of one attempt or, following, of every
attempt the run makes until it ends; or what a detached watcher printed (``watcher_log``).

What each backend can narrow (``--tail``, ``--since``, ``--timestamps``) is its ``log_options``,
checked once by ``backends.check_logs`` before any engine is asked. What is the same everywhere
lives here: the node prefix of ``--all-nodes``, hiding WMCTL-PROGRESS lines (``--raw`` keeps
them), and following into the next attempt while a watcher resubmits the run.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

from . import backends
from .backends.base import Backend, LogQuery
from .errors import BackendError, RunNotFound
from .layout import attempt_name
from .reconcile import reconcile
from .runs import engine_of, ref_of
from .runtime.protocol import PROGRESS_PREFIX
from .state import RunRecord, RunStore, open_store

POLL_S = 0.3    # how often a follower looks for the next attempt (a run folder read)


def node_prefix(node: int) -> str:
    """What leads each line of ``--all-nodes``."""
    return f"[node {node}] "


def attempt_banner(run: str, attempt: int) -> str:
    """The line a follower prints when the run moves to its next attempt."""
    return f"==> {attempt_name(run, attempt)} (attempt {attempt}) <=="


def logs(run: str, *, node: int | None = None, attempt: int | None = None, follow: bool = False,
         all_nodes: bool = False, tail: int | None = None, since: float | None = None, timestamps: bool = False,
         raw: bool = False, shown: Callable[[int, int, str], None] | None = None) -> Iterator[str]:
    """The lines ``wmctl logs`` prints. ``since``: a Unix time. With ``follow`` and no
    ``attempt``, the newest attempt is followed and then each one a watcher starts after it.
    ``node`` None: the node that holds global rank 0 (what only rank 0 prints is there), else
    node 0; ``shown(attempt, node, why)`` is told which node each attempt shows."""
    store = open_store(run)
    record = store.load()
    if not record.attempts:
        raise RunNotFound(f"run {run} has no attempts yet, so no logs", hint=f"see `wmctl status {run}`")
    query = LogQuery(tail=tail, since=since, timestamps=timestamps)
    backends.check_logs(backends.backend_class(record.backend), query)
    numbers = [a.attempt for a in record.attempts]
    if attempt is not None and attempt not in numbers:
        raise RunNotFound(f"run {run} has no attempt {attempt}",
                          hint=f"its attempts are {', '.join(map(str, numbers))} (see `wmctl status {run}`)")
    count = _nodes(record)
    if not all_nodes and node is not None and count is not None and not 0 <= node < count:
        named = attempt_name(run, numbers[-1] if attempt is None else attempt)
        raise RunNotFound(f"{named} has no node {node}", hint=(f"its nodes are 0-{count - 1}" if count > 1 else
                                                             "its only node is 0") + "; --all-nodes shows them all")
    engine = engine_of(record)
    n = numbers[-1] if attempt is None else attempt
    state = _Run(store, engine)
    try:
        while True:
            stop = state.attempt_over(n) if follow else None
            if all_nodes:
                nodes = list(range(count or 1))
            elif node is None:
                chosen, why = rank0_node(engine, ref_of(record, n), count or 1)
                nodes = [chosen]
                if shown is not None:
                    shown(n, chosen, why)
            else:
                nodes = [node]
            lines = _attempt_lines(engine, record, n, nodes, follow=follow,
                                   query=LogQuery(tail, since, timestamps, stop=stop), prefixed=all_nodes, raw=raw)
            yield from lines
            if not follow or attempt is not None:
                return
            n_next = state.next_attempt(n)
            if n_next is None:
                return
            n = n_next
            yield attempt_banner(run, n)
    finally:
        engine.close()


RANK0_LINE = re.compile(r"^wmctl-bind: local_rank=\d+ .* rank=0$")
RANK0_SCAN = 400          # lines read of each node's log at most: the launcher's line comes first


def rank0_node(engine: Backend[Any], ref: Any, count: int) -> tuple[int, str]:
    """Which node holds global rank 0 (the rendezvous decides, not the node index: on local it
    was node 1 in about half the runs), from the launcher's line in each node's log; node 0 when
    no node says (an attempt not started yet, a launcher older than the rank on its line)."""
    for node in range(count):
        lines: Iterator[str] | None = None
        try:
            lines = engine.logs(ref, node=node, follow=False, query=LogQuery())
            for i, line in enumerate(lines):
                if RANK0_LINE.match(line.rstrip()):
                    return node, "global rank 0"
                if i >= RANK0_SCAN:
                    break
        except (RunNotFound, BackendError):
            continue
        finally:
            close = getattr(lines, "close", None)   # a stream left before its end is closed
            if close is not None:
                close()
    return 0, "no node's log names global rank 0 yet"


def watcher_log(run: str) -> Iterator[str]:
    """What a detached watcher of ``run`` printed."""
    store = open_store(run)
    store.load()
    path = store.watcher_log()
    if not path.exists():
        raise RunNotFound(f"run {run} has no watcher log ({path})",
                          hint="only a watcher started by `wmctl submit --detach --auto-resume` writes one; "
                               "a foreground watcher prints to its terminal")
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            yield line.rstrip("\n")


def _nodes(record: RunRecord) -> int | None:
    nodes = (record.spec or {}).get("nodes")
    return nodes if isinstance(nodes, int) and nodes > 0 else None


class _Run:
    """The run as its record says, read again at most every ``every_s``. A run nobody watches is
    reconciled with its backend in memory (``reconcile.reconcile``, never saved, no lease taken,
    so a watcher starting meanwhile is never refused): a local node killed with its keeper writes
    no exit file, and no watcher would record that its attempt ended."""

    def __init__(self, store: RunStore, engine: Backend[Any], every_s: float = 1.0):
        self.store, self.engine, self.every_s = store, engine, every_s
        self._at = float("-inf")
        self._record: RunRecord | None = None
        # Each followed node asks from its own thread. Without the lock a second thread, asking
        # while the first one loads, read the cache before the first load filled it: None, "the
        # run is deleted", and that node's whole output was skipped.
        self._lock = threading.Lock()

    def record(self) -> RunRecord | None:
        """None once the run is deleted."""
        with self._lock:
            if time.monotonic() - self._at >= self.every_s:
                try:
                    rec = self.store.load()
                except RunNotFound:
                    self._record, self._at = None, time.monotonic()
                    return None
                if rec.status == "running" and self.store.lease() is None:
                    reconcile(rec, self.engine, wait_s=0.0)
                self._record, self._at = rec, time.monotonic()
            return self._record

    def attempt_over(self, n: int) -> Callable[[], bool]:
        """Has attempt ``n`` ended (an outcome, a newer attempt, an ended or deleted run)?"""
        def over() -> bool:
            rec = self.record()
            if rec is None:
                return True
            mine = [a for a in rec.attempts if a.attempt == n]
            return rec.status != "running" or not mine or mine[0].outcome is not None or rec.attempts[-1].attempt > n
        return over

    def next_attempt(self, n: int, sleep: Callable[[float], None] = time.sleep) -> int | None:
        """Wait for the attempt after ``n`` (a watcher in backoff makes it later); None once the
        run ended without one."""
        while True:
            rec = self.record()
            if rec is None:
                return None
            later = [a.attempt for a in rec.attempts if a.attempt > n]
            if later:
                return min(later)
            if rec.status != "running":
                return None
            sleep(POLL_S)


def _attempt_lines(engine: Backend[Any], record: RunRecord, n: int, nodes: list[int], *, follow: bool,
                   query: LogQuery, prefixed: bool, raw: bool) -> Iterator[str]:
    ref = ref_of(record, n)

    def one(node: int) -> Iterator[str]:
        prefix = node_prefix(node) if prefixed else ""
        for line in _node_lines(engine, ref, node, follow=follow, query=query, raw=raw):
            yield prefix + line

    if not follow or len(nodes) == 1:
        for node in nodes:
            yield from one(node)
        return
    # following several nodes: each read on its own thread, lines as they come
    lines: queue.Queue[tuple[str, Any]] = queue.Queue()

    def pump(node: int) -> None:
        try:
            for line in one(node):
                lines.put(("line", line))
        except (RunNotFound, BackendError) as exc:
            lines.put(("error", exc))
        finally:
            lines.put(("done", node))

    for node in nodes:
        threading.Thread(target=pump, args=(node,), daemon=True, name=f"wmctl-logs-{node}").start()
    running = len(nodes)
    while running:
        kind, value = lines.get()
        if kind == "line":
            yield value
        elif kind == "done":
            running -= 1
        else:
            raise value


def _node_lines(engine: Backend[Any], ref: Any, node: int, *, follow: bool, query: LogQuery,
                raw: bool) -> Iterator[str]:
    """One node's lines, WMCTL-PROGRESS lines hidden unless ``raw`` (``--tail N`` then counts the
    lines shown). Following an attempt whose node has not started yet (no log, no pod) waits for
    it while the attempt lasts."""
    while True:
        started = False
        try:
            asked = query if raw or query.tail is None else replace(query, tail=_raw_tail(engine, ref, node, query))
            for line in engine.logs(ref, node=node, follow=follow, query=asked):
                started = True
                kept = line if raw else shown_part(line)
                if kept is not None:
                    yield kept
            return
        except (RunNotFound, BackendError):
            if started or not follow or query.stop is None:
                raise
            if query.stop():
                return      # the attempt ended before this node wrote a line: on to the next
        time.sleep(POLL_S)


def shown_part(line: str) -> str | None:
    """What of ``line`` a reader sees without ``--raw``: None for a progress line. A progress line
    written after output that had no newline yet (a 5 MB line, a tqdm bar's ``\\r`` updates) ends
    the same line in the log: the job's words before it are shown, only the progress part hidden."""
    at = line.find(PROGRESS_PREFIX)
    if at < 0:
        return line
    before = line[:at]
    return before if before.strip() else None


def _raw_tail(engine: Backend[Any], ref: Any, node: int, query: LogQuery) -> int:
    """How many of the node's last lines hold its last ``query.tail`` lines that are not progress
    lines: asked for 4x more each time until they are there or the log has no more."""
    want = query.tail or 0
    k = max(want, 1)
    while True:
        lines = list(engine.logs(ref, node=node, follow=False, query=replace(query, tail=k, stop=None)))
        shown = [i for i, line in enumerate(lines) if shown_part(line) is not None]
        if len(shown) >= want or len(lines) < k:
            return len(lines) - shown[-want] if want and len(shown) >= want else len(lines) if want else 0
        k *= 4
