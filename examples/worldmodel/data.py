"""The clip dataset: pre-decoded ``.npy`` clips, memory-mapped or cached in memory, with random
augmentation that is exact across resumes (drawn from the sample's own random stream)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from make_data import INFO_FILE
from orchestrator.runtime.data import sample_generator


class ClipDataset(Dataset):
    """Item i -> (clip float32 (T, 3, H, W) in [0, 1], i). The index travels with the batch so the
    training loop can record exactly which samples it consumed.

    Keys are ``i`` or ``(epoch, i)`` (ResumableDistributedSampler(yield_epoch=True)). With
    ``augment``, each clip is flipped and its brightness scaled at random, drawn from
    ``sample_generator(seed, epoch, i)``: the same augmentation whichever worker loads the sample
    and whether the epoch started fresh or from a checkpoint in its middle.
    """

    def __init__(self, directory: str | Path, cache_in_memory: bool = False, augment: bool = False,
                 seed: int = 0) -> None:
        self.directory = Path(directory)
        self.augment = augment
        self.seed = seed
        self.info = json.loads((self.directory / INFO_FILE).read_text())
        self.paths = [self.directory / f"clip-{i:06d}.npy" for i in range(self.info["num_clips"])]
        # The report's fix for a starving card: decode once, keep the clips in memory. Workers
        # forked after this share the pages copy-on-write.
        self.cache = [np.load(p) for p in self.paths] if cache_in_memory else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, i = key if isinstance(key, tuple) else (0, key)
        arr = self.cache[i] if self.cache is not None else np.load(self.paths[i], mmap_mode="r")
        clip = torch.from_numpy(np.array(arr))  # copy: a memmap is read-only
        clip = clip.permute(0, 3, 1, 2).float().div_(255.0)
        if self.augment:
            # Never the global RNGs here: their state in a worker depends on which samples that
            # worker happened to load before, which a mid-epoch resume changes.
            g = sample_generator(self.seed, epoch, i)
            if bool(torch.rand((), generator=g) < 0.5):
                clip = clip.flip(-1)
            scale = 0.9 + 0.2 * torch.rand((), generator=g)
            clip = clip.mul_(scale).clamp_(0.0, 1.0)
        return clip, i


def worker_init_fn(worker_id: int) -> None:
    # torch seeds each worker with base_seed + worker_id (base_seed comes from the loader's
    # generator); carry that into numpy and random. That makes code drawing from them
    # reproducible for an epoch started fresh with the same num_workers, not after a mid-epoch
    # resume: augmentation draws from sample_generator instead (see ClipDataset).
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
