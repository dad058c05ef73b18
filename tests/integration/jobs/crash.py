"""A job whose rank 1 raises from its own code at step 2: the error users must see, in its own words."""

import argparse
import time

import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--every", type=int, default=1)
ap.add_argument("--sleep", type=float, default=0.2)
args = ap.parse_args()
dist.init_process_group("gloo")


def load_batch(step):
    if dist.get_rank() == 1 and step == 2:
        raise ValueError(f"bad batch shape (4, 3) at step {step}")  # crash.py line 18


for step in range(args.steps):
    load_batch(step)
    time.sleep(args.sleep)
