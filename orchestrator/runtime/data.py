"""A distributed sampler whose position can be saved and restored (epoch + samples consumed).

Why a position counted by the training loop: a DataLoader with workers prefetches
(num_workers x prefetch_factor batches), so what the sampler has *yielded* runs ahead of what
the model has *seen*. The loop calls ``advance(n)`` for every micro-batch it consumes and the
checkpoint stores that count. Resuming from a checkpoint then replays exactly the samples an
uninterrupted run would have seen next (the field report's "loss does not fall after resume").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orchestrator.runtime import dist


class ResumableDistributedSampler:
    """Like ``torch.utils.data.DistributedSampler`` (same shuffle from seed + epoch, same
    padding, rank r takes every world-th index), plus ``state_dict`` / ``load_state_dict``.

    ``set_epoch(e)`` resets the position only when the epoch changes, so calling it at the top
    of the epoch loop after a restore keeps the restored position.
    """

    def __init__(self, dataset_len: int | Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
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

    def __iter__(self) -> Iterator[int]:
        # Starts where the loop stopped consuming; a fresh epoch starts at 0.
        return iter(self._epoch_indices()[self.position:])

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
