"""Checkpoint overhead on the example world model: sync vs async, and time to resume.

Prints figures, asserts nothing. One loop for every layout: the same training steps without
checkpoints, with sync and with async ones, ``--repeats`` times. Overhead is measured the
honest way: wall time with checkpoints every K steps minus wall time without, as a share of
the latter, so an async writer that competes with training for CPU is counted; the time the
loop was blocked in save() is printed as a share of step time too. Next to every sync run the
disk is measured (a plain write of the same bytes with fsync, every rank its own at once, and
one writer alone), and the sync save's throughput is given as a share of it. The disk of a
shared machine drifts (here 0.5-1.3 GB/s from one minute to the next), so the share is also
taken in ``--pairs`` pairs: after the same training steps, one sync save and one plain write of
the same bytes right after each other, in alternating order. Whatever writes first after the
steps is slower on the test machine (a plain write too: 1.2 s against 0.65 s), so the pairs
are compared like for like: saves that came first against writes that came first, and second
against second.

    PYTHONPATH=. python bench/bench_checkpoint.py                       # tiny default model
    PYTHONPATH=. python bench/bench_checkpoint.py --d-model 1024 --nhead 8 --layers 4   # report's sizes

With --fsdp the model is sharded with FSDP2 (fully_shard per layer) and the checkpoints are
sharded (torch.distributed.checkpoint), each rank writing its own shards. On CPU, under torchrun:

    PYTHONPATH=. torchrun --standalone --nproc-per-node 2 bench/bench_checkpoint.py --fsdp \
        --d-model 1024 --nhead 8 --layers 4 --steps 12 --every 4 --repeats 2

On one CUDA device, no torchrun (a process group of one rank, nccl; async saves stage to
pinned host memory):

    PYTHONPATH=. python bench/bench_checkpoint.py --device cuda --fsdp --d-model 1024 --nhead 8 \
        --layers 4 --batch-size 16 --steps 40 --every 10 --repeats 2

Imports only torch, the example and orchestrator.runtime (no docker, no kubernetes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
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
from orchestrator.runtime.protocol import ENV_TORCH_MODULE  # noqa: E402


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
    ap.add_argument("--pairs", type=int, default=8, help="sync save / plain write pairs for the paired share")
    ap.add_argument("--dir", default=None, help="checkpoint folder (default: a temp dir)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 with sharded checkpoints (under torchrun, or "
                    "--device cuda alone: one rank)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="cuda: train on the GPU (WMCTL_TORCH_MODULE=cuda); default: WMCTL_TORCH_MODULE or cpu")
    a = ap.parse_args()
    if a.device is not None:
        os.environ[ENV_TORCH_MODULE] = a.device
    distributed = init_process_group(a)
    rank, world = dist.rank(), dist.world_size()
    say = print if rank == 0 else (lambda *_a, **_k: None)
    work = Path(dist.broadcast_object(a.dir or (tempfile.mkdtemp(prefix="wmctl-bench-") if rank == 0 else None)))
    if rank == 0:
        ensure_dataset(work / "data", a.num_clips, a.frames, a.size, seed=0)
    dist.barrier()
    tr = Trainer(a, work / "data", fsdp=a.fsdp)
    say(f"{'FSDP2' if a.fsdp else 'full replica'} on {world} rank(s): d_model {a.d_model}, heads {a.nhead}, "
        f"layers {a.layers}, {tr.params() / 1e6:.2f} M params; clips {a.frames}x{a.size}x{a.size}, batch "
        f"{a.batch_size} per rank; device {tr.device}; torch {torch.__version__}, threads {torch.get_num_threads()}")
    run(tr, 2 if a.fsdp else 5, None)   # warm-up

    m = measure(tr, a, work)
    if rank == 0:
        report(a, m)
    if not distributed:
        resume_and_digest(a, tr, work, m.step_s)
    dist.barrier()
    if rank == 0 and a.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    if distributed:
        dist.destroy()


def init_process_group(a: argparse.Namespace) -> bool:
    """Under torchrun: its process group (gloo on CPU). --device cuda --fsdp without torchrun:
    a process group of one rank (nccl), which is all FSDP2's fully_shard needs. Else none."""
    if dist.init_from_env(backend="gloo" if dist.device_module() is None else None):
        return True
    if not a.fsdp:
        return False
    mod = dist.device_module()
    if mod is None:
        raise SystemExit("--fsdp on CPU: run under torchrun with 2 or more ranks (or pass --device cuda)")
    import socket

    import torch.distributed as tdist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mod.set_device(0)
    tdist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return True


@dataclass
class Measured:
    step_s: float = 0.0
    base: float = 0.0
    results: dict[str, list[tuple[float, list[float]]]] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)     # bytes each rank wrote into one checkpoint
    probes: list[float] = field(default_factory=list)       # seconds: every rank writes its bytes at once
    single: list[float] = field(default_factory=list)       # seconds: one writer, all the bytes
    hashing: list[float] = field(default_factory=list)      # seconds: every rank digests its bytes at once
    paired: list[tuple[float, float]] = field(default_factory=list)   # (sync save s, plain write s), side by side


def measure(tr: Trainer, a: argparse.Namespace, work: Path) -> Measured:
    """The same steps without checkpoints, with sync and with async ones, ``repeats`` times. The
    disk is measured next to every sync run (before and after it, the machine being shared):
    each rank writes as many bytes as it wrote into a checkpoint, plainly, with fsync, all at
    once, as a save does."""
    rank, world = dist.rank(), dist.world_size()
    m = Measured(results={"none": [], "sync": [], "async": []})
    for r in range(a.repeats):
        for mode in ("none", "sync", "async"):
            ck = work / f"ckpt-{mode}-{r}"
            mgr = None if mode == "none" else CheckpointManager(ck, keep=2, every_steps=a.every,
                                                                async_save=(mode == "async"))
            if mgr is not None:
                tr.register(mgr)
            if mode == "sync" and m.sizes:
                m.probes.append(disk_probe(work, m.sizes[rank]))
            dist.barrier()
            m.results[mode].append(run(tr, a.steps, mgr))
            dist.barrier()
            if mgr is not None:
                mgr.close()
            if mode == "sync":
                if not m.sizes:
                    m.sizes = dist.broadcast_object(checkpoint_bytes_by_rank(ck, world) if rank == 0 else None)
                m.probes.append(disk_probe(work, m.sizes[rank]))
                m.hashing.append(digest_probe(m.sizes[rank]))
                if rank == 0:
                    m.single.append(disk_probe(work, sum(m.sizes.values()), alone=True))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(ck, ignore_errors=True)
    m.base = statistics.median(t for t, _ in m.results["none"])
    m.step_s = m.base / a.steps
    m.paired = measure_pairs(tr, a, work, m.sizes[rank]) if a.pairs else []
    return m


def measure_pairs(tr: Trainer, a: argparse.Namespace, work: Path, nbytes: int) -> list[tuple[float, float]]:
    """``pairs`` times: ``every`` training steps (a save meets the machine as in the runs above),
    then a sync save and a plain write of this rank's bytes back to back (every rank at once,
    from a common start), the order alternating so that neither always meets the other's
    writeback. Rank 0's figures (its save waits for every rank's part before it commits)."""
    ck = work / "ckpt-pairs"
    mgr = CheckpointManager(ck, keep=2, every_steps=0)
    tr.register(mgr)
    out = []
    for i in range(a.pairs):
        for _ in range(a.every):
            tr.step()
        probe_first = i % 2 == 1
        if probe_first:
            probe = disk_probe(work, nbytes)
        dist.barrier()
        mgr.save((i + 1) * a.every)
        save = mgr.last_blocking_s
        mgr.wait()        # the checkpoint this save retired is deleted before anything else writes
        if not probe_first:
            probe = disk_probe(work, nbytes)
        out.append((save, probe))
    mgr.close()
    dist.barrier()
    if dist.rank() == 0:
        shutil.rmtree(ck, ignore_errors=True)
    return out


def disk_probe(work: Path, nbytes: int, alone: bool = False) -> float:
    """Seconds for a plain write of ``nbytes`` with fsync, by this rank (all ranks at once, timed
    from a common start to the last one done; or rank 0 ``alone``)."""
    if not alone:
        dist.barrier()
    path = work / f"disk-probe-{dist.rank()}.bin"
    chunk = bytes(64 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        left = nbytes
        while left > 0:
            fh.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    if not alone:
        dist.barrier()
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def digest_probe(nbytes: int) -> float:
    """Seconds for every rank at once to compute the integrity digest of ``nbytes`` in memory:
    the CPU a save spends on it besides writing (no disk involved)."""
    from orchestrator.runtime.checkpoint import new_hasher

    chunk = os.urandom(8 << 20)
    dist.barrier()
    t0 = time.perf_counter()
    h = new_hasher()
    for _ in range(max(1, nbytes // len(chunk))):
        h.update(chunk)
    h.hexdigest()
    dist.barrier()
    return time.perf_counter() - t0


def checkpoint_bytes_by_rank(root: Path, world: int) -> dict[int, int]:
    """Bytes each rank wrote into the newest checkpoint: its shard file(s) and rank file; rank 0
    also shared.pt (the whole model, unsharded), the DCP index and meta.json."""
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


def report(a: argparse.Namespace, m: Measured) -> None:
    spread = max(t for t, _ in m.results["none"]) / min(t for t, _ in m.results["none"]) - 1
    total = sum(m.sizes.values())
    print(f"step time (no checkpoints): {m.step_s * 1e3:.1f} ms; run-to-run spread {spread * 100:.1f} % (the noise "
          f"floor of the wall-clock figures); checkpoint every {a.every} steps ({a.steps // a.every} saves per run, "
          f"median of {a.repeats} runs)")
    print("bytes per rank: " + ", ".join(f"rank {r} {b / 1e6:.1f} MB" for r, b in sorted(m.sizes.items()))
          + f"; {total / 1e6:.1f} MB per checkpoint")
    for mode in ("sync", "async"):
        wall = statistics.median(t for t, _ in m.results[mode])
        blocks = [b for _, bl in m.results[mode] for b in bl]
        blocked = sum(blocks) / len(m.results[mode]) / m.base
        goal = " (goal <= 2 %)" if mode == "async" else ""
        # Each run's first save also builds what later ones reuse (async: the host copy, which
        # costs page faults once); the steady share is what a long run converges to.
        later = [b for _, bl in m.results[mode] for b in bl[1:]]
        steady = (f", {statistics.mean(later) / (a.every * m.step_s) * 100:.2f} % without each run's first save"
                  if later else "")
        print(f"{mode:>5}: the loop was blocked {blocked * 100:.2f} % of step time{steady}{goal}; wall-clock "
              f"overhead {(wall - m.base) / m.base * 100:+.2f} %; per save median "
              f"{statistics.median(blocks) * 1e3:.1f} ms, max {max(blocks) * 1e3:.1f} ms")
    save_s = statistics.median(b for _, bl in m.results["sync"] for b in bl)
    disk_s = statistics.median(m.probes)
    got, disk = total / save_s / 1e9, total / disk_s / 1e9
    lo, hi = total / max(m.probes) / 1e9, total / min(m.probes) / 1e9
    print(f"disk: a plain write + fsync of the same bytes, every rank its own at once: {disk:.2f} GB/s (median of "
          f"{len(m.probes)}, {lo:.2f}-{hi:.2f});"
          f" one writer, all {total / 1e6:.0f} MB: {total / statistics.median(m.single) / 1e9:.2f} GB/s")
    print(f"sync save in the runs: {got:.2f} GB/s ({total / 1e6:.1f} MB in {save_s:.2f} s, median): "
          f"{got / disk * 100:.0f} % of the plain writes measured between the runs (not at the same point of the "
          "loop; the pairs below are)")
    if len(m.paired) >= 2:
        # Pair i: the save came first after the training steps when i is even, the write when odd.
        first_save = statistics.median(save for save, _ in m.paired[0::2])
        first_write = statistics.median(probe for _, probe in m.paired[1::2])
        second_save = statistics.median(save for save, _ in m.paired[1::2])
        second_write = statistics.median(probe for _, probe in m.paired[0::2])
        print(f"sync save against a plain write of the same bytes, like for like ({len(m.paired)} pairs after the "
              f"same steps, order alternating): first after the steps, save {first_save:.2f} s and write "
              f"{first_write:.2f} s: {first_write / first_save * 100:.0f} % of the disk; second, save "
              f"{second_save:.2f} s and write {second_write:.2f} s: {second_write / second_save * 100:.0f} % "
              "(goal >= 50 %)")
        print("  pairs (save s, write s): " + ", ".join(f"({sv:.2f}, {pr:.2f})" for sv, pr in m.paired))
    from orchestrator.runtime.checkpoint import DIGEST_NAME

    hash_s = statistics.median(m.hashing)
    print(f"integrity digest ({DIGEST_NAME}) of the same bytes, every rank its own at once, in memory: {hash_s:.2f} s "
          f"({total / hash_s / 1e9:.2f} GB/s). A save hashes on a helper thread beside each write; with no core to "
          f"spare it adds up instead: write + digest one after the other would be "
          f"{total / (disk_s + hash_s) / 1e9:.2f} GB/s, {disk_s / (disk_s + hash_s) * 100:.0f} % of the disk")


def resume_and_digest(a: argparse.Namespace, tr: Trainer, work: Path, step_s: float) -> None:
    """One process: restore the newest checkpoint into a fresh trainer, then one step; and the
    integrity digest's share of a checkpoint's cost."""
    ck = work / "ckpt-resume"
    mgr = CheckpointManager(ck, keep=2, every_steps=a.every)
    tr.register(mgr)
    run(tr, a.every, mgr)
    size = sum(f.stat().st_size for f in (ck).rglob("*") if f.is_file())
    fresh = Trainer(a, work / "data")
    mgr2 = CheckpointManager(ck, keep=2)
    fresh.register(mgr2)
    t0 = time.perf_counter()
    state = mgr2.restore()
    t1 = time.perf_counter()
    fresh.step()
    t2 = time.perf_counter()
    assert state is not None
    print(f"resume from step {state.step} ({size / 1e6:.1f} MB on disk): restore {(t1 - t0) * 1e3:.1f} ms, "
          f"first resumed step {(t2 - t1) * 1e3:.1f} ms, total {(t2 - t0) * 1e3:.1f} ms")
    report_digest(state.path, step_s, a.every)


def report_digest(ckpt: Path, step_s: float, every: int) -> None:
    """The integrity digest's share: hashing a checkpoint's bytes (in memory, so no disk time is
    counted) is what the save adds while it writes and what restore adds to verify. A sync save
    blocks the loop for it; an async save pays it on the writer thread."""
    from orchestrator.runtime.checkpoint import DIGEST_NAME, new_hasher

    blobs = [f.read_bytes() for f in sorted(ckpt.rglob("*")) if f.is_file()]
    nbytes = sum(map(len, blobs))
    t0 = time.perf_counter()
    for blob in blobs:
        h = new_hasher()
        h.update(blob)
        h.hexdigest()
    seconds = time.perf_counter() - t0
    print(f"digest ({DIGEST_NAME}) of one checkpoint, {nbytes / 1e6:.1f} MB: {seconds * 1e3:.1f} ms "
          f"({nbytes / max(seconds, 1e-9) / 1e9:.2f} GB/s), {seconds / step_s * 100:.1f} % of one step, "
          f"{seconds / (every * step_s) * 100:.2f} % of step time at a save every {every} steps "
          "(inside the sync blocking figure above; on the writer thread with async)")


if __name__ == "__main__":
    main()
