"""Pod logs: the followers that turn index 0's log (and the witness's, index 1) into events, the
lines ``wmctl logs`` reads, and the tail each node's log leaves in the run folder before its pod
goes.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import deque
from typing import Any, Iterator

from ...adaptors import kubernetes as sdk
from ...errors import RunNotFound
from ...runtime.keeper import KEEPER_EXIT
from ...runtime.protocol import parse_progress
from ...state import open_store
from .. import base as b
from ..base import AttemptRef
from ..logcursor import LogCursor, split_timestamp
from .classify import newest_per_index, pod_index, since_seconds
from .client import Backoff, close_stream, is_transient, request_timeout
from .cluster import Cluster, Obj, api_error, refused
from .record import Attempt
from .rounds import TAIL_LINE_CHARS, TAIL_LINES, keeper_said

# Teardown reads each pod's log tail before the pod goes; a kubelet slower than this is skipped.
ARCHIVE_TIMEOUT_S = 5.0
# A followed log that sends nothing for this long is re-opened from its cursor: a quiet log
# costs one reconnect, a half-open one no longer blocks progress detection for good.
LOG_READ_TIMEOUT_S = 60.0
# Pod index 0 is global rank 0 and the c10d store's host: when its machine dies no line of its
# log arrives. Index 1 (base.WITNESS_NODE) keeps the runtime's witness, whose log is followed too,
# for its reports about group rank 0 only (base.witness_progress); every other line there is
# rank 0's to tell, and a second copy would only duplicate or mask it.
WITNESS_INDEX = b.WITNESS_NODE
# How long poll holds back the end of index 0's pod while its follower has not yet read the
# terminated container's log to its end (hold_end). The kubelet serves a finished container's
# log at once; a follower that cannot read it (pods/log refused, the kubelet away) costs this
# much at an attempt's end, after which the end is reported and the lines not read stay in the
# log tail kept in the run folder (`wmctl logs`).
LOG_DRAIN_TIMEOUT_S = 10.0
# What an ended pod's end is told by: held back with it (the exit may only be judged after the
# job's last words, e.g. its `preempted` line before torchrun's exit 1 on SIGTERM).
_END_KINDS = (b.NODE_EXITED, b.OOM_KILLED, b.EVICTED)


class PodLogs:
    def __init__(self, cluster: Cluster, read_timeout: float = LOG_READ_TIMEOUT_S,
                 drain_timeout: float = LOG_DRAIN_TIMEOUT_S):
        self.cluster = cluster
        self.read_timeout = read_timeout
        self.drain_timeout = drain_timeout

    # --- an attempt's end waits for rank 0's last lines -----------------------------------
    def hold_end(self, st: Attempt, events: list[b.Event],
                 nodes: list[b.NodeStatus]) -> tuple[list[b.Event], list[b.NodeStatus], bool]:
        """Under ``st.lock``: ``poll``'s events and node states, with index 0's end held back
        while its follower has not read the terminated container's log to its end (at most
        ``drain_timeout`` per pod). The pod watch and the log stream are separate: a short
        attempt's pods can all be seen ended before rank 0's last lines (`resume`, `checkpoint`,
        `preempted`, `exit`) are read, and an attempt judged ended stops its followers. While
        held, index 0 reads as running and its end's events wait in ``st.held``; they are
        released after the lines read meanwhile. The flag says whether index 0's end is held."""
        pod = newest_per_index(list(st.pods.values())).get(0)
        uid = pod["metadata"]["uid"] if pod is not None else ""
        follower = st.log_threads.get(0)
        ended = pod is not None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        hold = (pod is not None and ended and uid not in st.logs_read and uid not in st.lost
                and container_started(pod) and not st.cancelled and not st.stop.is_set()
                and follower is not None and follower.is_alive())
        if hold:
            since = st.held_since.setdefault(uid, time.monotonic())
            hold = time.monotonic() - since < self.drain_timeout
        if not hold:
            events, st.held = events + st.held, []
            return events, nodes, False
        st.held += [ev for ev in events if ev.node == 0 and ev.kind in _END_KINDS]
        events = [ev for ev in events if not (ev.node == 0 and ev.kind in _END_KINDS)]
        nodes = [b.NodeStatus(0, b.RUNNING, n.host) if n.node == 0 else n for n in nodes]
        return events, nodes, True

    # --- followers: progress and the output heartbeat ------------------------------------
    def start_followers(self, st: Attempt) -> None:
        """Follow index 0's log, and index 1's (the witness, base.witness_progress) once the attempt is
        known to have two nodes or more: at once for an attempt this object submitted, else when
        the Job tells its completions."""
        with st.lock:
            wanted = [0, WITNESS_INDEX] if st.completions > WITNESS_INDEX else [0]
            if st.spares:
                # rank 0 is wherever the round's rendezvous put it (spares.py): every slot is followed
                wanted = list(range(st.completions))
            for index in wanted:
                if index in st.log_threads or st.stop.is_set():
                    continue
                t = threading.Thread(target=self.follow, args=(st, index), daemon=True,
                                     name="wmctl-rank0-log" if index == 0 else f"wmctl-witness{index}-log")
                st.log_threads[index] = t
                t.start()

    def follow(self, st: Attempt, index: int) -> None:
        """Follow pod ``index``'s log for WMCTL-PROGRESS lines (index 0: all of them; the
        witness: read); resume after drops without repeats or gaps, by timestamp
        (classify.LogCursor), across kubelet log rotations."""
        ApiException = api_error()
        core = self.cluster.core()
        ns = self.cluster.ns(st.ref)
        cursors: dict[str, LogCursor] = {}
        tails: dict[str, deque[str]] = {}     # with spares: each pod's recent output (rounds.keeper_exit)
        output_at: dict[int, float] = {}
        delays = Backoff(0.05, 2.0)      # reconnects: jittered, growing, at least a 429's Retry-After
        while not st.stop.is_set():
            with st.lock:
                cands = [p for p in st.pods.values() if pod_index(p) == index
                         and p["metadata"]["uid"] not in st.logs_read
                         and container_started(p)]
                pod = max(cands, key=lambda p: p["metadata"].get("creationTimestamp") or "",
                          default=None)
            if pod is None:
                st.stop.wait(0.05)
                continue
            uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
            cursor = cursors.setdefault(uid, LogCursor())
            tail = tails.setdefault(uid, deque(maxlen=TAIL_LINES))
            kwargs: dict[str, Any] = {"follow": True, "timestamps": True, "_preload_content": False,
                                      "_request_timeout": request_timeout(self.read_timeout)}
            since = since_seconds(cursor, time.time())
            if since is not None:
                kwargs["since_seconds"] = since
            if st.container:
                kwargs["container"] = st.container
            try:
                resp = core.read_namespaced_pod_log(name, ns, **kwargs)
                with st.lock:
                    st.log_resps[index] = resp
                delays.reset()
                try:
                    if st.stop.is_set():
                        # close() ran while the request was on its way: it had no response to
                        # shut, and a quiet log would block this read for as long as the pod runs
                        break
                    self.read(st, index, sdk.iter_resp_lines(resp), pod["spec"].get("nodeName"), cursor,
                              output_at, tail)
                finally:
                    with st.lock:
                        st.log_resps.pop(index, None)
                    close_stream(resp)         # it may end mid-stream: on stop, or a bad line
                # a clean end: the container terminated or the pod went away
                with st.lock:
                    cur = st.pods.get(uid)
                if cur is None or container_terminated(cur):
                    with st.lock:
                        st.logs_read.add(uid)      # read to its end: poll may now report its pod's end
                else:
                    st.stop.wait(0.05)
            except ApiException as exc:
                with st.lock:
                    cur = st.pods.get(uid)
                    if sdk.api_status(exc) == 404 or (sdk.api_status(exc) == 403 and (
                            cur is None or container_terminated(cur))):
                        # the pod is gone, and its log with it; or it ended and this user may not
                        # read pods/log: nothing more will come, nothing holds its end (hold_end)
                        st.logs_read.add(uid)
                st.stop.wait(0.05 if sdk.api_status(exc) in (400, 404) else
                             delays.delay(exc) if is_transient(exc) else 0.5)
            except sdk.connection_errors():
                st.stop.wait(delays.delay())   # dropped or timed-out stream: reconnect from the cursor
            except ValueError:
                st.stop.wait(delays.delay())

    @staticmethod
    def read(st: Attempt, index: int, lines: Iterator[str], host: str | None, cursor: LogCursor,
             output_at: dict[int, float], tail: deque[str] | None = None) -> None:
        """Turn the new lines of pod ``index``'s log stream into events (base.line_event): index 0's
        into PROGRESS (or, without progress lines, OUTPUT heartbeat) events; the witness's only
        into the PROGRESS events it exists for (base.witness_progress). With spares every slot's
        recent output is kept in ``tail`` and its keeper's ``keeper_exit`` line (its torchrun
        failed) is judged from it (rounds.keeper_exit): the job's own error is that slot's
        NODE_EXITED at once, anything else waits for the keeper's hold."""
        for raw in lines:
            # The kubelet splits a line at 16 KiB already; a line is cut here too (the cursor keeps
            # the lines of its window), so what the watcher holds stays bounded on any runtime.
            stamp, line = split_timestamp(b.cut_line(raw))
            if not cursor.fresh(stamp, line):
                continue            # read before a reconnect
            if st.spares and tail is not None:
                payload = parse_progress(line)
                if payload is not None and payload.get("event") == KEEPER_EXIT:
                    with st.lock:
                        keeper_said(st, payload, list(tail), index, host)
                    tail.clear()     # what follows is the next round's
                    continue
                if payload is None:
                    tail.append(line[:TAIL_LINE_CHARS])
            ev = b.line_event(line, index, host, output_at, witness=index != 0 and not st.spares,
                              stamp=stamp / 1e9 if stamp is not None else None)
            if ev is not None:
                with st.lock:
                    if not st.cancelled:
                        st.events.append(ev)
            if st.stop.is_set():
                break

    @staticmethod
    def stop(st: Attempt, join: bool) -> None:
        """Stop the attempt's watches and unblock its log followers."""
        st.stop.set()
        for w in st.watchers:
            w.stop(join=join)
        with st.lock:
            resps = list(st.log_resps.values())
        for resp in resps:
            shutdown_resp(resp)

    # --- wmctl logs ---------------------------------------------------------------------------
    def pod_for(self, ref: AttemptRef, node: int) -> Obj:
        pods = [p for p in self.cluster.attempt_pods(ref) if pod_index(p) == node]
        if not pods:
            raise RunNotFound(f"no pod for node {node} of {ref.attempt_name} in namespace {self.cluster.ns(ref)}",
                              hint="check the node index (0-based) and the attempt (wmctl status)")
        return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def lines(self, ref: AttemptRef, node: int, follow: bool, query: b.LogQuery,
              container: str | None) -> Iterator[str]:
        """One node's log as ``wmctl logs`` reads it, while its pod is there."""
        pod = self.pod_for(ref, node)
        kwargs: dict[str, Any] = {"follow": follow, "_preload_content": False}
        if not follow:
            kwargs["_request_timeout"] = request_timeout()
        # PodLogOptions (k8s.io/api/core/v1 types.go): tailLines, sinceSeconds (>= 1), timestamps
        if query.tail is not None:
            kwargs["tail_lines"] = query.tail
        if query.since is not None:
            kwargs["since_seconds"] = max(1, math.ceil(time.time() - query.since))
        if query.timestamps:
            kwargs["timestamps"] = True
        kwargs["container"] = container or pod["spec"]["containers"][0]["name"]
        name = pod["metadata"]["name"]
        try:
            resp = self.cluster.core().read_namespaced_pod_log(name, pod["metadata"]["namespace"], **kwargs)
        except api_error() as exc:
            raise refused(exc, f"read logs of node {node} ({name})") from None
        try:
            yield from sdk.iter_resp_lines(resp)
        finally:
            close_stream(resp)      # a caller that stops reading leaves the stream mid-way

    # --- the tail kept before a teardown ----------------------------------------------------
    def archive(self, ref: AttemptRef, pods: list[Obj], container: str | None) -> None:
        """Copy the log tail of each node's newest started pod into the run folder, in parallel,
        bounded by ARCHIVE_TIMEOUT_S. Best effort: a pod whose log cannot be read is skipped."""
        newest = newest_per_index([p for p in pods if container_started(p)])
        readers = [threading.Thread(target=self._archive_one, args=(ref, i, p, container), daemon=True,
                                    name=f"wmctl-archive-{p['metadata']['name']}")
                   for i, p in newest.items()]
        for t in readers:
            t.start()
        deadline = time.monotonic() + ARCHIVE_TIMEOUT_S
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))

    def _archive_one(self, ref: AttemptRef, node: int, pod: Obj, container: str | None) -> None:
        try:
            resp = self.cluster.core().read_namespaced_pod_log(
                pod["metadata"]["name"], pod["metadata"]["namespace"],
                container=container or pod["spec"]["containers"][0]["name"],
                tail_lines=b.ARCHIVE_TAIL_LINES, _preload_content=False,
                _request_timeout=ARCHIVE_TIMEOUT_S)
            try:
                data = resp.read()
            finally:
                resp.release_conn()
        except api_error():
            return              # the pod went first (404) or its container never started (400)
        except sdk.connection_errors():
            return              # the kubelet did not answer in time: nothing to keep
        open_store(ref.run).archive_log(ref.attempt, node, data)


def shutdown_resp(resp: Any) -> None:
    """Unblock a thread reading a streaming response (as kubernetes.watch.Watch.stop does)."""
    if resp is None:
        return
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def container_started(pod: Obj) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


def container_terminated(pod: Obj) -> bool:
    css = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(css) and all("terminated" in (cs.get("state") or {}) for cs in css)
