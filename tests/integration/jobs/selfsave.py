"""A job that checkpoints itself, as Megatron, DeepSpeed or Lightning jobs do, and imports
nothing of wmctl: plain torch.save, its own ``latest`` file, its own resume.

It tells the supervisor what it did with progress lines written by hand, the convention in
orchestrator/runtime/protocol.py (``WMCTL-PROGRESS`` and one JSON object on stdout):
``checkpoint`` once checkpoint N is durable, ``resume`` once it resumed from N, and ``step``
lines as its heartbeat (after a job's first progress line only progress lines count as signs of
life, and checkpoints alone are too rare for that).

Each step adds f(step) to a float64 state, so the final state is right only if every step ran
exactly once after the last resume. Knobs: --steps, --every, --sleep; writes final.txt.
"""

import argparse
import json
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.1)
args = ap.parse_args()

ckpt_dir = os.environ["WMCTL_CHECKPOINT_DIR"]   # the launcher creates the run's own folder
latest = os.path.join(ckpt_dir, "latest")


def say(event, **fields):
    print("WMCTL-PROGRESS " + json.dumps({"event": event, **fields}), flush=True)


def atomic(path, write):
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


step, state = 0, torch.zeros((), dtype=torch.float64)
if os.path.exists(latest):
    with open(latest) as fh:
        name = fh.read().strip()
    saved = torch.load(os.path.join(ckpt_dir, name))
    step, state = saved["step"], saved["state"]
    say("resume", step=step)
    print(f"my own log: resumed from {name}", flush=True)

while step < args.steps:
    time.sleep(args.sleep)
    step += 1
    state += (step * 0.37) ** 0.5 / 3.0
    print(f"my own log: step {step}", flush=True)
    say("step", step=step)
    if step % args.every == 0:
        name = f"ckpt-{step:06d}.pt"
        atomic(os.path.join(ckpt_dir, name),
               lambda fh, step=step, state=state: torch.save({"step": step, "state": state}, fh))
        atomic(latest, lambda fh, name=name: fh.write(name.encode()))
        say("checkpoint", step=step)

with open(os.path.join(ckpt_dir, "final.txt"), "w") as fh:
    fh.write(float(state.item()).hex())
