"""The clip dataset: pre-decoded ``.npy`` clips, memory-mapped or cached in memory."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from make_data import INFO_FILE


class ClipDataset(Dataset):
    """Item i -> (clip float32 (T, 3, H, W) in [0, 1], i). The index travels with the batch so the
    training loop can record exactly which samples it consumed."""

    def __init__(self, directory: str | Path, cache_in_memory: bool = False) -> None:
        self.directory = Path(directory)
        self.info = json.loads((self.directory / INFO_FILE).read_text())
        self.paths = [self.directory / f"clip-{i:06d}.npy" for i in range(self.info["num_clips"])]
        # The report's fix for a starving card: decode once, keep the clips in memory. Workers
        # forked after this share the pages copy-on-write.
        self.cache = [np.load(p) for p in self.paths] if cache_in_memory else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        arr = self.cache[i] if self.cache is not None else np.load(self.paths[i], mmap_mode="r")
        clip = torch.from_numpy(np.array(arr))  # copy: a memmap is read-only
        clip = clip.permute(0, 3, 1, 2).float().div_(255.0)
        return clip, i


def worker_init_fn(worker_id: int) -> None:
    # torch seeds each worker with base_seed + worker_id (base_seed comes from the loader's
    # generator); carry that into numpy and random so any augmentation is reproducible too.
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
