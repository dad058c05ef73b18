"""Generate the synthetic video dataset, pre-decoded to one ``.npy`` clip per file.

Each clip is uint8 (frames, size, size, 3): a few coloured squares moving with constant
velocity and bouncing off the edges, plus a little noise, so the next frame is predictable.
Deterministic: clip i depends only on (seed, i). Usage::

    python examples/worldmodel/make_data.py DIR --num-clips 256 --frames 16 --size 96
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

INFO_FILE = "dataset.json"


def make_clip(rng: np.random.Generator, frames: int, size: int, objects: int = 3) -> np.ndarray:
    clip = np.empty((frames, size, size, 3), dtype=np.uint8)
    side = rng.integers(max(2, size // 10), max(3, size // 4), size=objects)
    pos = rng.uniform(0, size, size=(objects, 2))
    vel = rng.uniform(-size / 12, size / 12, size=(objects, 2))
    colour = rng.integers(64, 256, size=(objects, 3))
    background = rng.integers(0, 48, size=3)
    for t in range(frames):
        frame = np.broadcast_to(background, (size, size, 3)).astype(np.int16)
        for k in range(objects):
            y, x = pos[k].astype(int)
            frame[max(0, y): y + side[k], max(0, x): x + side[k]] = colour[k]
        frame += rng.integers(-6, 7, size=frame.shape, dtype=np.int16)
        clip[t] = np.clip(frame, 0, 255).astype(np.uint8)
        pos += vel
        for d in range(2):   # bounce
            low, high = pos[:, d] < 0, pos[:, d] > size - side
            vel[low | high, d] *= -1
            pos[:, d] = np.clip(pos[:, d], 0, size - side)
    return clip


def dataset_info(num_clips: int, frames: int, size: int, seed: int) -> dict:
    return {"format": 1, "num_clips": num_clips, "frames": frames, "size": size, "seed": seed}


def ensure_dataset(directory: str | Path, num_clips: int, frames: int, size: int, seed: int = 0) -> Path:
    """Create the dataset in ``directory`` unless an identical one is already there."""
    directory = Path(directory)
    want = dataset_info(num_clips, frames, size, seed)
    info_path = directory / INFO_FILE
    if info_path.exists():
        have = json.loads(info_path.read_text())
        if have != want:
            raise SystemExit(f"--data-dir {directory} holds a different dataset ({have}); "
                             f"use another --data-dir for {want}")
        return directory
    # Build next to the target and rename: a crash never leaves a half-written dataset behind.
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-{time.time_ns()}")
    tmp.mkdir(parents=True)
    try:
        for i in range(num_clips):
            rng = np.random.default_rng([seed, i])
            np.save(tmp / f"clip-{i:06d}.npy", make_clip(rng, frames, size))
        (tmp / INFO_FILE).write_text(json.dumps(want, sort_keys=True))
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, directory)
        except OSError:
            if not info_path.exists():   # lost a race with another process building the same thing
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory")
    ap.add_argument("--num-clips", "--num_clips", type=int, default=256)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(ensure_dataset(a.directory, a.num_clips, a.frames, a.size, a.seed))


if __name__ == "__main__":
    main()
