"""Exclusions that outlive a run: nodes a run left for a lost node, a device fault or a hang,
remembered per cluster with the evidence and an expiry, so the next run on that cluster avoids
them too (restart.remember_exclusions, docs/spares.md "Remembered exclusions").

Only where nodes are machines (a backend's ``remembers_exclusions``: Kubernetes, Slurm); a local
or Docker "node" is a process or a container, and nothing is learnt about a machine from it.
Kept beside the run store: ``$WMCTL_HOME/exclusions.json`` (replaced atomically, under a lock)
for the local store; a ConfigMap for WMCTL_RUN_STORE=kubernetes (its module's
``open_exclusions``). A dry run reads the file without loading run state.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

from . import layout
from .errors import BackendError, RecordDamaged
from .runtime.records import record

# The failure classes whose node is remembered (failures.py's NODE_LOST, DEVICE_FAULT, HANG:
# the node, not the job). Pressure (an eviction), a graceful shutdown, a slow pull, a preemption
# and the job's own error are never remembered: they say nothing lasting about the machine.
REMEMBERED_KINDS = frozenset({"node_lost", "device_fault", "hang"})
DEFAULT_TTL_S = 24 * 3600.0
FILE = "exclusions.json"
LOCK = "exclusions.lock"
LOCK_WAIT_S = 10.0
VERSION = 1


@record(frozen=True)
class Exclusion:
    """One remembered node of one cluster: why (``kind``, ``evidence`` in the classifier's
    words), which run and attempt left it, when (``at``) and until when it is avoided."""

    node: str
    cluster: str
    kind: str
    evidence: str
    run: str
    attempt: int
    at: float
    expires: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Exclusion":
        return cls(node=str(data["node"]), cluster=str(data["cluster"]), kind=str(data["kind"]),
                   evidence=str(data.get("evidence") or ""), run=str(data.get("run") or ""),
                   attempt=int(data.get("attempt") or 0), at=float(data["at"]), expires=float(data["expires"]))


def remembered(kind: str) -> bool:
    """Is a node excluded for a failure of class ``kind`` remembered past its run?"""
    return kind in REMEMBERED_KINDS


def active(entries: list[Exclusion], cluster: str | None = None, now: float | None = None) -> list[Exclusion]:
    """The unexpired entries (of ``cluster`` when given), oldest first."""
    now = time.time() if now is None else now
    return sorted((e for e in entries if e.expires > now and (cluster is None or e.cluster == cluster)),
                  key=lambda e: e.at)


def add(entries: list[Exclusion], new: Exclusion, now: float | None = None) -> list[Exclusion]:
    """``entries`` with ``new`` in (replacing the same node of the same cluster: the newest
    evidence and expiry), expired ones dropped."""
    kept = [e for e in active(entries, None, now) if (e.node, e.cluster) != (new.node, new.cluster)]
    return sorted([*kept, new], key=lambda e: e.at)


def forgive(entries: list[Exclusion], node: str, cluster: str | None = None) -> tuple[list[Exclusion], list[Exclusion]]:
    """(what is left, what was forgiven): ``node`` of ``cluster``, or of every cluster."""
    gone = [e for e in entries if e.node == node and (cluster is None or e.cluster == cluster)]
    return [e for e in entries if e not in gone], gone


@record(frozen=True)
class Applied:
    """What an attempt excludes: its run's own nodes, then the remembered ones kept; the
    remembered ones dropped to leave room (oldest first), and what to say about it."""

    nodes: tuple[str, ...]
    remembered: tuple[Exclusion, ...]
    dropped: tuple[Exclusion, ...]
    notes: tuple[str, ...]


def apply(own: list[str] | tuple[str, ...], memory: list[Exclusion], *, room: int | None = None,
          usable: frozenset[str] | None = None, needed: int = 0) -> Applied:
    """The exclusions of one attempt. ``own``: the run's own (the nodes its earlier attempts
    failed on); ``memory``: the cluster's remembered, oldest first. Never exclude so many that the
    job cannot be placed: ``room`` caps how many may be excluded (0: none, after an attempt that
    could not be placed); ``usable``, the nodes that could take the job's ``needed`` nodes now (the
    backend's ``placeable_hosts``), must keep ``needed`` of them free. Either way the remembered
    go first, oldest first, then the run's own (its newest kept); None: not known, no cap."""
    own = list(dict.fromkeys(own))
    extra: list[Exclusion] = []
    for e in memory:
        if e.node not in own and all(e.node != x.node for x in extra):
            extra.append(e)
    dropped: list[Exclusion] = []
    cut: list[str] = []

    def over_room() -> bool:
        return room is not None and len(own) + len(extra) > max(0, room)

    def too_few_left() -> bool:
        return usable is not None and len(usable - set(own) - {e.node for e in extra}) < needed

    def first(names: list[str]) -> int | None:
        """Which to let go next: the oldest, or over ``usable`` the oldest that could take a node."""
        if over_room():
            return 0 if names else None
        if too_few_left():
            return next((i for i, n in enumerate(names) if usable is not None and n in usable), None)
        return None

    while (i := first([e.node for e in extra])) is not None:
        dropped.append(extra.pop(i))
    while (i := first(own)) is not None:
        cut.append(own.pop(i))
    notes: list[str] = []
    if cut:
        notes.append(f"warning: excluding {', '.join(cut)} too would leave too few nodes to place the job: "
                     "they are not excluded")
    if dropped:
        notes.append(f"warning: remembered exclusions of {', '.join(e.node for e in dropped)} dropped (oldest "
                     "first): with them the job could not be placed")
    if extra:
        notes.append("remembered exclusions applied (restart.remember_exclusions; `wmctl nodes` lists them): "
                     + "; ".join(f"{e.node} ({e.kind} in run {e.run} attempt {e.attempt})" for e in extra))
    return Applied(tuple(own) + tuple(e.node for e in extra), tuple(extra), tuple(dropped), tuple(notes))


# ---- where they are kept --------------------------------------------------------------------------

class ExclusionStore(ABC):
    """Where a machine's (or a cluster's) remembered exclusions are kept."""

    where: str = ""

    @abstractmethod
    def load(self) -> list[Exclusion]:
        """Every entry kept, expired ones included; [] when none."""

    @abstractmethod
    def update(self, change: Callable[[list[Exclusion]], list[Exclusion]]) -> list[Exclusion]:
        """Read, ``change``, write back, with no other writer in between; returns what was written."""


def encode(entries: list[Exclusion]) -> str:
    return json.dumps({"version": VERSION, "exclusions": [asdict(e) for e in entries]}, indent=1)


def decode(text: str, where: str) -> list[Exclusion]:
    try:
        data = json.loads(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return [Exclusion.from_dict(d) for d in data.get("exclusions") or []]
    except (KeyError, ValueError, TypeError) as exc:
        raise RecordDamaged(f"the remembered exclusions ({where}) are damaged: {exc}",
                            hint=f"move it aside ({where}) to forget every remembered exclusion") from None


class LocalExclusionStore(ExclusionStore):
    """``$WMCTL_HOME/exclusions.json``, replaced atomically under ``exclusions.lock``."""

    def __init__(self, home: Path | None = None):
        self.home = home or layout.wmctl_home()
        self.path = self.home / FILE
        self.where = str(self.path)

    def load(self) -> list[Exclusion]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return decode(text, self.where)

    def update(self, change: Callable[[list[Exclusion]], list[Exclusion]]) -> list[Exclusion]:
        from .state import _flock, write_atomic      # loaded only to write: a dry run only reads

        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / LOCK, "a+") as fh:
            if not _flock(fh, fcntl.LOCK_EX, LOCK_WAIT_S):
                raise RecordDamaged(f"the remembered exclusions ({self.where}) stayed locked for {LOCK_WAIT_S:.0f} s",
                                    hint="another wmctl is writing them; try again")
            entries = change(self.load())
            write_atomic(self.path, encode(entries))
        return entries


def open_exclusions() -> ExclusionStore:
    """Where the remembered exclusions are kept: beside the run store (WMCTL_RUN_STORE)."""
    from .runtime.protocol import ENV_RUN_STORE
    from . import storehook

    kind = (os.environ.get(ENV_RUN_STORE) or "").strip().lower()
    if kind:
        module, _ = storehook.resolve(kind)
        if module is not None:
            found = importlib.import_module(module)
            if hasattr(found, "open_exclusions"):
                store: ExclusionStore = found.open_exclusions()
                return store
    return LocalExclusionStore()


def cluster_entries(store: ExclusionStore, cluster: str | None, now: float | None = None) -> Iterator[Exclusion]:
    """The unexpired entries of ``cluster`` (none when the cluster is unknown)."""
    if cluster:
        yield from active(store.load(), cluster, now)


def for_attempt(own: list[str] | tuple[str, ...], *, remembers: bool, cluster: Callable[[], str | None],
                ttl_s: float, room: int | None = None, store: ExclusionStore | None = None,
                now: float | None = None, usable: Callable[[], frozenset[str] | None] | None = None,
                needed: int = 0) -> Applied:
    """What one attempt excludes: ``own`` and, where the backend ``remembers`` and ``ttl_s`` > 0,
    the cluster's remembered nodes (``apply``). Remembered exclusions that cannot be read are
    said in a note and not applied (a damaged file, a cluster store out of reach): they never stop
    a submission. ``usable``/``needed``: see ``apply``."""
    memory: list[Exclusion] = []
    key = cluster() if remembers and ttl_s > 0 else None
    warning: tuple[str, ...] = ()
    if key:
        try:
            memory = list(cluster_entries(store or open_exclusions(), key, now))
        except (RecordDamaged, BackendError) as exc:     # damaged; the cluster's store out of reach or refused
            warning = (f"warning: remembered exclusions not read: {exc.message}; none applied"
                       + (f" ({exc.hint})" if exc.hint else ""),)
    # the nodes that could take the job are asked for only when something is excluded
    free = usable() if usable is not None and (own or memory) else None
    applied = apply(own, memory, room=room, usable=free, needed=needed)
    return Applied(applied.nodes, applied.remembered, applied.dropped, (*applied.notes, *warning))


def remember(*, node: str, cluster: str, kind: str, evidence: str, run: str, attempt: int, ttl_s: float,
             now: float | None = None, store: ExclusionStore | None = None) -> Exclusion | None:
    """Keep ``node`` of ``cluster`` for ``ttl_s``: only a node failure (``remembered(kind)``) and
    only with ``ttl_s`` > 0. Returns what was kept, or None."""
    if not remembered(kind) or ttl_s <= 0 or not node or not cluster:
        return None
    now = time.time() if now is None else now
    entry = Exclusion(node=node, cluster=cluster, kind=kind, evidence=evidence[:500], run=run, attempt=attempt,
                      at=now, expires=now + ttl_s)
    (store or open_exclusions()).update(lambda entries: add(entries, entry, now))
    return entry
