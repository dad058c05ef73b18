"""Watch the Nodes an attempt's pods run on, and no others.

A pod that gets a node adds that node to the scope. Up to PER_NAME_MAX nodes, each is watched
on its own with ``fieldSelector=metadata.name=<node>``, as a kubelet watches its own Node: the
API server's watch cache indexes Nodes by name (pkg/registry/core/node/storage/storage.go
TriggerFunc, used by staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go), so each
stream costs the server one lookup per change, and this process hears nothing of the rest of
the cluster. Above PER_NAME_MAX one stream per node would cost a thread and two requests a
minute per node; there one watch of every Node runs from a list fetched in pages (limit /
continue, as client-go's pager does, PAGE_SIZE at a time), and each Node is kept trimmed to
what the classifiers read (Ready and other conditions, allocatable, taints, labels).

``lookup(name)`` says whether a node's state is known yet (a node known to be absent is a
deleted node) and returns it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

from .watch import ResourceWatcher

Obj = dict[str, Any]

PER_NAME_MAX = 16
PAGE_SIZE = 500


def trim_node(node: Obj) -> Obj:
    """The parts of a Node that wmctl reads; the rest (images, volumes, nodeInfo) is dropped so a
    cache of thousands of Nodes stays small."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels", "deletionTimestamp")
                         if k in meta},
            "spec": {k: v for k, v in (node.get("spec") or {}).items() if k in ("taints", "unschedulable")},
            "status": {k: status[k] for k in ("conditions", "allocatable", "capacity") if k in status}}


class NodeWatch:
    name = "nodes"

    def __init__(self, list_node: Callable[..., Any], on_change: Callable[[set[str]], None], *,
                 watch_timeout: int = 30, on_forbidden: Callable[[BaseException], None] | None = None):
        self._list_node, self._on_change = list_node, on_change
        self._watch_timeout, self._on_forbidden = watch_timeout, on_forbidden
        self._lock = threading.RLock()
        self.scope: set[str] = set()
        self._nodes: dict[str, Obj] = {}
        self._known: set[str] = set()          # names whose state (present or absent) is known
        self._wide_synced = False
        self._per_name: dict[str, ResourceWatcher] = {}
        self._retired: list[ResourceWatcher] = []
        self._wide: ResourceWatcher | None = None
        self._stopped = False

    # --- what the engine asks -------------------------------------------------------------
    def add(self, names: Iterable[str]) -> None:
        """Watch these nodes too (the nodes of newly scheduled pods)."""
        start: list[ResourceWatcher] = []
        with self._lock:
            new = {n for n in names if n} - self.scope
            if not new or self._stopped:
                return
            self.scope |= new
            if self._wide is not None:
                pass                        # the wide watch sees every node already
            elif len(self.scope) > PER_NAME_MAX:
                self._retired = list(self._per_name.values())
                self._per_name.clear()
                self._wide = self._watcher({}, None, page_size=PAGE_SIZE)
                start.append(self._wide)
            else:
                for n in sorted(new):
                    w = self._per_name[n] = self._watcher({"field_selector": f"metadata.name={n}"}, n)
                    start.append(w)
            retired, self._retired = self._retired, []
        for w in retired:
            w.stop(join=False)
        for w in start:
            w.start()

    def lookup(self, name: str) -> tuple[bool, Obj | None]:
        with self._lock:
            return (self._wide_synced or name in self._known), self._nodes.get(name)

    def nodes(self) -> list[Obj]:
        """The cached Nodes of this attempt's pods (the scope), as last seen."""
        with self._lock:
            return [self._nodes[n] for n in sorted(self.scope) if n in self._nodes]

    @property
    def wide(self) -> bool:
        with self._lock:
            return self._wide is not None

    def cached(self) -> int:
        with self._lock:
            return len(self._nodes)

    # --- the watcher interface the engine's bookkeeping expects ------------------------------
    def _all(self) -> list[ResourceWatcher]:
        with self._lock:
            return [*self._per_name.values(), *([self._wide] if self._wide else [])]

    @property
    def relists(self) -> int:
        return sum(w.relists for w in self._all())

    @property
    def reconnects(self) -> int:
        return sum(w.reconnects for w in self._all())

    @property
    def resource_version(self) -> str | None:
        """The oldest resourceVersion its streams would resume from (None: none has listed yet)."""
        rvs = [w.resource_version for w in self._all()]
        if not rvs or any(rv is None for rv in rvs):
            return None
        return min(rvs, key=lambda rv: int(rv or 0))

    def start(self) -> "NodeWatch":
        return self

    def stop(self, join: bool = True) -> None:
        with self._lock:
            self._stopped = True
        for w in self._all():
            w.stop(join=join)

    # --- callbacks from the watchers ----------------------------------------------------------
    def _watcher(self, kwargs: dict[str, Any], name: str | None, page_size: int | None = None) -> ResourceWatcher:
        label = f"node-{name}" if name else "nodes"
        return ResourceWatcher(self._list_node, kwargs,
                               lambda items: self._sync(name, items),
                               lambda t, o: self._event(t, o), name=label,
                               watch_timeout=self._watch_timeout, on_forbidden=self._on_forbidden,
                               page_size=page_size, trim=trim_node)

    def _sync(self, name: str | None, items: list[Obj]) -> None:
        with self._lock:
            if name is None:                       # the wide watch: every node there is
                if self._wide is None:
                    return
                self._nodes = {n["metadata"]["name"]: n for n in items}
                self._wide_synced = True
                changed = set(self.scope)
            else:
                if name not in self._per_name:     # retired by the move to the wide watch
                    return
                self._nodes.pop(name, None)
                for n in items:
                    self._nodes[n["metadata"]["name"]] = n
                self._known.add(name)
                changed = {name}
        self._on_change(changed)

    def _event(self, etype: str, node: Obj) -> None:
        name = (node.get("metadata") or {}).get("name") or ""
        with self._lock:
            if etype == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = node
            mine = name in self.scope
        if mine:
            self._on_change({name})
