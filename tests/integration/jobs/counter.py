"""A tiny deterministic torchrun job for the supervisor's fault matrix (torch only with 2+ ranks).

Each step every rank adds f(step, rank) to a float64 state and all-reduces it (gloo), so the
final state depends on every step having run exactly once after the last restore. It keeps
wmctl's contract: progress lines on rank 0, checkpoints committed by marker, resume from the
newest committed one, SIGTERM -> checkpoint -> exit 83. Knobs via argv: --steps, --every,
--sleep (seconds per step; --first-attempt-sleep on attempt 0), --fail-at (exit 1 at that step on rank 1, test hook),
--alloc-mb (allocate that much at start: the OOM case), --hold STEP:FILE (every rank waits
after that step while the file exists: a test acts while the run stands still), --timer (time each step with the
runtime's StepTimer, which sends every rank's pace to the watcher: stragglers). A slow machine
for the straggler tests: COUNTER_SLOW_HOST names a host (WMCTL_NODE_NAME) whose ranks sleep
COUNTER_SLOW_S more per step before the step's first collective (the machine, not the rank: a
spare that takes its place is not slow).
"""

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta

from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE, emit_progress

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--every", type=int, default=5)
p.add_argument("--sleep", type=float, default=0.1)
p.add_argument("--fail-at", type=int, default=-1)
p.add_argument("--alloc-mb", type=int, default=0)
p.add_argument("--slow-commit", type=float, default=0.0)
p.add_argument("--beat", action="store_true", help="start the runtime's per-node liveness beat")
p.add_argument("--timer", action="store_true", help="time steps with StepTimer (the ranks' pace reaches the watcher)")
p.add_argument("--first-attempt-sleep", type=float, default=None,
               help="seconds per step on attempt 0 only (WMCTL_ATTEMPT): a slow first attempt a limit must stop")
p.add_argument("--hold-after-resume", type=float, default=0.0,
               help="seconds to wait after a resume before the first step (a test's window to act)")
p.add_argument("--hold", action="append", default=[], metavar="STEP:FILE",
               help="after STEP (and its checkpoint) every rank waits while FILE exists: a test's window")
args = p.parse_args()
holds = {int(step): path for step, path in (h.split(":", 1) for h in args.hold)}
if args.first_attempt_sleep is not None and os.environ.get("WMCTL_ATTEMPT") == "0":
    args.sleep = args.first_attempt_sleep

if os.environ.get("WORLD_SIZE") == "1" and not (args.beat or args.timer):
    # One rank alone has no collective to take part in, so it imports no torch: in the suite's
    # one-node tests (the watcher's behaviour, not a second node's) torch's import was half of
    # each attempt's CPU. The arithmetic is the same float64 either way (harness.counter_state).
    rank, world = 0, 1

    def all_max(x: float) -> float:
        return x

    def all_sum(x: float) -> float:
        return x

    def barrier() -> None:
        pass

    def leave() -> None:
        pass
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if args.beat:
        from orchestrator.runtime import liveness

        liveness.start()
    rank, world = dist.get_rank(), dist.get_world_size()

    def all_max(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def all_sum(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item()

    def barrier() -> None:
        dist.barrier()

    def leave() -> None:
        dist.destroy_process_group()
ckpt_dir = os.environ["WMCTL_CHECKPOINT_DIR"]
stop = {"flag": False}
signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("flag", True))
if args.alloc_mb:
    hog = bytearray(args.alloc_mb * 2**20)
    for i in range(0, len(hog), 4096):
        hog[i] = 1


def latest():
    best = None
    if os.path.isdir(ckpt_dir):
        for name in os.listdir(ckpt_dir):
            if name.startswith("step-") and os.path.exists(os.path.join(ckpt_dir, name, "COMMITTED")):
                step = int(name.split("-")[1])
                best = step if best is None or step > best else best
    return best


def save(step, state):
    d = os.path.join(ckpt_dir, f"step-{step:08d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"rank-{rank}.json"), "w") as fh:
        json.dump({"step": step, "state": state.hex()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    barrier()
    if rank == 0:
        time.sleep(args.slow_commit)
        tmp = os.path.join(d, "COMMITTED.tmp")
        with open(tmp, "w") as fh:
            fh.write("ok")
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, os.path.join(d, "COMMITTED"))
        emit_progress("checkpoint", step=step, path=d)
    barrier()


slow_host = os.environ.get("COUNTER_SLOW_HOST")
slow_s = (float(os.environ.get("COUNTER_SLOW_S", "0"))
          if slow_host and os.environ.get("WMCTL_NODE_NAME") == slow_host else 0.0)
timer = None
if args.timer:
    from orchestrator.runtime.timing import StepTimer

    timer = StepTimer()

state = 0.0
start = 0
found = latest()
if found is not None:
    with open(os.path.join(ckpt_dir, f"step-{found:08d}", f"rank-{rank}.json")) as fh:
        state = float.fromhex(json.load(fh)["state"])
    start = found
    if rank == 0:
        emit_progress("resume", step=start)
    time.sleep(args.hold_after_resume)
if rank == 0:
    emit_progress("start", world_size=world, attempt=os.environ.get("WMCTL_ATTEMPT"))

step = start
while step < args.steps:
    flag = 1.0 if stop["flag"] else 0.0
    if timer is not None:
        with timer.compute():          # this rank's own work: a slow machine's shows here
            time.sleep(slow_s)
        with timer.comm():             # the step's first collective: the time to reach it is the pace
            flag = all_max(flag)
    else:
        time.sleep(slow_s)
        flag = all_max(flag)
    if flag > 0:
        save(step, state)
        if rank == 0:
            emit_progress("preempted", step=step)
        sys.exit(PREEMPTED_EXIT_CODE)
    if step == args.fail_at and rank == world - 1:
        print("injected application error", file=sys.stderr, flush=True)
        sys.exit(1)
    contrib = all_sum(((step + 1) * 0.1 + rank) / 3.0)
    state = state * 0.999 + contrib
    step += 1
    time.sleep(args.sleep)
    if timer is not None:
        timer.end_step()
    if rank == 0:
        emit_progress("step", step=step, loss=state)
    if step % args.every == 0:
        save(step, state)
    while step in holds and os.path.exists(holds[step]):     # every rank: none waits in a collective
        time.sleep(0.05)

if rank == 0:
    with open(os.path.join(ckpt_dir, "final.txt"), "w") as fh:
        fh.write(state.hex())
    emit_progress("exit", status="completed", step=step)
leave()
