"""Exact mid-epoch resume for plain ``torch.utils.data.DataLoader``s registered with the
checkpoint manager, and an honest "not exact" for those that are not.

Why a plain DataLoader breaks a resume: every ``iter(loader)`` draws from the process-global
torch RNG, twice in torch 2.13 (dataloader.py: the workers' base seed, in the iterator's
constructor; sampler.py: RandomSampler's seed when it has no generator, at the first index it
yields, so in the constructor with workers, at the first ``next()`` without). An uninterrupted
run makes those draws at the epoch's start; a resumed one makes them after ``restore()`` put
the global RNG back, so the seeds differ from the ones the epoch was started with and every
later draw (dropout) shifts by two. A dataset's own generator (an IterableDataset that shuffles
with it) has already moved past the epoch's draws when it is checkpointed, and the workers'
global RNG (random augmentation in ``__getitem__``) depends on every sample they loaded.

What a registered loader gets (``CheckpointManager.register(loader=...)``): every iterator
created from it is watched. At its creation the RNG it will draw from is recorded (global torch,
python and numpy RNG, the loader's, its sampler's and its dataset's generators, the manager's
registered generators), again just before its first batch, and the batches handed to the loop
are counted. A checkpoint keeps that record per rank. ``restore()`` then rebuilds the iterator
*before* it puts the checkpoint's RNG back: it sets the recorded RNG, creates the iterator
(the same seeds, the same order, workers seeded alike), reads and discards the batches the loop
had already consumed (so workers' own RNG and an IterableDataset's position are where they
were), and only then restores the RNG of the checkpoint. The next ``iter(loader)`` returns that
iterator. Cost: the consumed part of the epoch is read again at resume.

A loader whose sampler keeps its own position (a ResumableDistributedSampler registered as
``sampler``) is rebuilt with its seeds but not fast-forwarded: the sampler restarts at its
position itself.

An unregistered loader makes a resume "not exact: unregistered DataLoader": one that is alive
when ``restore()`` runs (found among live objects), or whose iterator is created after a resume
(``DataLoader.__iter__`` is observed while a manager is open; the manager then reports the
resume again, as not exact). Also not exact: a registered loader with ``persistent_workers``
(its workers' RNG spans epochs) and an iterator of a registered loader created before
``restore()``. Nothing is patched while no manager is open; without torch nothing here loads it.
"""

from __future__ import annotations

import functools
import gc
import random
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

UNREGISTERED = "unregistered DataLoader"
PERSISTENT = "a registered DataLoader has persistent_workers=True (its workers' random state spans epochs)"
OLD_CHECKPOINT = "the checkpoint holds no DataLoader position (written before loaders could be registered)"
EARLY_ITERATOR = "a registered DataLoader's iterator was created before restore()"

_lock = threading.Lock()
_trackers: weakref.WeakSet[LoaderTracker] = weakref.WeakSet()
_original_iter: Callable[[Any], Any] | None = None
_building = threading.local()     # set while restore() rebuilds an iterator: no tracker sees it


def _dataloader_class() -> Any:
    """torch's DataLoader if torch.utils.data is loaded (no loader can exist otherwise), else None."""
    mod = sys.modules.get("torch.utils.data")
    return getattr(mod, "DataLoader", None) if mod is not None else None


def _observed_iter(loader: Any) -> Any:
    for tracker in [] if getattr(_building, "on", False) else list(_trackers):
        it = tracker.on_iter(loader)
        if it is not None:
            return it
    assert _original_iter is not None
    return _original_iter(loader)


def _install(tracker: LoaderTracker) -> None:
    global _original_iter
    cls = _dataloader_class()
    with _lock:
        _trackers.add(tracker)
        if cls is not None and _original_iter is None:
            _original_iter = cls.__iter__
            cls.__iter__ = _observed_iter


def _uninstall(tracker: LoaderTracker) -> None:
    global _original_iter
    with _lock:
        _trackers.discard(tracker)
        cls = _dataloader_class()
        if not _trackers and _original_iter is not None and cls is not None:
            cls.__iter__ = _original_iter
            _original_iter = None


def _torch() -> Any:
    import torch

    return torch


def _generators(loader: Any) -> dict[str, Any]:
    """The torch Generators a loader's iterator may draw from, by a name stable across runs."""
    torch = _torch()
    found: dict[str, Any] = {}
    places = [("generator", loader), ("sampler.generator", getattr(loader, "sampler", None)),
              ("batch_sampler.sampler.generator", getattr(getattr(loader, "batch_sampler", None), "sampler", None))]
    for name, owner in places:
        g = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(g, torch.Generator):
            found[name] = g
    dataset = getattr(loader, "dataset", None)
    for attr, value in sorted(vars(dataset).items()) if hasattr(dataset, "__dict__") else ():
        if isinstance(value, torch.Generator):
            found[f"dataset.{attr}"] = value
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for name, g in found.items():
        if id(g) not in seen:
            seen.add(id(g))
            out[name] = g
    return out


def _samplers(loader: Any) -> list[Any]:
    return [getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)]


def _sampler_position(loader: Any) -> int | None:
    """The position of a sampler that keeps one (ResumableDistributedSampler), else None."""
    for sampler in _samplers(loader):
        position = getattr(sampler, "position", None)
        if isinstance(position, int) and hasattr(sampler, "state_dict"):
            return position
    return None


def snapshot(generators: dict[str, Any]) -> dict[str, Any]:
    """The global RNGs an iterator draws from (torch CPU, python, numpy if loaded) and ``generators``."""
    state: dict[str, Any] = {"torch": _torch().get_rng_state(), "python": random.getstate(),
                             "generators": {name: g.get_state() for name, g in generators.items()}}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def apply(state: dict[str, Any], generators: dict[str, Any]) -> None:
    _torch().set_rng_state(state["torch"])
    random.setstate(state["python"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    for name, g in generators.items():
        if name in state["generators"]:
            g.set_state(state["generators"][name])


class _Record:
    """One iterator's story: the RNG at its creation and before its first batch, and how many
    batches it handed to the loop."""

    def __init__(self, created: dict[str, Any], sampler_start: int | None) -> None:
        self.created = created
        self.first: dict[str, Any] | None = None
        self.position = 0
        self.sampler_start = sampler_start     # a positioned sampler's position when the iterator began

    def state(self) -> dict[str, Any]:
        return {"created": self.created, "first": self.first, "position": self.position,
                "sampler_start": self.sampler_start}


class TrackedIterator:
    """A DataLoader iterator that counts the batches it hands out (everything else is the
    wrapped iterator's)."""

    def __init__(self, inner: Any, record: _Record, on_first: Callable[[], dict[str, Any]]) -> None:
        self._inner = inner
        self._record = record
        self._on_first = on_first

    def __iter__(self) -> TrackedIterator:
        return self

    def __next__(self) -> Any:
        if self._record.first is None:
            self._record.first = self._on_first()
        item = next(self._inner)
        self._record.position += 1
        return item

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class LoaderTracker:
    """The manager's view of DataLoaders: the registered ones' iterators, and the others."""

    def __init__(self, generators: Callable[[], dict[str, Any]], rank: int = 0) -> None:
        self._extra_generators = generators        # the manager's registered generators
        self._rank = rank
        self._loaders: dict[str, Any] = {}
        self._records: dict[str, _Record] = {}
        self._pending: dict[str, TrackedIterator] = {}
        self._restored = False
        self.resumed = False                      # a checkpoint was restored (not a fresh start)
        self.late: list[str] = []                 # reasons found after the resume was reported
        self._said: set[str] = set()              # reasons the resume already carries
        self._early: set[str] = set()             # registered loaders iterated before restore()
        self.on_late: Callable[[str], None] | None = None
        _install(self)

    def close(self) -> None:
        """Stop watching; the manager is done (nothing it holds keeps a loader alive now)."""
        _uninstall(self)
        self.on_late = None
        self._loaders.clear()
        self._records.clear()
        self._pending.clear()

    def register(self, name: str, loader: Any) -> None:
        cls = _dataloader_class()
        if cls is None or not isinstance(loader, cls):
            raise TypeError(f"register(loader=...) takes a torch.utils.data.DataLoader; got {type(loader).__name__} "
                            f"(for {name!r}): pass the DataLoader itself, not an iterator over it")
        for other, known in self._loaders.items():
            if known is loader and other != name:
                raise ValueError(f"DataLoader {name!r} is already registered as {other!r}: register it once")
        _install(self)    # torch may have been loaded after the manager was made
        self._loaders[name] = loader

    def _name_of(self, loader: Any) -> str | None:
        return next((n for n, known in self._loaders.items() if known is loader), None)

    def _all_generators(self, loader: Any) -> dict[str, Any]:
        gens = {f"manager.{k}": g for k, g in self._extra_generators().items()}
        gens.update(_generators(loader))
        return gens

    # ------------------------------------------------------------ watching iter()

    def on_iter(self, loader: Any) -> Any:
        """DataLoader.__iter__ as this tracker sees it: a TrackedIterator for a registered
        loader, None (torch's own iterator) for the rest."""
        name = self._name_of(loader)
        if name is None:
            if self.resumed:
                self._late(UNREGISTERED)
            return None
        pending = self._pending.pop(name, None)
        if pending is not None:
            return pending
        if not self._restored:
            self._early.add(name)
        gens = self._all_generators(loader)
        record = _Record(snapshot(gens), _sampler_position(loader))
        assert _original_iter is not None
        inner = _original_iter(loader)
        self._records[name] = record
        return TrackedIterator(inner, record, functools.partial(snapshot, gens))

    def _late(self, reason: str) -> None:
        if reason in self._said:
            return
        self._said.add(reason)
        self.late.append(reason)
        if self.on_late is not None:
            self.on_late(reason)

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Per registered loader with an iterator: its record, and the loader's own generators
        as they are now (put back after the rebuild, in case the job drew from them itself)."""
        return {name: {**rec.state(), "now": {k: g.get_state() for k, g in _generators(self._loaders[name]).items()}}
                for name, rec in self._records.items() if name in self._loaders}

    def unregistered_alive(self) -> int:
        """How many DataLoaders are alive that are not registered here."""
        cls = _dataloader_class()
        if cls is None:
            return 0
        mine = {id(x) for x in self._loaders.values()}

        def count() -> int:
            # type(), not isinstance(): an object's __class__ may be a property that warns (torch's
            # deprecated distributed.reduce_op) or runs code.
            return sum(1 for obj in gc.get_objects() if issubclass(type(obj), cls) and id(obj) not in mine)

        if not count():
            return 0
        gc.collect()      # garbage not yet collected (in a cycle) is no loader of the job
        return count()

    def restore(self, saved: dict[str, Any] | None, positioned: Any = None) -> list[str]:
        """Rebuild each registered loader's iterator as it was at the checkpoint, leaving the
        global RNG wherever that took it: the caller restores the checkpoint's RNG *after* this.
        Returns the reasons the resume is not exact (empty when it is). ``positioned``: the
        sampler the manager restored to its position itself; a loader over it is rebuilt from
        the position its iterator began at, then set back."""
        self._restored = True
        self.resumed = True
        _install(self)    # observed from here on even if torch.utils.data loaded after the manager was made
        reasons: list[str] = []
        if self._early:
            reasons.append(EARLY_ITERATOR)
        if self.unregistered_alive():
            reasons.append(UNREGISTERED)
        if saved is None and self._loaders:
            reasons.append(OLD_CHECKPOINT)
        for name, loader in self._loaders.items():
            rec = (saved or {}).get(name)
            if rec is None:
                continue      # no iterator at the checkpoint: the next iter() starts afresh, as it did
            if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0:
                reasons.append(PERSISTENT)
                continue
            gens = self._all_generators(loader)
            start = rec.get("sampler_start")
            held = positioned if positioned is not None and any(x is positioned for x in _samplers(loader)) else None
            if held is not None and not isinstance(start, int):
                reasons.append(OLD_CHECKPOINT)
                continue
            restored_at = held.position if held is not None else None
            try:
                if held is not None:
                    held.position = start      # where the epoch's iterator began, to read it again from there
                inner = self._rebuild(name, loader, rec, gens)
            finally:
                if held is not None:
                    held.position = restored_at
            record = _Record(rec["created"], start)
            record.first = rec["first"]
            own = _generators(loader)
            for k, state in (rec.get("now") or {}).items():
                if k in own:
                    own[k].set_state(state)
            record.position = int(rec["position"])
            self._records[name] = record
            self._pending[name] = TrackedIterator(inner, record, functools.partial(snapshot, gens))
        self._said.update(reasons)
        return reasons

    @staticmethod
    def _rebuild(name: str, loader: Any, rec: dict[str, Any], gens: dict[str, Any]) -> Any:
        """The iterator ``rec`` describes, with the batches it had handed out read and dropped."""
        apply(rec["created"], gens)
        _building.on = True
        try:
            inner = iter(loader)
        finally:
            _building.on = False
        skip = int(rec["position"])
        if skip and rec["first"] is not None:
            apply(rec["first"], gens)
        for done in range(skip):
            try:
                next(inner)
            except StopIteration:
                raise ValueError(f"DataLoader {name!r} has {done} batches now, but the checkpoint was taken "
                                 f"after batch {skip} of its epoch: the dataset or batch size changed "
                                 "since; resume with the data it was saved with") from None
        return inner
