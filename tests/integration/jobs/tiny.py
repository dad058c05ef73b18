"""A tiny training job on orchestrator.runtime: a linear model under DDP (gloo), checkpointed by
CheckpointManager into WMCTL_CHECKPOINT_DIR, resumed by restore(). Prints progress lines. Its
final weights go to <checkpoint root>/final.json, so tests can tell which run trained what."""

import argparse
import json
import os
import time

import torch

from orchestrator.runtime import dist
from orchestrator.runtime.checkpoint import CheckpointManager
from orchestrator.runtime.progress import Progress

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.05)
ap.add_argument("--keep", type=int, default=2, help="complete checkpoints kept (CheckpointManager keep=)")
ap.add_argument("--abort-at-exit", type=int, default=None, metavar="RANK",
                help="this rank aborts (SIGABRT, no error of its own) after the last barrier, as a "
                     "collective library's teardown sometimes does")
args = ap.parse_args()

dist.init_from_env(verify_affinity=False)
torch.manual_seed(0)
model: torch.nn.Module = torch.nn.Linear(4, 1)
if dist.world_size() > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
progress = Progress(every=1)
root = os.environ["WMCTL_CHECKPOINT_DIR"]
ckpt = CheckpointManager(root, keep=args.keep, every_steps=args.every, progress=progress)
ckpt.register(model=model, optimizer=opt)
progress.start(world_size=dist.world_size())
step = 0
resumed = ckpt.restore() if os.environ.get("WMCTL_RESUME") == "1" else None
if resumed is not None:
    step = resumed.step
    progress.resume(step=step, path=str(resumed.path), exact=resumed.exact, reason=resumed.reason,
                    warnings=resumed.warnings)
while step < args.steps:
    x = torch.full((8, 4), float(step + 1))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    progress.step(step=step, loss=float(loss), samples=8 * step)
    if ckpt.should_save(step):
        ckpt.save(step)
    time.sleep(args.sleep)
ckpt.close()
if dist.rank() == 0:
    weights = [float(v) for v in torch.nn.utils.parameters_to_vector(model.parameters())]
    with open(os.path.join(root, "final.json"), "w") as fh:
        json.dump({"run": os.environ.get("WMCTL_RUN"), "steps": step, "weights": weights}, fh)
dist.barrier()
progress.exit(status="completed", step=step)
if args.abort_at_exit == dist.rank():
    os.abort()
