"""One gloo all-reduce across the job's ranks: rank r contributes r + 1, every rank prints the sum."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank}/{world} on {os.environ['SLURMD_NODENAME']} (SLURM_NODEID {os.environ['SLURM_NODEID']}): "
      f"sum {total.item():g}", flush=True)
dist.destroy_process_group()
