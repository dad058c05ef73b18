"""Train the example world model, one process or under torchrun (DDP, or FSDP2 with --fsdp),
with exact resume.

    torchrun --standalone --nproc_per_node 2 examples/worldmodel/train.py \
        --batch_size 4 --gradient_accumulation_steps 8 --max_steps 300 --checkpoint-dir /tmp/ckpt

--fsdp shards the model (each transformer layer, then the whole) with FSDP2 ``fully_shard``
instead of replicating it: no rank holds it whole, and checkpoints are sharded (each rank writes
its own shards through torch.distributed.checkpoint). A sharded checkpoint also resumes on
fewer ranks (resharded; reported as not exact).

Resumes automatically from the newest complete checkpoint in the checkpoint folder. SIGTERM
(Kubernetes, docker stop, torchrun forwarding it) makes every rank save at the next optimizer
step and exit with code 83. Rank 0 prints ``WMCTL-PROGRESS {json}`` lines for the supervisor.

Test hooks (used by tests/runtime, harmless otherwise): --record-samples, --dump-final,
--fail-at-step, --sleep-per-step, --pause-at/--pause-file, --inject-nan-at, --sleep-before-restore.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterator

try:
    import orchestrator  # noqa: F401  (installed wmctl)
except ImportError:   # running from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.runtime.preemption import PreemptionHandler  # noqa: E402  (no torch: imports fast)

# Before torch is imported (seconds) and long before the restore: from here on a SIGTERM (a node
# drained during start-up) is a flag the job acts on, never a death by signal (exit -15).
EARLY_PREEMPTION = PreemptionHandler().install() if __name__ == "__main__" else None

import numpy as np  # noqa: E402
import torch  # noqa: E402

from orchestrator.runtime import determinism, dist  # noqa: E402
from orchestrator.runtime.checkpoint import CheckpointManager  # noqa: E402
from orchestrator.runtime.data import PreemptibleDataLoader, ResumableDistributedSampler  # noqa: E402
from orchestrator.runtime import preflight  # noqa: E402
from orchestrator.runtime.dtype_guard import DtypeGuard, agree_step_finite  # noqa: E402
from orchestrator.runtime.progress import Progress  # noqa: E402
from orchestrator.runtime.timing import StepTimer  # noqa: E402
from orchestrator.runtime.protocol import (ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_EVERY,  # noqa: E402
                                           ENV_CHECKPOINT_KEEP)

from data import ClipDataset, worker_init_fn  # noqa: E402
from make_data import ensure_dataset  # noqa: E402
from model import build_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    # data (the report: 96x96, 16 frames, batch 4, workers 8, prefetch 4, pin_memory)
    a("--data-dir", "--data_dir", default=os.environ.get("WMCTL_DATA_DIR", "data/worldmodel"))
    a("--num-clips", "--num_clips", type=int, default=256)
    a("--frames", type=int, default=16)
    a("--size", type=int, default=96)
    a("--cache-in-memory", "--cache_in_memory", action="store_true", help="load every clip into RAM first")
    a("--num-workers", "--num_workers", type=int, default=2)
    a("--prefetch-factor", "--prefetch_factor", type=int, default=4)
    a("--pin-memory", "--pin_memory", action="store_true", help="pin host memory (only used when a device exists)")
    a("--no-augment", "--no_augment", dest="augment", action="store_false",
      help="turn off the random flip + brightness per clip (drawn from the sample's own stream, so exact across resumes)")
    # model
    a("--vision-tower", "--vision_tower", choices=["conv", "llava"], default="conv")
    a("--vision-tower-path", "--vision_tower_path", default=None, help="local LLaVA / CLIP folder for --vision-tower llava")
    a("--d-model", "--d_model", type=int, default=64)
    a("--nhead", type=int, default=4)
    a("--layers", type=int, default=2)
    a("--fsdp", action="store_true",
      help="shard the model with FSDP2 fully_shard instead of DDP (needs torchrun); checkpoints are sharded")
    # optimisation
    a("--batch-size", "--batch_size", type=int, default=4)
    a("--gradient-accumulation-steps", "--gradient_accumulation_steps", type=int, default=1)
    a("--max-steps", "--max_steps", type=int, default=300)
    a("--lr", type=float, default=3e-4)
    a("--warmup-steps", "--warmup_steps", type=int, default=20)
    a("--seed", type=int, default=1234)
    a("--dtype", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
      help="auto: bf16 on a device that supports it, else fp32; steps down on NaN/inf")
    # checkpointing (flags win over the WMCTL_* environment the orchestrator sets)
    a("--checkpoint-dir", "--checkpoint_dir", default=os.environ.get(ENV_CHECKPOINT_DIR) or None)
    a("--checkpoint-every", "--checkpoint_every", type=int, default=int(os.environ.get(ENV_CHECKPOINT_EVERY) or 50))
    a("--checkpoint-keep", "--checkpoint_keep", type=int, default=int(os.environ.get(ENV_CHECKPOINT_KEEP) or 3))
    a("--async-checkpoint", "--async_checkpoint", action="store_true")
    a("--no-resume", "--no_resume", action="store_true", help="start fresh even if a checkpoint exists")
    a("--deterministic", action="store_true", default=determinism.requested(),
      help="deterministic kernels (default: $WMCTL_DETERMINISTIC): what a bit-exact resume needs on a device")
    # test hooks
    a("--dump-final", "--dump_final", default=None, help="rank 0 saves final params + optimizer state here")
    a("--record-samples", "--record_samples", default=None,
      help="append the sample indices each rank consumed to PATH.rank-N (JSON lines)")
    a("--fail-at-step", "--fail_at_step", type=int, default=None, help="test hook: rank 0 crashes after this step")
    a("--sleep-per-step", "--sleep_per_step", type=float, default=0.0, help="test hook: slow every step down")
    a("--pause-at", "--pause_at", default=None,
      help="test hook STEP:MICRO: rank 0 touches --pause-file and hangs before micro-batch MICRO of step STEP")
    a("--pause-file", "--pause_file", default=None)
    a("--sleep-before-restore", "--sleep_before_restore", type=float, default=0.0,
      help="test hook: a slow start-up (sleep just before restoring the checkpoint)")
    a("--inject-nan-at", "--inject_nan_at", default=None,
      help="test hook STEP:MICRO[:RANK]: that micro-batch's loss becomes NaN (on RANK only, default every rank)")
    args = ap.parse_args(argv)
    for name in ("batch_size", "gradient_accumulation_steps", "max_steps", "frames", "size", "num_clips"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.frames < 2:
        ap.error("--frames must be at least 2 (the model predicts the next frame)")
    if args.num_workers < 0:
        ap.error("--num_workers must be 0 or more")
    if args.pause_at and not args.pause_file:
        ap.error("--pause-at needs --pause-file")
    if args.inject_nan_at and not 2 <= len(args.inject_nan_at.split(":")) <= 3:
        ap.error("--inject-nan-at takes STEP:MICRO or STEP:MICRO:RANK")
    return args


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_lambda_factory(warmup: int, total: int):
    def lr_lambda(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return lr_lambda


def epoch_seed(seed: int, epoch: int) -> int:
    # The loader's generator only feeds the per-epoch worker base seed. Reseeding it from the
    # epoch makes that seed the same whether the epoch started fresh or from a checkpoint.
    return seed * 100_003 + epoch


def make_dtype_guard(choice: str, device_mod: Any) -> DtypeGuard:
    preferred = choice if choice != "auto" else ("bf16" if device_mod is not None else "fp32")
    return DtypeGuard(preferred=preferred, device_module=device_mod)


def shard_model(model: torch.nn.Module, distributed: bool) -> None:
    """FSDP2: every transformer layer is its own unit (gathered only while it computes), then
    the rest (projection, head, the frozen tower) as the root's. Every rank built the same
    weights from the same seed; each keeps its shard."""
    if not distributed:
        raise SystemExit("--fsdp needs a process group: run it under torchrun with 2 or more ranks")
    from torch.distributed.fsdp import fully_shard

    for layer in model.temporal.layers:   # type: ignore[union-attr]
        fully_shard(layer)
    fully_shard(model)


def batch_bytes(args: argparse.Namespace) -> int:
    """Bytes of one float32 batch of clips: what each prefetched batch costs in /dev/shm."""
    return args.batch_size * args.frames * 3 * args.size * args.size * 4


def main(argv: list[str] | None = None, preempt: PreemptionHandler | None = None) -> int:
    preempt = preempt or EARLY_PREEMPTION or PreemptionHandler().install()
    args = parse_args(argv)
    progress = Progress()
    if args.deterministic:
        done = determinism.enable()
        if dist.is_main():
            print("deterministic kernels: " + ", ".join(done), flush=True)
    device_mod = dist.device_module()
    guard = make_dtype_guard(args.dtype, device_mod)
    # Each node's local rank 0 checks devices, /dev/shm against these loader settings, and the
    # dtype, before anything slow; it stops the job only when no usable device exists (the job
    # would otherwise quietly train on the CPU).
    preflight.in_job(num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
                     batch_bytes=batch_bytes(args), dtype=guard.name, progress=progress)
    distributed = dist.init_from_env()
    rank, world = dist.rank(), dist.world_size()
    device = torch.device(dist.torch_module_name(), dist.local_rank()) if device_mod else torch.device("cpu")
    if device_mod is not None and hasattr(device_mod, "set_device"):
        device_mod.set_device(device)

    if rank == 0:
        ensure_dataset(args.data_dir, args.num_clips, args.frames, args.size, seed=args.seed)
    dist.barrier()
    dataset = ClipDataset(args.data_dir, cache_in_memory=args.cache_in_memory, augment=args.augment, seed=args.seed)

    # Same init on every rank (DDP also broadcasts rank 0's), then per-rank streams for dropout.
    seed_everything(args.seed)
    model = build_model(args.vision_tower, args.vision_tower_path, args.frames, args.d_model, args.nhead,
                        args.layers).to(device)
    seed_everything(args.seed + 7919 * rank)
    if args.fsdp:
        shard_model(model, distributed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(args.warmup_steps, args.max_steps))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed and not args.fsdp else model

    # (epoch, index) keys: the dataset seeds each sample's augmentation from them.
    sampler = ResumableDistributedSampler(len(dataset), seed=args.seed, yield_epoch=True)
    loader_gen = torch.Generator()
    loader_kw: dict[str, Any] = {}
    if args.num_workers > 0:
        loader_kw = {"prefetch_factor": args.prefetch_factor, "worker_init_fn": worker_init_fn}
    # Workers ignore the SIGTERM torchrun sends to the whole process group: a preemption must reach
    # the step boundary and checkpoint, not crash on "DataLoader worker ... killed by signal".
    loader = PreemptibleDataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                   num_workers=args.num_workers, pin_memory=args.pin_memory and device_mod is not None,
                                   generator=loader_gen, drop_last=False, **loader_kw)

    # Shares of the whole step; warns above 30 % communication or data wait (the field report's thresholds).
    timer = StepTimer(device_module=device_mod, warn_comm_share=0.30, warn_data_share=0.30)
    # fp16 (the guard's middle rung on devices) needs loss scaling; on CPU the ladder skips fp16.
    scaler = torch.amp.GradScaler(device.type) if device_mod is not None else None
    ckpt = None
    if args.checkpoint_dir:
        ckpt = CheckpointManager(args.checkpoint_dir, keep=args.checkpoint_keep, every_steps=args.checkpoint_every,
                                 async_save=args.async_checkpoint, progress=progress)
        # The loader too: the manager rebuilds its iterator (seeds, workers) before it restores
        # the RNG; an unregistered DataLoader would make every resume "not exact".
        ckpt.register(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, sampler=sampler,
                      generators={"loader": loader_gen}, loader=loader)

    progress.start(world_size=world, max_steps=args.max_steps, batch_size=args.batch_size,
                   gradient_accumulation_steps=args.gradient_accumulation_steps, num_workers=args.num_workers)
    step, samples = 0, 0
    if args.sleep_before_restore:
        time.sleep(args.sleep_before_restore)
    resumed = ckpt.restore() if ckpt is not None and not args.no_resume else None
    if resumed is not None:
        step, samples = resumed.step, resumed.samples
        # The precision the checkpointed run had stepped down to: the resumed run computes in it.
        guard_state = resumed.extra.get("dtype_guard") or resumed.extra.get("dtype")
        if guard_state:
            guard.load_state_dict(guard_state)
        progress.resume(step=step, path=str(resumed.path), epoch=sampler.epoch, samples=samples,
                        exact=resumed.exact, reason=resumed.reason, warnings=resumed.warnings)

    record = open(f"{args.record_samples}.rank-{rank}", "a", encoding="utf-8") if args.record_samples else None
    pause_at = tuple(int(x) for x in args.pause_at.split(":")) if args.pause_at else None
    nan_at = [int(x) for x in args.inject_nan_at.split(":")] if args.inject_nan_at else None
    attempt = os.environ.get(ENV_ATTEMPT, "")
    global_batch = args.batch_size * args.gradient_accumulation_steps * world

    def fresh_iterator() -> Iterator[Any]:
        loader_gen.manual_seed(epoch_seed(args.seed, sampler.epoch))
        return iter(loader)

    batches = fresh_iterator()

    def next_batch() -> Any:
        nonlocal batches
        while True:
            try:
                return next(batches)
            except StopIteration:
                sampler.set_epoch(sampler.epoch + 1)
                batches = fresh_iterator()

    ddp.train()
    status = "completed"
    # A SIGTERM during start-up: there is nothing new to save (the state is the checkpoint just
    # restored, or a fresh start), so every rank agrees and leaves as it would at a step boundary.
    stop_at_start = preempt.should_stop()
    if stop_at_start:
        progress.preempted(step=step, signal=preempt.received, during="start-up")
        status = "preempted"
    try:
        while not stop_at_start and step < args.max_steps:
            accum = args.gradient_accumulation_steps
            loss_sum = 0.0
            use_scaler = scaler is not None and guard.needs_grad_scaler
            for micro in range(accum):
                if pause_at and (step + 1, micro) == pause_at and rank == 0:
                    if ckpt is not None:
                        ckpt.wait()   # an async checkpoint in flight commits first
                    Path(args.pause_file).write_text(f"{step + 1}:{micro}\n")
                    while True:   # the test kills us here
                        time.sleep(3600)
                with timer.data():
                    clips, idx = next_batch()
                sampler.advance(len(idx))
                if record is not None:
                    record.write(json.dumps({"step": step + 1, "micro": micro, "epoch": sampler.epoch,
                                             "indices": idx.tolist(), "attempt": attempt}) + "\n")
                    record.flush()
                clips = clips.to(device, non_blocking=True)
                # DDP all-reduces in backward; skip that for all but the last micro-batch. The
                # timer compares that synchronising backward with the no_sync ones: the excess is
                # the communication the backward could not hide (see timing.py).
                sync = distributed and micro == accum - 1
                if args.fsdp:
                    # FSDP2's no_sync: keep the gradients unsharded until the last micro-batch.
                    model.set_requires_gradient_sync(sync)
                    sync_ctx: Any = contextlib.nullcontext()
                else:
                    sync_ctx = ddp.no_sync() if distributed and not sync else contextlib.nullcontext()
                with sync_ctx:
                    with timer.forward(), guard.autocast(device.type):
                        loss = ddp(clips) / accum
                    if nan_at and (step + 1, micro) == tuple(nan_at[:2]) and nan_at[2:] in ([], [rank]):
                        loss = loss * float("nan")   # test hook: one poisoned micro-batch
                    with timer.backward(sync=sync):
                        (scaler.scale(loss) if use_scaler else loss).backward()
                loss_sum += float(loss.detach())
            # Decided before optimizer.step(): a single NaN/inf applied to the weights poisons
            # every parameter for good. All ranks take the same decision (one all-reduce of the
            # loss and a gradient flag), so the replicas never diverge. Under a GradScaler inf
            # gradients are its normal overflow signal: it skips those steps itself.
            with timer.comm():
                finite, mean_loss, why = agree_step_finite(loss_sum, trainable, check_grads=not use_scaler)
            with timer.optimizer():
                if not finite:
                    optimizer.zero_grad(set_to_none=True)   # skip the update, keep the weights
                elif use_scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                # The schedule follows the step count whether or not the update was applied (as
                # with GradScaler's skipped steps), so a skip does not shift the rest of the run.
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            samples += global_batch
            timing = timer.end_step()
            # Same verdict on every rank, so all guards step down together.
            guard.observe(mean_loss if finite else float("nan"), reason=why or None)
            progress.step(step=step, loss=round(mean_loss, 6) if math.isfinite(mean_loss) else str(mean_loss),
                          samples=samples, timing=timing, epoch=sampler.epoch, dtype=guard.name,
                          **({} if finite else {"skipped": why}))
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
            extra = {"dtype": guard.name, "dtype_guard": guard.state_dict()}
            if ckpt is not None and ckpt.should_save(step):
                ckpt.save(step, epoch=sampler.epoch, samples=samples, extra=extra)
            if preempt.should_stop():
                if ckpt is not None:
                    ckpt.save(step, epoch=sampler.epoch, samples=samples, extra=extra, sync=True)
                progress.preempted(step=step, signal=preempt.received)
                status = "preempted"
                break
            if args.fail_at_step is not None and step == args.fail_at_step and rank == 0:
                raise RuntimeError(f"--fail-at-step {step}: injected failure")
    except BaseException:
        status = "failed"
        raise
    finally:
        if ckpt is not None and status != "failed":
            ckpt.close()
        if record is not None:
            record.close()
        progress.exit(status=status, step=step)

    if status == "preempted":
        batches = None   # shuts the DataLoader workers down
        # Leave at once: once one worker exits, torchrun SIGTERMs the others, and a rank still
        # shutting down must not die of it (exit code -15 instead of 83).
        preempt.exit_now()
    if args.dump_final and status == "completed" and args.fsdp:
        # Gathered whole on rank 0 (a collective: every rank takes part), optimizer state by name.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save({"model": msd, "optimizer": osd, "scheduler": scheduler.state_dict(), "step": step,
                        "dtype": guard.name}, args.dump_final)
    elif args.dump_final and status == "completed":
        # Rank 0 at PATH; the other ranks beside it, so tests can check the replicas agree.
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step, "dtype": guard.name},
                   args.dump_final if rank == 0 else f"{args.dump_final}.rank-{rank}")
    dist.barrier()
    preempt.uninstall()
    dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
