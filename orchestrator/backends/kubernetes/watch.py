"""List + watch one kind of object, resuming from the last resourceVersion.

The informer pattern, minus caching policy: list (sync), then watch from the list's
resourceVersion; on a dropped stream reconnect from the last resourceVersion seen; on
410 Gone (history compacted) list again. ``on_sync`` gets the complete current set after each
list so the consumer can diff against its cache: nothing is lost across a relist, and a fact-
keyed consumer emits nothing twice.

Every list and watch has a client-side read timeout (client.stream_timeout): a stream that goes
half-open (stops sending without closing) times out and is re-opened from the last
resourceVersion. Reconnects wait a jittered, growing delay (client.Backoff), at least a 429's
Retry-After, reset by the next stream that delivers.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from ...adaptors import kubernetes as sdk
from ...adaptors.kubernetes import api_status, connection_errors
from .client import Backoff, is_transient, request_timeout, stream_timeout

Obj = dict[str, Any]

# How long a forbidden list/watch waits before asking again (permissions may be granted later).
FORBIDDEN_RETRY_S = 30.0


class ResourceWatcher:
    def __init__(self, list_fn: Callable[..., Any], kwargs: dict[str, Any],
                 on_sync: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None], *, name: str,
                 watch_timeout: int = 30, retry_delay: float = 0.05,
                 on_forbidden: Callable[[BaseException], None] | None = None,
                 page_size: int | None = None, trim: Callable[[Obj], Obj] | None = None):
        self.list_fn, self.kwargs = list_fn, dict(kwargs)
        # page_size: list in chunks of this many (limit/continue); a continue token that expired
        # (410) lists again from the start. trim: what of each object is kept (lists and events).
        self.page_size, self.trim = page_size, trim
        self.on_sync, self.on_event = on_sync, on_event
        # told when the list or watch is forbidden (403: RBAC grants no list/watch here)
        self.on_forbidden = on_forbidden
        self.name, self.watch_timeout, self.retry_delay = name, watch_timeout, retry_delay
        self.resource_version: str | None = None
        self.relists = 0          # lists after the first (410 Gone)
        self.reconnects = 0       # watch streams re-opened after a drop or an error
        self.last_error: BaseException | None = None
        self.backoff = Backoff(retry_delay, max(retry_delay, 2.0))
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"wmctl-watch-{name}", daemon=True)

    def start(self) -> "ResourceWatcher":
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        self._interrupt()
        if not join or threading.current_thread() is self._thread:
            return
        # Watch.stream() clears its stop flag when it starts and only has a socket to shut once
        # the request is sent: a stop that lands in between is lost, and the stream would run
        # out its whole timeout. Interrupting again until the thread ends closes that window.
        deadline = time.monotonic() + self.watch_timeout + 5
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(timeout=0.1)
            self._interrupt()

    def _interrupt(self) -> None:
        w = self._watch
        if w is not None:
            w.stop()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _list(self) -> None:
        items: list[Obj] = []
        rv, token = None, None
        while True:
            kwargs = dict(self.kwargs)
            if self.page_size:
                kwargs["limit"] = self.page_size
            if token:
                kwargs["_continue"] = token
            resp = self.list_fn(**kwargs, _preload_content=False, _request_timeout=request_timeout())
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            page = body.get("items") or []
            items.extend(map(self.trim, page) if self.trim else page)
            rv = rv or body["metadata"]["resourceVersion"]     # every page is of the first's revision
            token = body["metadata"].get("continue")
            if not token:
                break
        self.resource_version = rv
        self.on_sync(items)
        self.synced.set()

    def _run(self) -> None:
        ApiException = sdk.api_exception()
        first = True
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    if not first:
                        self.relists += 1
                    first = False
                    self._list()
                w = self._watch = sdk.watch()
                for ev in w.stream(self.list_fn, **self.kwargs,
                                   resource_version=self.resource_version,
                                   timeout_seconds=self.watch_timeout,
                                   _request_timeout=stream_timeout(self.watch_timeout),
                                   allow_watch_bookmarks=True):
                    self.backoff.reset()          # the stream delivers: the next drop starts short
                    obj = ev["raw_object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if ev["type"] != "BOOKMARK":
                        self.on_event(ev["type"], self.trim(obj) if self.trim else obj)
                    if rv:
                        self.resource_version = rv
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                self.last_error = exc
                if api_status(exc) == 410:
                    self.resource_version = None      # too old: list again
                    continue
                self.reconnects += 1
                if api_status(exc) == 403 and self.on_forbidden is not None:
                    self.on_forbidden(exc)
                # transient (429 with its Retry-After, 5xx): back off with jitter; anything else
                # (404): back off harder; 403 (RBAC grants no list/watch: Nodes for a
                # namespace-only user) rarely changes, so ask rarely
                self._stop.wait(self.backoff.delay(exc) if is_transient(exc) else
                                FORBIDDEN_RETRY_S if api_status(exc) == 403 else 1.0)
            except connection_errors() as exc:   # dropped, refused, or timed out (half-open)
                self.last_error = exc
                self.reconnects += 1
                self._stop.wait(self.backoff.delay())
            except ValueError as exc:      # a garbled line from a cut stream
                self.last_error = exc
                self.reconnects += 1
                self._stop.wait(self.backoff.delay())
            finally:
                self._watch = None
