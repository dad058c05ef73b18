"""A tiny job that reports what the live panel shows: max_steps in its start line, loss,
cumulative samples and the step time split (StepTimer) every step, checkpoints through
CheckpointManager, and the step it resumed from."""

import argparse
import os
import time

import torch

from orchestrator.runtime import dist
from orchestrator.runtime.checkpoint import CheckpointManager
from orchestrator.runtime.progress import Progress
from orchestrator.runtime.timing import StepTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.1)
args = ap.parse_args()

dist.init_from_env(verify_affinity=False)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
progress = Progress(every=1)
ckpt = CheckpointManager(os.environ["WMCTL_CHECKPOINT_DIR"], keep=2, every_steps=args.every, progress=progress)
ckpt.register(model=model, optimizer=opt)
timer = StepTimer()
progress.start(world_size=dist.world_size(), max_steps=args.steps)
step = 0
resumed = ckpt.restore() if os.environ.get("WMCTL_RESUME") == "1" else None
if resumed is not None:
    step = resumed.step
    progress.resume(step=step, path=str(resumed.path))
while step < args.steps:
    with timer.data():
        x = torch.full((8, 4), float(step + 1))
        time.sleep(args.sleep / 4)
    with timer.forward():
        loss = model(x).pow(2).mean() / (step + 1)
        time.sleep(args.sleep / 2)
    with timer.backward():
        opt.zero_grad()
        loss.backward()
    with timer.optimizer():
        opt.step()
    step += 1
    progress.step(step=step, loss=float(loss), samples=8 * step, timing=timer.end_step())
    if ckpt.should_save(step):
        ckpt.save(step)
    time.sleep(args.sleep / 4)
ckpt.close()
progress.exit(status="completed", step=step)
