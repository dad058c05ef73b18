"""Checkpoint overhead on the example world model: sync vs async, and time to resume.

Prints figures, asserts nothing. One process on this machine's CPU (or the device named by
WMCTL_TORCH_MODULE). Overhead is measured the honest way: wall time of the same training steps
with checkpoints every K steps minus wall time without, as a share of the latter; so an async
writer that competes with training for CPU is counted. Blocking time per save is printed too.

    PYTHONPATH=. python bench/bench_checkpoint.py                       # tiny default model
    PYTHONPATH=. python bench/bench_checkpoint.py --d-model 1024 --nhead 8 --layers 4   # report's sizes

With --fsdp, under torchrun, the model is sharded with FSDP2 (fully_shard per layer) and the
checkpoints are sharded (torch.distributed.checkpoint): sync and async blocking as a share of
step time, bytes each rank writes, and the sync save's throughput against a plain write of the
same bytes with fsync on this machine (its disk bandwidth):

    PYTHONPATH=. torchrun --standalone --nproc-per-node 2 bench/bench_checkpoint.py --fsdp \
        --d-model 1024 --nhead 8 --layers 4 --steps 12 --every 4 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "worldmodel"))
sys.path.insert(0, str(REPO))

from data import ClipDataset  # noqa: E402
from make_data import ensure_dataset  # noqa: E402
from model import build_model  # noqa: E402

from orchestrator.runtime import dist  # noqa: E402
from orchestrator.runtime.checkpoint import CheckpointManager  # noqa: E402
from orchestrator.runtime.data import ResumableDistributedSampler  # noqa: E402


class Trainer:
    def __init__(self, a: argparse.Namespace, data_dir: Path, fsdp: bool = False) -> None:
        torch.manual_seed(0)
        mod = dist.device_module()
        self.device = torch.device(dist.torch_module_name(), dist.local_rank()) if mod else torch.device("cpu")
        self.sync = mod.synchronize if mod is not None and hasattr(mod, "synchronize") else (lambda: None)
        self.model = build_model("conv", None, a.frames, a.d_model, a.nhead, a.layers).to(self.device)
        self.params_total = sum(p.numel() for p in self.model.parameters())
        if fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in self.model.temporal.layers:
                fully_shard(layer)
            fully_shard(self.model)
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-4)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.ds = ClipDataset(data_dir, cache_in_memory=True)
        self.sampler = ResumableDistributedSampler(len(self.ds), num_replicas=dist.world_size(), rank=dist.rank())
        self.batch = a.batch_size
        self.gen = torch.Generator().manual_seed(1)

    def register(self, mgr: CheckpointManager) -> None:
        mgr.register(model=self.model, optimizer=self.opt, scheduler=self.sched, sampler=self.sampler,
                     generators={"loader": self.gen})

    def step(self) -> None:
        if self.sampler.exhausted:
            self.sampler.set_epoch(self.sampler.epoch + 1)
        idx = list(self.sampler)[: self.batch]
        clips = torch.stack([self.ds[i][0] for i in idx]).to(self.device)
        self.sampler.advance(len(idx))
        loss = self.model(clips)
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.sync()

    def params(self) -> int:
        return self.params_total


def run(tr: Trainer, steps: int, mgr: CheckpointManager | None) -> tuple[float, list[float]]:
    blocking = []
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        tr.step()
        if mgr is not None and mgr.should_save(s):
            mgr.save(s)
            blocking.append(mgr.last_blocking_s)
    if mgr is not None:
        mgr.wait()
    return time.perf_counter() - t0, blocking


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--num-clips", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--nhead", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=20, help="checkpoint interval in steps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="checkpoint folder (default: a temp dir)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 with sharded checkpoints (run under torchrun)")
    a = ap.parse_args()
    if a.fsdp:
        bench_fsdp(a)
        return

    work = Path(a.dir or tempfile.mkdtemp(prefix="wmctl-bench-"))
    data_dir = ensure_dataset(work / "data", a.num_clips, a.frames, a.size, seed=0)
    tr = Trainer(a, data_dir)
    print(f"model: d_model {a.d_model}, heads {a.nhead}, layers {a.layers}, {tr.params() / 1e6:.2f} M params; "
          f"clips {a.frames}x{a.size}x{a.size}, batch {a.batch_size}; device {tr.device}; "
          f"torch threads {torch.get_num_threads()}")
    run(tr, 5, None)   # warm-up

    results: dict[str, list[tuple[float, list[float]]]] = {"none": [], "sync": [], "async": []}
    for r in range(a.repeats):
        for mode in ("none", "sync", "async"):
            ck = work / f"ckpt-{mode}-{r}"
            mgr = None if mode == "none" else CheckpointManager(ck, keep=2, every_steps=a.every,
                                                                async_save=(mode == "async"))
            if mgr is not None:
                tr.register(mgr)
            results[mode].append(run(tr, a.steps, mgr))
            shutil.rmtree(ck, ignore_errors=True)

    base = statistics.median(t for t, _ in results["none"])
    spread = max(t for t, _ in results["none"]) / min(t for t, _ in results["none"]) - 1
    print(f"run-to-run spread without checkpoints: {spread * 100:.1f} % (noise floor of the wall-clock figures)")
    step_s = base / a.steps
    print(f"step time (no checkpoints): {step_s * 1e3:.2f} ms; checkpoint every {a.every} steps "
          f"({a.steps // a.every} saves per run, median of {a.repeats} runs)")
    for mode in ("sync", "async"):
        wall = statistics.median(t for t, _ in results[mode])
        blocks = [b for _, bl in results[mode] for b in bl]
        share = (wall - base) / base
        blocked = sum(blocks) / len(results[mode]) / base
        print(f"{mode:>5}: wall-clock overhead {share * 100:+.2f} %, time the loop was blocked "
              f"{blocked * 100:.2f} % of step time (target <= 5 %); per save median "
              f"{statistics.median(blocks) * 1e3:.1f} ms, max {max(blocks) * 1e3:.1f} ms")

    # Resume: restore the newest checkpoint into a fresh trainer, then one step.
    ck = work / "ckpt-resume"
    mgr = CheckpointManager(ck, keep=2, every_steps=a.every)
    tr.register(mgr)
    run(tr, a.every, mgr)
    size = sum(f.stat().st_size for f in (ck).rglob("*") if f.is_file())
    fresh = Trainer(a, data_dir)
    mgr2 = CheckpointManager(ck, keep=2)
    fresh.register(mgr2)
    t0 = time.perf_counter()
    state = mgr2.restore()
    t1 = time.perf_counter()
    fresh.step()
    t2 = time.perf_counter()
    print(f"resume from step {state.step} ({size / 1e6:.1f} MB on disk): restore {(t1 - t0) * 1e3:.1f} ms, "
          f"first resumed step {(t2 - t1) * 1e3:.1f} ms, total {(t2 - t0) * 1e3:.1f} ms")
    report_digest(state.path, step_s, a.every)
    if a.dir is None:
        shutil.rmtree(work, ignore_errors=True)


def report_digest(ckpt: Path, step_s: float, every: int) -> None:
    """The integrity digest's share: hashing a checkpoint's bytes (in memory, so no disk time is
    counted) is what the save adds while it writes and what restore adds to verify. A sync save
    blocks the loop for it; an async save pays it on the writer thread."""
    from orchestrator.runtime.checkpoint import DIGEST_NAME, _hasher

    blobs = [f.read_bytes() for f in sorted(ckpt.rglob("*")) if f.is_file()]
    nbytes = sum(map(len, blobs))
    t0 = time.perf_counter()
    for blob in blobs:
        h = _hasher()
        h.update(blob)
        h.hexdigest()
    seconds = time.perf_counter() - t0
    print(f"digest ({DIGEST_NAME}) of one checkpoint, {nbytes / 1e6:.1f} MB: {seconds * 1e3:.1f} ms "
          f"({nbytes / max(seconds, 1e-9) / 1e9:.2f} GB/s), {seconds / step_s * 100:.1f} % of one step, "
          f"{seconds / (every * step_s) * 100:.2f} % of step time at a save every {every} steps "
          "(inside the sync blocking figure above; on the writer thread with async)")


def disk_write_gbps(path: Path, nbytes: int) -> float:
    """This machine's bandwidth for a plain write of ``nbytes`` with fsync (what a save competes with)."""
    chunk = bytes(64 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        left = nbytes
        while left > 0:
            fh.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return nbytes / seconds / 1e9


def bench_fsdp(a: argparse.Namespace) -> None:
    """Every rank runs the same loop; rank 0 prints. The checkpoint folder is rank 0's temp dir."""
    if not dist.init_from_env(backend="gloo"):
        raise SystemExit("--fsdp: run under torchrun with 2 or more ranks")
    rank, world = dist.rank(), dist.world_size()
    work = Path(dist.broadcast_object(a.dir or (tempfile.mkdtemp(prefix="wmctl-bench-") if rank == 0 else None)))
    if rank == 0:
        ensure_dataset(work / "data", a.num_clips, a.frames, a.size, seed=0)
    dist.barrier()
    tr = Trainer(a, work / "data", fsdp=True)
    say = print if rank == 0 else (lambda *_a, **_k: None)
    say(f"FSDP2 on {world} ranks: d_model {a.d_model}, heads {a.nhead}, layers {a.layers}, "
        f"{tr.params() / 1e6:.2f} M params; clips {a.frames}x{a.size}x{a.size}, batch {a.batch_size} per rank; "
        f"device {tr.device}; torch threads {torch.get_num_threads()}")
    run(tr, 2, None)   # warm-up

    results: dict[str, list[tuple[float, list[float]]]] = {"none": [], "sync": [], "async": []}
    sizes: dict[int, int] = {}
    for r in range(a.repeats):
        for mode in ("none", "sync", "async"):
            ck = work / f"ckpt-{mode}-{r}"
            mgr = None if mode == "none" else CheckpointManager(ck, keep=2, every_steps=a.every,
                                                                async_save=(mode == "async"))
            if mgr is not None:
                tr.register(mgr)
            dist.barrier()
            results[mode].append(run(tr, a.steps, mgr))
            dist.barrier()
            if mgr is not None:
                mgr.close()
            if mode == "sync" and rank == 0 and not sizes:
                sizes = checkpoint_bytes_by_rank(ck, world)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(ck, ignore_errors=True)
    if rank == 0:
        report_fsdp(a, results, sizes, work)
    dist.barrier()
    if rank == 0 and a.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    dist.destroy()


def checkpoint_bytes_by_rank(root: Path, world: int) -> dict[int, int]:
    """Bytes each rank wrote into the newest checkpoint: its shard file(s) and rank file; rank 0
    also the DCP index, shared.pt and meta.json."""
    from orchestrator.runtime.checkpoint import latest_complete, read_marker

    newest = latest_complete(root)
    assert newest is not None
    files = (read_marker(newest.path) or {})["files"]
    out = {r: 0 for r in range(world)}
    for name, size in files.items():
        base = name.rsplit("/", 1)[-1]
        if base.startswith("__"):
            out[int(base[2:].split("_")[0])] += size
        elif base.startswith("rank-"):
            out[int(base[5:10])] += size
        else:
            out[0] += size
    return out


def report_fsdp(a: argparse.Namespace, results: dict[str, list[tuple[float, list[float]]]],
                sizes: dict[int, int], work: Path) -> None:
    base = statistics.median(t for t, _ in results["none"])
    step_s = base / a.steps
    total = sum(sizes.values())
    print(f"step time (no checkpoints): {step_s * 1e3:.1f} ms; checkpoint every {a.every} steps "
          f"({a.steps // a.every} saves per run, median of {a.repeats} runs)")
    print("bytes per rank: " + ", ".join(f"rank {r} {b / 1e6:.1f} MB" for r, b in sorted(sizes.items()))
          + f"; {total / 1e6:.1f} MB per checkpoint")
    sync_saves = []
    for mode in ("sync", "async"):
        wall = statistics.median(t for t, _ in results[mode])
        blocks = [b for _, bl in results[mode] for b in bl]
        blocked = sum(blocks) / len(results[mode]) / base
        if mode == "sync":
            sync_saves = blocks
        print(f"{mode:>5}: time the loop was blocked {blocked * 100:.2f} % of step time "
              f"(goal: async <= 2 %); wall-clock overhead {(wall - base) / base * 100:+.2f} %; per save median "
              f"{statistics.median(blocks) * 1e3:.1f} ms, max {max(blocks) * 1e3:.1f} ms")
    save_s = statistics.median(sync_saves)
    disk = disk_write_gbps(work / "disk-probe.bin", total)
    got = total / save_s / 1e9
    print(f"sync save throughput {got:.2f} GB/s ({total / 1e6:.1f} MB in {save_s:.2f} s, every rank writing its "
          f"own shards) vs a plain write of the same bytes with fsync {disk:.2f} GB/s: {got / disk * 100:.0f} % "
          "of this disk's bandwidth (goal >= 50 %)")


if __name__ == "__main__":
    main()
