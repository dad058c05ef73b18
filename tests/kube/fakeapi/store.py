"""Object store with a global resourceVersion and a bounded watch history.

Every change bumps one global counter (as etcd's revision does) and appends an event to a
history deque. A watch from resourceVersion R is served from the history when R is not older
than the retained window; otherwise it is ``Gone`` (HTTP 410), exactly the case a client must
handle by re-listing. ``compact()`` drops the history at once, as etcd compaction does.
"""

from __future__ import annotations

import builtins
import copy
import datetime as dt
import random
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

Obj = dict[str, Any]
Key = tuple[str, str, str]          # (resource, namespace or "", name)

CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses"}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"   # what the apiserver uses for generateName


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(_NAME_CHARS) for _ in range(n))


class ApiError(Exception):
    """An error the server returns as a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details,
                "code": self.code}


class Gone(ApiError):
    def __init__(self, rv: int, oldest: int):
        super().__init__(410, "Expired",
                         f"too old resource version: {rv} ({oldest})")


@dataclass(frozen=True)
class Change:
    rv: int
    resource: str
    namespace: str
    type: str                 # ADDED, MODIFIED, DELETED
    obj: Obj                  # state after the change (for DELETED: the last state)
    old: Obj | None           # state before (None for ADDED)


class Store:
    def __init__(self, history_limit: int = 10_000):
        self.cond = threading.Condition(threading.RLock())
        self.history_limit = history_limit
        self._rv = 0
        self._objects: dict[Key, Obj] = {}
        self._history: deque[Change] = deque()
        self._oldest_rv = 0      # watches from rv >= this are served from history
        self.closed = False

    # --- helpers -------------------------------------------------------------------
    @property
    def rv(self) -> int:
        return self._rv

    @property
    def oldest_rv(self) -> int:
        return self._oldest_rv

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._oldest_rv = self._history.popleft().rv
        self.cond.notify_all()

    @staticmethod
    def _ns(resource: str, namespace: str | None) -> str:
        return "" if resource in CLUSTER_SCOPED else (namespace or "default")

    # --- CRUD ----------------------------------------------------------------------
    def create(self, resource: str, namespace: str | None, obj: Obj,
               prepare: Callable[[Obj], None] | None = None) -> Obj:
        """Store a new object. ``prepare`` completes it once it has its name and uid, before anyone
        can see it (a registry strategy's PrepareForCreate: what it sets is never seen missing)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        with self.cond:
            ns = self._ns(resource, namespace or meta.get("namespace"))
            name = meta.get("name")
            if not name:
                gen = meta.get("generateName")
                if not gen:
                    raise ApiError(422, "Invalid", f"{resource} is invalid: metadata.name: "
                                   "Required value: name or generateName is required",
                                   {"kind": resource, "causes": [{"field": "metadata.name",
                                                                  "reason": "FieldValueRequired"}]})
                name = gen + random_suffix()
                while (resource, ns, name) in self._objects:
                    name = gen + random_suffix()
            key = (resource, ns, name)
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                               {"name": name, "kind": resource})
            rv = self._bump()
            meta.update(name=name, uid=str(uuid.uuid4()), resourceVersion=str(rv),
                        creationTimestamp=now_rfc3339(), generation=1)
            if ns:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
            if prepare is not None:
                prepare(obj)
            self._objects[key] = obj
            self._record(Change(rv, resource, ns, "ADDED", copy.deepcopy(obj), None))
            return copy.deepcopy(obj)

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        with self.cond:
            obj = self._objects.get((resource, self._ns(resource, namespace), name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found',
                               {"name": name, "kind": resource})
            return copy.deepcopy(obj)

    def exists(self, resource: str, namespace: str | None, name: str) -> bool:
        with self.cond:
            return (resource, self._ns(resource, namespace), name) in self._objects

    def list(self, resource: str, namespace: str | None = None,
             match: Callable[..., bool] | None = None) -> tuple[list[Obj], int]:
        """namespace None = all namespaces; ``match(obj)`` filters. (``...`` here and in update():
        callers bind loop variables through lambda defaults, which mypy infers only against it.)"""
        with self.cond:
            items = [copy.deepcopy(o) for (r, ns, _), o in sorted(self._objects.items())
                     if r == resource and (namespace is None or resource in CLUSTER_SCOPED
                                           or ns == namespace)
                     and (match is None or match(o))]
            return items, self._rv

    def update(self, resource: str, namespace: str | None, name: str,
               mutate: Callable[..., Any], expect_rv: str | None = None) -> Obj:
        """Apply ``mutate`` to a copy; bump the resourceVersion only if something changed."""
        with self.cond:
            key = (resource, self._ns(resource, namespace), name)
            cur = self._objects.get(key)
            if cur is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found',
                               {"name": name, "kind": resource})
            if expect_rv and expect_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {resource} "{name}": the '
                               "object has been modified; please apply your changes to the "
                               "latest version and try again", {"name": name, "kind": resource})
            new = copy.deepcopy(cur)
            mutate(new)
            # identity fields are immutable
            for k in ("name", "uid", "creationTimestamp", "namespace"):
                if k in cur["metadata"]:
                    new["metadata"][k] = cur["metadata"][k]
            new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            if new == cur:
                return copy.deepcopy(cur)
            rv = self._bump()
            new["metadata"]["resourceVersion"] = str(rv)
            self._objects[key] = new
            self._record(Change(rv, resource, key[1], "MODIFIED", copy.deepcopy(new),
                                copy.deepcopy(cur)))
            return copy.deepcopy(new)

    def remove(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Remove the object now (the final step of any deletion)."""
        with self.cond:
            key = (resource, self._ns(resource, namespace), name)
            cur = self._objects.pop(key, None)
            if cur is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found',
                               {"name": name, "kind": resource})
            rv = self._bump()
            last = copy.deepcopy(cur)
            last["metadata"]["resourceVersion"] = str(rv)
            self._record(Change(rv, resource, key[1], "DELETED", last, copy.deepcopy(cur)))
            return copy.deepcopy(last)

    # --- watch ---------------------------------------------------------------------
    def changes_since(self, rv: int, resource: str) -> builtins.list[Change]:
        """Changes of ``resource`` after ``rv``; Gone if that is before the retained window."""
        with self.cond:
            if rv < self._oldest_rv:
                raise Gone(rv, self._oldest_rv)
            return [c for c in self._history if c.rv > rv and c.resource == resource]

    def compact(self) -> int:
        """Forget all history: every watch from an older resourceVersion gets 410."""
        with self.cond:
            self._history.clear()
            self._oldest_rv = self._rv
            self.cond.notify_all()
            return self._oldest_rv

    def wait(self, rv: int, timeout: float) -> None:
        """Block until the global resourceVersion passes ``rv`` or ``timeout`` elapses."""
        with self.cond:
            if self._rv <= rv and not self.closed:
                self.cond.wait(timeout)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
