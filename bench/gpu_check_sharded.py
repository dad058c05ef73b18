"""Sharded checkpoints on a real CUDA device: save, reload, compare bit for bit.

Run by hand on a machine with a CUDA device (never in CI, which has none); one process, a
process group of one rank (nccl), FSDP2 ``fully_shard`` on the example world model:

    PYTHONPATH=. python bench/gpu_check_sharded.py

For each of a sync and an async save: train 3 steps (dropout draws from the CUDA generator),
save through CheckpointManager, record model, optimizer state and every RNG state, train 2 more
steps and record again. Then build the model anew from another seed, restore, and compare:
what restore gives must equal the state at the save, and 2 steps from it must equal the 2
steps of the uninterrupted run. The async save must have staged into pinned host memory.
One line per check; exit status 1 on any mismatch. ``--device cpu`` tries the script here
(gloo, no pinning). Imports torch, the example and orchestrator.runtime only.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "worldmodel"))
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dir", default=None, help="checkpoint folder (default: a temp dir)")
    a = ap.parse_args()
    from orchestrator.runtime.protocol import ENV_TORCH_MODULE

    os.environ[ENV_TORCH_MODULE] = a.device
    from orchestrator.runtime import determinism

    determinism.enable()            # before the first kernel: the 2 steps after a resume must repeat
    import torch

    # An op without a deterministic kernel warns (and may fail the 2-step check) instead of
    # stopping the script before it can compare what restore gave back.
    torch.use_deterministic_algorithms(True, warn_only=True)
    import torch.distributed as tdist

    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--device cpu tries the script on this machine)")
        return 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if a.device == "cuda":
        torch.cuda.set_device(0)
    tdist.init_process_group("nccl" if a.device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                             rank=0, world_size=1)
    root = Path(a.dir or tempfile.mkdtemp(prefix="wmctl-gpu-check-"))
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0) if a.device == 'cuda' else 'cpu'}; "
          f"checkpoints in {root}", flush=True)
    failed = 0
    for mode in ("sync", "async"):
        failed += check(mode, root / mode, torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu"))
    tdist.destroy_process_group()
    if a.dir is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print("all checks passed" if not failed else f"{failed} check(s) FAILED", flush=True)
    return 1 if failed else 0


class Job:
    """The example world model (small), FSDP2-sharded, AdamW, a scheduler; one step = a random
    batch from the device's generator, dropout on."""

    def __init__(self, seed: int, device: Any) -> None:
        import torch
        from model import build_model
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(seed)
        self.device = device
        self.model = build_model("conv", None, 8, 256, 4, 2).to(device)
        for layer in self.model.temporal.layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)

    def step(self) -> None:
        import torch

        clips = torch.randn(2, 8, 3, 32, 32, device=self.device)
        self.model(clips).backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def state(self) -> dict[str, Any]:
        """Every bit a resume must give back, on the host: this rank's shards of model and
        optimizer (DTensor -> local), the schedule, and the CPU and device RNG states."""
        import torch

        from orchestrator.runtime.checkpoint_sharded import local_tensor

        def host(t: Any) -> Any:
            return local_tensor(t).detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t

        out: dict[str, Any] = {f"model.{k}": host(v) for k, v in self.model.state_dict().items()}
        for i, st in enumerate(self.opt.state.values()):
            out.update({f"optim.{i}.{k}": host(v) for k, v in st.items()})
        out["lr"] = [g["lr"] for g in self.opt.param_groups]
        out["rng.cpu"] = torch.get_rng_state()
        if self.device.type == "cuda":
            out["rng.cuda"] = torch.cuda.get_rng_state()
        return out


def same(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None when equal bit for bit, else the first difference."""
    import torch

    if a.keys() != b.keys():
        return f"different entries: {sorted(set(a) ^ set(b))[:5]}"
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            # Bits, not values: NaN != NaN, and -0.0 == 0.0.
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y)):
                return f"{k} differs"
        elif x != y:
            return f"{k} differs ({x} != {y})"
    return None


def bits(t: Any) -> Any:
    return t.reshape(-1).view(__import__("torch").uint8)


def check(mode: str, root: Path, device: Any) -> int:
    from orchestrator.runtime.checkpoint import CheckpointManager

    job = Job(0, device)
    mgr = CheckpointManager(root, keep=2, async_save=(mode == "async"))
    mgr.register(model=job.model, optimizer=job.opt, scheduler=job.sched)
    for _ in range(3):
        job.step()
    at_save = job.state()
    mgr.save(3)
    pinned = mgr._sharded.staged_pinned() if mgr._sharded is not None else None
    for _ in range(2):              # changes the weights while an async save may still be writing
        job.step()
    mgr.wait()
    after = job.state()
    mgr.close()

    fresh = Job(1, device)
    mgr2 = CheckpointManager(root, keep=2)
    mgr2.register(model=fresh.model, optimizer=fresh.opt, scheduler=fresh.sched)
    moved = same(fresh.state(), at_save)
    state = mgr2.restore()
    got = fresh.state()
    restored = same(got, at_save) if state is not None else "nothing restored"
    for _ in range(2):
        fresh.step()
    resumed = same(fresh.state(), after)
    mgr2.close()

    failures = 0
    lines = [("restore gives the state at the save (model, optimizer, schedule, CPU and CUDA RNG)", restored),
             ("2 steps after the resume equal 2 steps of the uninterrupted run", resumed)]
    if mode == "async" and device.type == "cuda":
        lines.append(("async save staged into pinned host memory", None if pinned else f"pinned: {pinned}"))
    print(f"{mode}: saved step 3 to {state.path if state else root}; a fresh model differed before restore: "
          f"{moved is not None}", flush=True)
    for what, err in lines:
        print(f"  {'ok  ' if err is None else 'FAIL'} {what}{'' if err is None else ': ' + err}", flush=True)
        failures += err is not None
    return failures


if __name__ == "__main__":
    sys.exit(main())
