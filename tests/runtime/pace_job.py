"""Two ranks as two nodes (one rank each, torchrun's environment set by the test, whose process
hosts the store), timing their steps with StepTimer: rank ``--slow`` sleeps ``--delay`` s in its
compute phase before the all-reduce, the other waits for it inside the collective. Prints one
``RESULT {json}`` line per rank: its mean reach and mean whole step, in seconds."""

import argparse
import json
import time

import torch
import torch.distributed as dist

from orchestrator.runtime.timing import StepTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--slow", type=int, default=1)
ap.add_argument("--delay", type=float, default=0.05)
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
timer = StepTimer()
reach, whole = [], []
for _ in range(args.steps):
    with timer.compute():
        x = torch.ones(1000)
        if rank == args.slow:
            time.sleep(args.delay)
    with timer.comm():
        dist.all_reduce(x)
    summary = timer.end_step()
    reach.append(summary["reach_s"])
    whole.append(summary["step_s"])
dist.barrier()
print("RESULT " + json.dumps({"rank": rank, "reach_s": sum(reach[5:]) / len(reach[5:]),
                              "step_s": sum(whole[5:]) / len(whole[5:])}), flush=True)
time.sleep(2.5)          # rank 0's reader prints once more with the newest figures
dist.destroy_process_group()
