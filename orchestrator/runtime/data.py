"""Data-side helpers for resumable, preemptible jobs.

- ``ResumableDistributedSampler``: a distributed sampler whose position can be saved and restored
  (epoch + samples consumed).
- ``WorkerInit`` / ``PreemptibleDataLoader``: DataLoader workers that survive the SIGTERM meant for
  their trainer, so a preemption ends in a checkpoint instead of a crash.
- ``sample_generator(seed, epoch, index)``: per-sample random streams, so random augmentation is
  the same whichever worker draws a sample and whether or not the epoch was resumed mid-way.

Why a position counted by the training loop: a DataLoader with workers prefetches
(num_workers x prefetch_factor batches), so what the sampler has *yielded* runs ahead of what
the model has *seen*. The loop calls ``advance(n)`` for every micro-batch it consumes and the
checkpoint stores that count. Resuming from a checkpoint then replays exactly the samples an
uninterrupted run would have seen next (the field report's "loss does not fall after resume").
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import struct
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.runtime import dist

# Signals a trainer turns into a graceful, checkpointed stop (PreemptionHandler's defaults). Its
# DataLoader workers must not die of them: see WorkerInit.
WORKER_IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ResumableDistributedSampler:
    """Like ``torch.utils.data.DistributedSampler`` (same shuffle from seed + epoch, same
    padding, rank r takes every world-th index), plus ``state_dict`` / ``load_state_dict``.

    ``set_epoch(e)`` resets the position only when the epoch changes, so calling it at the top
    of the epoch loop after a restore keeps the restored position.
    """

    def __init__(self, dataset_len: int | Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, yield_epoch: bool = False) -> None:
        n = dataset_len if isinstance(dataset_len, int) else len(dataset_len)
        self.num_replicas = num_replicas if num_replicas is not None else dist.world_size()
        self.rank = rank if rank is not None else dist.rank()
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is outside 0..{self.num_replicas - 1}")
        if n <= 0:
            raise ValueError("the dataset is empty")
        self.dataset_len = n
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        # yield (epoch, index) instead of index, so a dataset can draw from
        # sample_generator(seed, epoch, index) without any epoch state in the workers.
        self.yield_epoch = yield_epoch
        if drop_last and n % self.num_replicas:
            self.num_samples = n // self.num_replicas
        else:
            self.num_samples = -(-n // self.num_replicas)
        if self.num_samples == 0:
            raise ValueError(f"{n} samples cannot be split over {self.num_replicas} ranks with drop_last")
        self.total_size = self.num_samples * self.num_replicas
        self.epoch = 0
        self.position = 0   # samples of this epoch consumed by this rank (advance())

    def _epoch_indices(self) -> list[int]:
        import torch

        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            indices = list(range(self.dataset_len))
        if self.drop_last:
            indices = indices[: self.total_size]
        else:
            pad = self.total_size - len(indices)
            while pad > 0:   # padding repeats the head, as DistributedSampler does
                indices += indices[:pad]
                pad = self.total_size - len(indices)
        return indices[self.rank: self.total_size: self.num_replicas]

    def __iter__(self) -> Iterator[Any]:
        # Starts where the loop stopped consuming; a fresh epoch starts at 0.
        indices = self._epoch_indices()[self.position:]
        if self.yield_epoch:
            epoch = self.epoch
            return iter([(epoch, i) for i in indices])
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples - self.position

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def advance(self, n: int) -> None:
        """The training loop consumed ``n`` more samples of this epoch."""
        if n < 0 or self.position + n > self.num_samples:
            raise ValueError(f"advance({n}) at position {self.position} overruns the epoch of {self.num_samples}")
        self.position += n

    @property
    def exhausted(self) -> bool:
        return self.position >= self.num_samples

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "world_size": self.num_replicas, "dataset_len": self.dataset_len}

    def load_state_dict(self, state: dict[str, Any], world_size: int | None = None) -> None:
        """Restore a position. With a different ``world_size`` the saved per-rank position is
        rescaled to the same number of samples consumed in total (approximate: the order of
        samples differs, so such a resume is not exact)."""
        if int(state.get("dataset_len", self.dataset_len)) != self.dataset_len:
            raise ValueError(f"checkpoint was taken on a dataset of {state['dataset_len']} samples, "
                             f"this one has {self.dataset_len}")
        self.epoch = int(state["epoch"])
        position = int(state["position"])
        saved_world = int(world_size or state.get("world_size", self.num_replicas))
        if saved_world != self.num_replicas:
            position = position * saved_world // self.num_replicas
        self.position = min(position, self.num_samples)


# ---------------------------------------------------------------- per-sample random streams


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that depends only on (seed, epoch, index).

    blake2b rather than ``hash()``: it is the same on every Python version and platform, and
    neighbouring indices get unrelated streams (seed + index would give overlapping ones).
    """
    digest = hashlib.blake2b(struct.pack("<qqq", int(seed), int(epoch), int(index)), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_generator(seed: int, epoch: int, index: int) -> Any:
    """A ``torch.Generator`` for the random augmentation of sample ``index`` in ``epoch``.

    Draw every random number of a sample's augmentation from it (``torch.rand(..., generator=g)``)
    and the augmentation is exact across resumes: it no longer depends on which worker loads the
    sample, on ``num_workers``, or on where in the epoch the run (re)started. The process-global
    RNGs (``random``, ``np.random``, ``torch.rand`` without a generator) inside workers are
    reproducible only for a whole epoch started fresh with the same ``num_workers``.
    """
    import torch

    g = torch.Generator()
    g.manual_seed(sample_seed(seed, epoch, index))
    return g


def sample_numpy_rng(seed: int, epoch: int, index: int) -> Any:
    """Like ``sample_generator`` for numpy code: a ``numpy.random.Generator``."""
    import numpy as np

    return np.random.default_rng(sample_seed(seed, epoch, index))


# ---------------------------------------------------------------- preemptible DataLoader workers


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that makes workers ignore SIGTERM and SIGINT.

    torchrun stops a worker with ``os.killpg(worker_pid, SIGTERM)``: the whole process group,
    which includes the worker's DataLoader processes. torch's worker signal handler turns a
    SIGTERM not sent by its parent into death by SIGTERM, and the trainer then raises "DataLoader
    worker (pid N) is killed by signal: Terminated" before it reaches the step boundary where it
    would checkpoint. Ignored, the signal reaches only the trainer, which saves and exits. The
    workers still end with it: the DataLoader shuts them down, their watchdog exits when the
    trainer is gone, and torchrun's SIGKILL after the grace period reaches the whole group.

    Chain your own init function through it::

        DataLoader(..., worker_init_fn=WorkerInit(my_worker_init))

    A class rather than a closure so that it pickles (the spawn and forkserver start methods).
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        for sig in WORKER_IGNORED_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # PreemptibleDataLoader forks workers with these signals blocked, to cover the moments
        # between fork and this call; setting SIG_IGN discarded any that arrived meanwhile.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORED_SIGNALS)
        if self.user_fn is not None:
            self.user_fn(worker_id)


@contextlib.contextmanager
def signals_blocked(signals: tuple[int, ...] = WORKER_IGNORED_SIGNALS) -> Iterator[None]:
    """Block ``signals`` in the calling thread; they are delivered (not lost) on exit.

    Processes forked meanwhile inherit the mask, so a SIGTERM cannot kill a new DataLoader worker
    before WorkerInit has made it ignore the signal.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _loader_class() -> Any:
    from torch.utils.data import DataLoader

    class PreemptibleDataLoader(DataLoader):
        """A ``torch.utils.data.DataLoader`` whose workers survive a preemption SIGTERM.

        Same arguments as DataLoader; ``worker_init_fn`` is wrapped in WorkerInit (which calls
        it), and iterators are created with the signals blocked (see ``signals_blocked``).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            user_fn = kwargs.pop("worker_init_fn", None)
            if isinstance(user_fn, WorkerInit):
                user_fn = user_fn.user_fn
            super().__init__(*args, worker_init_fn=WorkerInit(user_fn), **kwargs)  # type: ignore[misc]

        def __iter__(self) -> Any:
            if self.num_workers == 0:
                return super().__iter__()
            with signals_blocked():
                return super().__iter__()

    # Found by name through this module's __getattr__, like a class defined at the top level.
    PreemptibleDataLoader.__module__ = __name__
    PreemptibleDataLoader.__qualname__ = "PreemptibleDataLoader"
    return PreemptibleDataLoader


_PREEMPTIBLE_LOADER: Any = None


def __getattr__(name: str) -> Any:
    # torch loads only when the loader class is asked for: the sampler and the seeds stay cheap.
    global _PREEMPTIBLE_LOADER
    if name == "PreemptibleDataLoader":
        if _PREEMPTIBLE_LOADER is None:
            _PREEMPTIBLE_LOADER = _loader_class()
        return _PREEMPTIBLE_LOADER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
