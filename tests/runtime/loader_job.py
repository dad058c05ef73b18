"""A small training job for tests/runtime/test_resume_exact_loader.py: an MLP with dropout
under DDP (gloo, CPU), fed by a *plain* DataLoader (no generator=), checkpointed by
CheckpointManager every few steps and resumed by restore().

--data map: DataLoader(TensorDataset, shuffle=True)      (the sampler draws its seed from the global RNG)
--data augment: the same, plus noise from the global RNG in __getitem__ (in the workers with --num-workers)
--data iterable: an IterableDataset that shuffles with its own generator, registered with the manager

--register hands the loader to the manager (register(loader=...)); without it the loader is
unregistered. Rank 0 writes the sha256 of its final weights to --dump-hash, reports progress
lines, and, with --pause-at STEP, touches --pause-file and waits before that step, every rank in
a collective (an all-reduce of nothing, again and again), so that whichever node the test kills
there, the others die of the lost peer as a training job's survivors do (gloo's "Connection closed
by peer"). Only attempt 0 pauses (WMCTL_ATTEMPT unset or 0): under wmctl every attempt runs the
same command. Paths may name $WMCTL_CHECKPOINT_DIR (the run's checkpoint folder, which the
launcher sets: a container's command is not run by a shell).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

if len(Path(__file__).resolve().parents) > 2:     # in the repo; in an image, wmctl is installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.runtime import dist  # noqa: E402
from orchestrator.runtime.checkpoint import CheckpointManager  # noqa: E402
from orchestrator.runtime.progress import Progress  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--data", choices=["map", "augment", "iterable"], required=True)
ap.add_argument("--num-workers", type=int, default=0)
ap.add_argument("--register", action="store_true")
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--checkpoint-dir", default=None)
ap.add_argument("--pause-at", type=int, default=None)
ap.add_argument("--pause-file", default=None)
ap.add_argument("--dump-hash", default=None)
args = ap.parse_args()
for name in ("checkpoint_dir", "pause_file", "dump_hash"):
    if getattr(args, name):
        setattr(args, name, os.path.expandvars(getattr(args, name)))
pauses = os.environ.get("WMCTL_ATTEMPT", "0") in ("", "0")

N, DIM, BATCH = 64, 8, 4      # 16 batches an epoch: 40 steps are 2.5 epochs


class Augmented(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(DIM), self.y[i]     # the worker's (or process's) global RNG


class Shuffled(torch.utils.data.IterableDataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.g = torch.Generator()
        self.g.manual_seed(99 + dist.rank())

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        order = torch.randperm(len(self.x), generator=self.g).tolist()
        if info is not None:
            order = order[info.id::info.num_workers]
        for i in order:
            yield self.x[i], self.y[i]


dist.init_from_env(verify_affinity=False)
rank = dist.rank()
data_gen = torch.Generator()
data_gen.manual_seed(7)
x = torch.randn(N, DIM, generator=data_gen)
y = (x.sum(dim=1, keepdim=True) > 0).float()
torch.manual_seed(1000 + rank)      # per-rank global RNG: dropout, shuffle seeds, worker seeds
if args.data == "map":
    dataset: torch.utils.data.Dataset = torch.utils.data.TensorDataset(x, y)
elif args.data == "augment":
    dataset = Augmented(x, y)
else:
    dataset = Shuffled(x, y)
shuffle = args.data != "iterable"
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=shuffle, num_workers=args.num_workers)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
torch.manual_seed(1000 + rank)
ddp = torch.nn.parallel.DistributedDataParallel(model) if dist.world_size() > 1 else model
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
progress = Progress(every=1)
ckpt = None
if args.checkpoint_dir:
    ckpt = CheckpointManager(args.checkpoint_dir, keep=2, every_steps=args.every, progress=progress)
    ckpt.register(model=model, optimizer=opt, generators={"data": dataset.g} if isinstance(dataset, Shuffled) else None,
                  loader=loader if args.register else None)
progress.start(world_size=dist.world_size())
step = 0
resumed = ckpt.restore() if ckpt is not None else None
if resumed is not None:
    step = resumed.step
    progress.resume(step=step, path=str(resumed.path), exact=resumed.exact, reason=resumed.reason,
                    warnings=resumed.warnings)

ddp.train()
while step < args.steps:
    for xb, yb in loader:
        if args.pause_at is not None and step + 1 == args.pause_at and pauses:
            if rank == 0:
                Path(args.pause_file).write_text(str(step + 1))
            nothing = torch.zeros(1)
            while True:      # the test SIGKILLs the job (or a node of it) here
                torch.distributed.all_reduce(nothing)
                time.sleep(0.2)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        progress.step(step=step, loss=round(float(loss), 8), samples=step * BATCH * dist.world_size())
        if ckpt is not None and ckpt.should_save(step):
            ckpt.save(step)
        if step >= args.steps:
            break
if ckpt is not None:
    ckpt.close()
if rank == 0 and args.dump_hash:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    Path(args.dump_hash).parent.mkdir(parents=True, exist_ok=True)
    Path(args.dump_hash).write_text(h.hexdigest())
dist.barrier()
progress.exit(status="completed", step=step)
dist.destroy()
