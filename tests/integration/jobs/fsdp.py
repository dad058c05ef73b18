"""A tiny FSDP2 training job on orchestrator.runtime for the supervisor's fault tests: an MLP
with dropout, every layer and the whole model ``fully_shard``-ed (gloo, CPU), AdamW, a
scheduler, a ResumableDistributedSampler over 48 samples and a private generator; checkpoints
sharded through torch.distributed.checkpoint by CheckpointManager into WMCTL_CHECKPOINT_DIR,
resumed by restore() when the launcher says so (WMCTL_RESUME=1).

What the tests compare, all under the checkpoint root:
- ``final.json`` (rank 0, at the end): the full weights and optimizer state as float.hex, so
  "bit-exact" means bit-exact;
- ``samples.rank-R.jsonl``: every step's epoch and sample indices as that rank consumed them,
  one line per step and attempt (a later attempt's line for a step replaces an earlier one).

--hold-commit STEP:SECONDS (attempt 0 only): rank 0 sleeps before it writes step STEP's commit
marker (the checkpoint runtime's test hook), so a test can kill a node while that save is on
disk but not yet committed. With --async-checkpoint the sleep is on the writer thread and
training goes on meanwhile.
"""

import argparse
import json
import os
import time
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

from orchestrator.runtime import dist
from orchestrator.runtime.checkpoint import CheckpointManager
from orchestrator.runtime.data import ResumableDistributedSampler
from orchestrator.runtime.progress import Progress
from orchestrator.runtime.protocol import ENV_TEST_SLEEP_BEFORE_COMMIT

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--every", type=int, default=4)
ap.add_argument("--sleep", type=float, default=0.1)
ap.add_argument("--async-checkpoint", action="store_true")
ap.add_argument("--hold-commit", default="")
args = ap.parse_args()

if args.hold_commit and os.environ.get("WMCTL_ATTEMPT", "0") == "0":
    os.environ[ENV_TEST_SLEEP_BEFORE_COMMIT] = args.hold_commit

dist.init_from_env(backend="gloo", verify_affinity=False)
rank, world = dist.rank(), dist.world_size()
torch.manual_seed(0)                        # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
fully_shard(model[0])
fully_shard(model[2])
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
DATA = torch.linspace(-1, 1, 48 * 8, dtype=torch.float32).reshape(48, 8)
sampler = ResumableDistributedSampler(len(DATA), seed=3)
noise = torch.Generator().manual_seed(7 + rank)
torch.manual_seed(100 + rank)               # dropout draws differ per rank

root = os.environ["WMCTL_CHECKPOINT_DIR"]
progress = Progress(every=1)
ckpt = CheckpointManager(root, keep=2, every_steps=args.every, async_save=args.async_checkpoint, progress=progress)
ckpt.register(model=model, optimizer=opt, scheduler=sched, sampler=sampler, generators={"noise": noise})
progress.start(world_size=world)
step = 0
resumed = ckpt.restore() if os.environ.get("WMCTL_RESUME") == "1" else None
if resumed is not None:
    step = resumed.step
    progress.resume(step=step, path=str(resumed.path), exact=resumed.exact, reason=resumed.reason,
                    warnings=resumed.warnings)
record = open(os.path.join(root, f"samples.rank-{rank}.jsonl"), "a")
BATCH = 2
while step < args.steps:
    if sampler.exhausted:
        sampler.set_epoch(sampler.epoch + 1)
    idx = list(iter(sampler))[:BATCH]
    sampler.advance(len(idx))
    x = DATA[idx] + 0.01 * torch.randn(len(idx), 8, generator=noise)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    step += 1
    record.write(json.dumps({"step": step, "epoch": sampler.epoch, "indices": idx,
                             "attempt": os.environ.get("WMCTL_ATTEMPT")}) + "\n")
    record.flush()
    progress.step(step=step, loss=dist.all_reduce_mean(float(loss)), samples=BATCH * world * step)
    if ckpt.should_save(step):
        ckpt.save(step, epoch=sampler.epoch)
    time.sleep(args.sleep)
ckpt.close()
# full and on the CPU: tensors by name (the annotations cover every option, sharded ones included)
msd: Any
osd: Any
msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    state = {"model": {k: [float(v).hex() for v in t.flatten().tolist()] for k, t in msd.items()},
             "optimizer": {str(k): {n: [float(v).hex() for v in t.flatten().tolist()] for n, t in s.items()}
                           for k, s in osd["state"].items()},
             "lr": [float(g["lr"]).hex() for g in osd["param_groups"]]}
    with open(os.path.join(root, "final.json"), "w") as fh:
        json.dump({"run": os.environ.get("WMCTL_RUN"), "steps": step, "state": state}, fh)
dist.barrier()
progress.exit(status="completed", step=step)
dist.destroy()
