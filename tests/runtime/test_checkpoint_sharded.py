"""Sharded checkpoints of FSDP models (torch.distributed.checkpoint), real gloo ranks on CPU.

Each test runs RANKS as plain processes of one gloo group: a tiny FSDP model (fully_shard, or
FSDP1) with AdamW, a scheduler, a sampler and a private generator. ``save`` trains 2 steps,
saves, trains 2 more, saves step 4 (sync or async), then trains on for 2 steps, recording the
full state at step 4 and step 6. ``resume`` starts from different weights, restores, records
the state it got, trains 2 steps and records again: equal to the uninterrupted step 6 is a
bit-exact resume.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.runtime.checkpoint import (COMMIT_MARKER, file_digest, read_marker,
                                             step_dir_name, verify_checkpoint)
from tests.runtime.conftest import committed_step, run_gloo_ranks

RANKS = textwrap.dedent('''
    import json, random, sys
    import numpy as np
    import torch
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from orchestrator.runtime import dist
    from orchestrator.runtime.checkpoint import CheckpointError, CheckpointManager
    from orchestrator.runtime.data import ResumableDistributedSampler
    from orchestrator.runtime.progress import Progress

    root, phase, mode, fsdp, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_from_env(backend="gloo")
    rank, world = dist.rank(), dist.world_size()
    torch.manual_seed(0 if phase == "save" else 123)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Dropout(0.3), torch.nn.Linear(10, 3))
    if fsdp == "2":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
    elif fsdp == "1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sampler = ResumableDistributedSampler(64, seed=5)
    gen = torch.Generator().manual_seed(99 + rank)
    random.seed(rank); np.random.seed(rank); torch.manual_seed(1000 + rank)

    def step():
        x = torch.randn(4, 6) + torch.rand(1, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step(); sched.step(); opt.zero_grad()
        sampler.advance(2)

    def full():
        """The whole state as plain lists (collective); and this rank's next random draws."""
        if fsdp == "0":
            msd, osd = model.state_dict(), opt.state_dict()
        else:
            msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        flat = {k: v.detach().flatten().tolist() for k, v in msd.items()}
        ost = {str(k): {n: t.flatten().tolist() for n, t in s.items()} for k, s in osd["state"].items()}
        return {"model": flat, "opt": ost, "lr": [g["lr"] for g in osd["param_groups"]],
                "sched": sched.state_dict(), "sampler": sampler.state_dict()}

    def draws():
        return [torch.rand(2).tolist(), torch.rand(2, generator=gen).tolist(), random.random(), float(np.random.rand())]

    mgr = CheckpointManager(root, keep=3, async_save=(mode == "async"), progress=Progress(enabled=rank == 0))
    mgr.register(model=model, optimizer=opt, scheduler=sched, sampler=sampler, generators={"g": gen})
    rec = {"rank": rank}
    if phase == "save":
        for _ in range(2):
            step()
        mgr.save(2)
        for _ in range(2):
            step()
        rec["at4"] = full()               # no random draws: the RNG streams go on untouched
        rec["remaining4"] = list(iter(sampler))
        mgr.save(4)
        for _ in range(2):   # changes the weights while an async save may still be writing
            step()
        mgr.wait()
        tdist.barrier()
        rec["crc_option"] = torch.serialization.get_crc32_options()
        rec["at6"] = full()
        rec["draws6"] = draws()
    else:
        rec["fresh"] = {k: v.tolist() for k, v in model.state_dict().items()} if fsdp == "0" else None
        try:
            state = mgr.restore()
        except CheckpointError as err:
            rec["error"] = str(err)
            state = None
        if state is not None:
            rec.update(step=state.step, exact=state.exact, reason=state.reason, warnings=state.warnings)
            rec["at_resume"] = full()
            rec["remaining"] = list(iter(sampler))
        if state is not None and state.exact:
            for _ in range(2):
                step()
            rec["at6"] = full()
            rec["draws6"] = draws()
    mgr.close()
    tdist.barrier()
    print(json.dumps(rec))
    dist.destroy()
    # What the test checks is done and printed. Interpreter teardown of a gloo + DCP process in
    # torch 2.13 now and then ends in "terminate called without an active exception" (a C++
    # thread object destroyed at exit, seen once in CI on the 4 -> 2 reshard): not this test's
    # subject, so the process leaves without it.
    sys.stdout.flush(), sys.stderr.flush()
    import os
    os._exit(0)
''')


def run(tmp_path: Path, phase: str, mode: str = "sync", fsdp: str = "2", world: int = 2) -> list[dict]:
    done = run_gloo_ranks(RANKS, tmp_path, str(tmp_path / "ckpt"), phase, mode, fsdp, "-", world=world)
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    return [json.loads(p.stdout.splitlines()[-1]) for p in done]


def zip_crcs(ckpt: Path) -> list[int]:
    """The CRC32 field of every zip record torch.save wrote into a checkpoint: its .pt files,
    and each item DCP wrote into a shard file (found through DCP's own index of offsets)."""
    import io
    import zipfile

    from torch.distributed.checkpoint import FileSystemReader

    def records(blob: bytes) -> list[int]:
        return [info.CRC for info in zipfile.ZipFile(io.BytesIO(blob)).infolist()]

    out = [crc for pt in sorted(ckpt.glob("*.pt")) for crc in records(pt.read_bytes())]
    for item in FileSystemReader(str(ckpt / "dcp")).read_metadata().storage_data.values():
        data = (ckpt / "dcp" / item.relative_path).read_bytes()
        out += records(data[item.offset:item.offset + item.length])
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "fsdp"), [("sync", "2"), ("async", "2"), ("sync", "1")],
                         ids=["fsdp2-sync", "fsdp2-async", "fsdp1-sync"])
def test_sharded_save_and_resume_are_bit_exact(tmp_path: Path, mode: str, fsdp: str) -> None:
    saved = run(tmp_path, "save", mode, fsdp)
    ckpt = tmp_path / "ckpt" / step_dir_name(4)
    marker = read_marker(ckpt)
    assert marker is not None and marker["format"] == 2 and marker["world_size"] == 2
    # One marker format: the shards are listed and digested like every other file.
    shards = sorted(n for n in marker["files"] if n.startswith("dcp/"))
    assert shards == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"], marker["files"]
    assert set(marker["digests"]) == set(marker["files"]) >= {"shared.pt", "meta.json", "rank-00000.pt",
                                                                 "rank-00001.pt"}
    assert all(marker["digests"][n] == file_digest(ckpt / n) for n in marker["files"])
    assert verify_checkpoint(ckpt) is None
    assert json.loads((ckpt / "meta.json").read_text())["layout"] == "dcp"
    import torch

    shared = torch.load(ckpt / "shared.pt", weights_only=False)
    assert set(shared) == {"scheduler"}   # model and optimizer live in the shards only
    # A sync save skips torch.save's zip CRC32 (the digest covers every byte); an async save,
    # whose writer runs beside the training code, leaves torch's process-wide option alone.
    crcs = zip_crcs(ckpt)
    assert len(crcs) > 20 and (set(crcs) == {0} if mode == "sync" else 0 not in crcs), crcs
    assert all(r["crc_option"] is True for r in saved)       # set back once the save ended

    got = run(tmp_path, "resume", mode, fsdp)
    for before, after in zip(saved, got, strict=True):
        assert after["step"] == 4 and after["exact"] and after["reason"] == ""
        assert after["at_resume"] == before["at4"]           # weights, optimizer, scheduler, sampler
        assert after["remaining"] == before["remaining4"]
        assert after["at6"] == before["at6"]                 # two more steps: dropout RNG, generator
        assert after["draws6"] == before["draws6"]           # and every RNG stream after them
    # Sanity of the comparison: the two ranks hold different RNG streams and the steps moved the weights.
    assert saved[0]["draws6"] != saved[1]["draws6"] and saved[0]["at4"]["model"] != saved[0]["at6"]["model"]


@pytest.mark.timeout(300)
def test_a_torn_or_changed_shard_never_counts(tmp_path: Path) -> None:
    run(tmp_path, "save")
    root = tmp_path / "ckpt"
    shard = root / step_dir_name(4) / "dcp" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])            # torn: half of rank 1's shards
    assert committed_step(root) == 2               # discovery from outside skips it already
    got = run(tmp_path, "resume")
    assert [r["step"] for r in got] == [2, 2]
    assert all(any("was damaged: fell back" in w for w in r["warnings"]) for r in got)
    assert got[0]["at_resume"]["sched"]["last_epoch"] == 2
    # Same size, one flipped bit (the step 2 checkpoint now): its digest gives it away.
    two = root / step_dir_name(2) / "dcp" / "__0_0.distcp"
    raw = bytearray(two.read_bytes())
    raw[len(raw) // 2] ^= 0x08
    two.write_bytes(bytes(raw))
    assert "dcp/__0_0.distcp content changed" in (verify_checkpoint(two.parent.parent) or "")
    # The restoring ranks share the shards' digests out (rank 1 reads this one) and all refuse.
    done = run_gloo_ranks(RANKS, tmp_path, str(root), "resume", "sync", "2", "-")
    got = [json.loads(p.stdout.splitlines()[-1]) for p in done]
    assert all("error" in r and "every committed checkpoint" in r["error"] for r in got), got
    assert "rank 1 cannot load it: dcp/__0_0.distcp content changed" in done[1].stderr


@pytest.mark.timeout(300)
def test_four_ranks_resume_on_two_resharded_and_reported_not_exact(tmp_path: Path) -> None:
    saved = run(tmp_path, "save", world=4)
    got = run(tmp_path, "reshard", world=2)
    for r in got:
        assert r["step"] == 4 and r["exact"] is False
        assert r["reason"] == "world size changed from 4 to 2"
        assert any("resharded by torch.distributed.checkpoint" in w for w in r["warnings"])
        # The same weights, optimizer state and schedule, now in two shards instead of four.
        assert r["at_resume"]["model"] == saved[0]["at4"]["model"]
        assert r["at_resume"]["opt"] == saved[0]["at4"]["opt"]
        assert r["at_resume"]["lr"] == saved[0]["at4"]["lr"]
    # The sampler continues: what two ranks have left is what four had left, nothing repeated.
    left4 = sorted(i for r in saved for i in r["remaining4"])
    left2 = sorted(i for r in got for i in r["remaining"])
    assert left2 == left4 and len(left2) == 64 - 4 * 8


@pytest.mark.timeout(300)
def test_a_layout_that_does_not_fit_the_model_is_refused_with_the_fix(tmp_path: Path) -> None:
    run(tmp_path, "save", fsdp="2")
    got = run(tmp_path, "resume", fsdp="0")
    assert all("holds FSDP shards" in r["error"] and "fully_shard" in r["error"] for r in got), got
    assert (tmp_path / "ckpt" / step_dir_name(4) / COMMIT_MARKER).exists()   # refused, not skipped as damaged


# A periodic async sharded save of step 2 whose commit rank 0 holds back, then the preemption
# save of step 3 (sync, as the example does on SIGTERM): it waits for step 2's DCP write and
# commit first (one save in flight at most), and every rank leaves it with both committed.
PREEMPT = textwrap.dedent('''
    import json, sys
    import torch
    from torch.distributed.fsdp import fully_shard
    from orchestrator.runtime import dist
    from orchestrator.runtime.checkpoint import CheckpointManager, is_committed
    dist.init_from_env(backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    def step():
        model(torch.randn(3, 4)).sum().backward(); opt.step(); opt.zero_grad()
    m = CheckpointManager(sys.argv[1], async_save=True)
    m.register(model=model, optimizer=opt)
    step(); step()
    two = m.save(2)
    in_flight = m._sharded.in_flight() or m._thread is not None
    pinned = m._sharded.staged_pinned()      # staged, in plain host memory without CUDA
    step()
    three = m.save(3, sync=True)
    print(json.dumps({"rank": dist.rank(), "in_flight": in_flight, "two": is_committed(two),
                      "three": is_committed(three), "blocking": m.last_blocking_s, "pinned": pinned}), flush=True)
    m.close()
    dist.barrier()
    dist.destroy()
''')


@pytest.mark.timeout(180)
def test_the_preemption_save_waits_for_the_sharded_async_save_in_flight(tmp_path: Path) -> None:
    done = run_gloo_ranks(PREEMPT, tmp_path, str(tmp_path / "ckpt"), env={"WMCTL_TEST_SLEEP_BEFORE_COMMIT": "2:3"})
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    results = [json.loads(p.stdout.splitlines()[-1]) for p in done]
    assert all(r["in_flight"] and r["two"] and r["three"] and r["blocking"] > 0 for r in results), results
    assert all(r["pinned"] is False for r in results), results      # CPU: the clean fallback
    assert verify_checkpoint(tmp_path / "ckpt" / step_dir_name(2)) is None
    assert verify_checkpoint(tmp_path / "ckpt" / step_dir_name(3)) is None


def test_a_shard_load_that_dcp_refuses_is_a_damaged_checkpoint_not_a_crash(tmp_path: Path) -> None:
    """DCP reports a failed load as CheckpointException, a BaseException: it must be read as this
    checkpoint being unusable (restore falls back past it), not escape as an uncaught exception."""
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from orchestrator.runtime.checkpoint import CheckpointManager

    class RefusingShards:
        def load(self, folder: Path) -> dict:
            raise CheckpointException("load failed", {1: (ValueError("size mismatch for layers.0.w"),
                                                          traceback.StackSummary())})

    mgr = CheckpointManager(tmp_path / "ckpt")
    mgr._sharded = RefusingShards()      # type: ignore[assignment]  # the DCP path without a process group
    loaded, why = mgr._load_shards(tmp_path / "ckpt" / "step-00000004")
    assert loaded is None and why is not None and why.startswith("CheckpointException")


def test_the_async_staging_copy_is_refilled_and_rebuilt_when_the_state_grows() -> None:
    """The host copy an async save stages into is kept between saves: a later save refills it
    (the staged values are the new ones, and training may change the originals once staged),
    and a state dict of another structure (a new parameter group, new optimizer state) gets a
    new copy instead of failing."""
    import torch

    from orchestrator.runtime.checkpoint_sharded import _cached_stager

    stager = _cached_stager(pinned=False)
    w = torch.arange(6.0)
    first = stager.stage({"model": {"w": w}, "step": 1})
    w.add_(10)                                       # training goes on after staging
    assert first["model"]["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and first["step"] == 1
    kept = stager.cache
    second = stager.stage({"model": {"w": w}, "step": 2})
    assert stager.cache is kept and second["model"]["w"].tolist() == (torch.arange(6.0) + 10).tolist()
    grown = stager.stage({"model": {"w": w}, "optimizer": {"m": torch.ones(2)}, "step": 3})
    assert stager.cache is not kept and grown["optimizer"]["m"].tolist() == [1.0, 1.0]
    assert grown["model"]["w"].data_ptr() != w.data_ptr()


EMPTY_COPY = textwrap.dedent('''
    import json
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from orchestrator.runtime import dist
    from orchestrator.runtime.checkpoint_sharded import _cached_stager, _empty_host_copy, _leaves

    dist.init_from_env(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optimizer": osd}
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):                   # every tensor op that reads the state's data
        seen = []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("clone", "copy_", "_to_copy", "to"):
                Reads.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))
    with Reads():
        cache = _empty_host_copy(state, pinned=False)
    src, dst = _leaves(state), _leaves(cache)
    same_spec = all(type(a) is type(b) and (not isinstance(a, DTensor) or (
        a.placements == b.placements and a.shape == b.shape and a.stride() == b.stride()
        and a.to_local().shape == b.to_local().shape and a.device_mesh is b.device_mesh)) for a, b in zip(src, dst))
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t
    apart = all(local(b).data_ptr() != local(a).data_ptr() for a, b in zip(src, dst) if local(a).numel())
    stager = _cached_stager(pinned=False)
    staged = stager.stage(state)
    equal = all(torch.equal(local(a), local(b)) for a, b in zip(src, _leaves(staged)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)                      # training goes on once staged
    kept = all(not torch.equal(local(a), local(b)) for a, b in zip(_leaves(msd), _leaves(staged["model"])))
    print(json.dumps({"n": len(src), "dtensors": sum(isinstance(t, DTensor) for t in dst), "same_spec": same_spec,
                      "copies": Reads.seen,
                      "apart": apart, "equal": equal, "kept": kept,
                      "groups": staged["optimizer"]["param_groups"] == osd["param_groups"]}))
    dist.destroy()
''')


def test_the_staging_buffers_keep_each_dtensors_spec_and_hold_their_own_copy(tmp_path: Path) -> None:
    """The async save's host buffers are built without copying the state (torch's builder
    deep-copies every DTensor, data and all, before it swaps in an empty local tensor): each
    DTensor of model and optimizer gets a DTensor of the same mesh, placements, shape and
    stride around its own local buffer; staging fills them with the live values, which training
    may then change."""
    done = run_gloo_ranks(EMPTY_COPY, tmp_path)
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    for p in done:
        r = json.loads(p.stdout.splitlines()[-1])
        # 4 parameters and their exp_avg and exp_avg_sq (DTensors), and AdamW's 4 step counts (plain)
        assert r["n"] == 16 and r["dtensors"] == 12, r
        assert r["same_spec"] and r["apart"] and r["equal"] and r["kept"] and r["groups"], r
        assert r["copies"] == [], r          # building the buffers copied nothing
