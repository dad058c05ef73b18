"""CheckpointManager and the filesystem-only discovery / retention helpers, single process."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.runtime import checkpoint as ck
from orchestrator.runtime.checkpoint import (COMMIT_MARKER, CheckpointManager, apply_retention, latest_complete,
                                             list_checkpoints, write_atomic)
from orchestrator.runtime.data import ResumableDistributedSampler
from orchestrator.runtime.progress import Progress
from tests.runtime.conftest import committed_step, progress_payload, restored

REPO = Path(__file__).resolve().parents[2]


def fake_ckpt(root: Path, step: int, committed: bool = True) -> Path:
    d = root / ck.step_dir_name(step)
    d.mkdir(parents=True)
    (d / "shared.pt").write_bytes(b"x" * 10)
    (d / "meta.json").write_text(json.dumps({"step": step}))
    if committed:
        files = {p.name: p.stat().st_size for p in d.iterdir()}
        (d / COMMIT_MARKER).write_text(json.dumps({"step": step, "files": files}))
    return d


class Toy:
    """A model, optimizer, scheduler, sampler and private generator: everything save() covers."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.sampler = ResumableDistributedSampler(10, num_replicas=1, rank=0, seed=3)
        self.gen = torch.Generator().manual_seed(99)

    def step(self) -> None:
        x = torch.randn(5, 4) + torch.rand(1, generator=self.gen)
        loss = self.model(x).pow(2).mean() + random.random() * 0 + float(np.random.rand()) * 0
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad()
        self.sampler.advance(1)

    def manager(self, root: Path, **kw) -> CheckpointManager:
        m = CheckpointManager(root, **kw)
        m.register(model=self.model, optimizer=self.opt, scheduler=self.sched, sampler=self.sampler,
                   generators={"g": self.gen})
        return m

    def fingerprint(self) -> dict:
        return {"params": [p.detach().clone() for p in self.model.parameters()],
                "opt": [t.clone() for s in self.opt.state.values() for t in s.values()],
                "sched": self.sched.state_dict(), "sampler": self.sampler.state_dict(),
                "draws": (torch.rand(3), torch.rand(2, generator=self.gen), random.random(), np.random.rand())}


def same(a: dict, b: dict) -> bool:
    def eq(x, y) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    # strict: a list cut short is a difference, not a shorter comparison.
    return (all(eq(x, y) for x, y in zip(a["params"], b["params"], strict=True))
            and len(a["opt"]) == len(b["opt"])
            and all(eq(x, y) for x, y in zip(a["opt"], b["opt"], strict=True)) and a["sched"] == b["sched"]
            and a["sampler"] == b["sampler"] and all(eq(x, y) for x, y in zip(a["draws"], b["draws"], strict=True)))


def test_latest_complete_empty_and_missing(tmp_path: Path) -> None:
    assert latest_complete(tmp_path / "nope") is None
    assert latest_complete(tmp_path) is None


def test_latest_complete_skips_torn_and_falls_back(tmp_path: Path) -> None:
    fake_ckpt(tmp_path, 4)
    fake_ckpt(tmp_path, 8)
    fake_ckpt(tmp_path, 12, committed=False)            # torn: no marker
    (tmp_path / "step-00000016.stale-1").mkdir()        # not a checkpoint name
    (tmp_path / "step-20").mkdir()
    info = latest_complete(tmp_path)
    assert info is not None
    assert info.step == 8 and info.path.name == "step-00000008"
    # Damage the newest committed one (a file shrank): it no longer counts, 4 is next.
    (tmp_path / "step-00000008" / "shared.pt").write_bytes(b"x")
    assert committed_step(tmp_path) == 4
    (tmp_path / "step-00000004" / "shared.pt").unlink()
    assert latest_complete(tmp_path) is None
    # A garbage marker is not a commit either.
    d = fake_ckpt(tmp_path, 24, committed=False)
    (d / COMMIT_MARKER).write_text("{not json")
    assert latest_complete(tmp_path) is None


def test_discovery_needs_only_the_standard_library(tmp_path: Path) -> None:
    fake_ckpt(tmp_path, 3)
    code = ("import sys; from orchestrator.runtime.checkpoint import latest_complete; "
            f"i = latest_complete({str(tmp_path)!r}); assert i.step == 3, i; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_write_atomic_replaces_whole_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "MARK"
    write_atomic(target, b"one")
    assert target.read_bytes() == b"one"

    def boom(src, dst):
        raise OSError("disk gone")
    monkeypatch.setattr(ck.os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, b"two-longer")
    assert target.read_bytes() == b"one"   # old content intact, never a half-written marker


def test_retention_keeps_at_least_two_and_removes_torn_leftovers(tmp_path: Path) -> None:
    for s in (2, 4, 6):
        fake_ckpt(tmp_path, s)
    fake_ckpt(tmp_path, 5, committed=False)    # older torn: removed
    fake_ckpt(tmp_path, 8, committed=False)    # newer torn: may be in flight, kept
    apply_retention(tmp_path, keep=1)          # keep=1 is raised to 2
    assert [(c.step, c.committed) for c in list_checkpoints(tmp_path)] == [(4, True), (6, True), (8, False)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000006", "step-00000008"]


def test_retention_deletes_off_the_loop_and_wait_joins_them(tmp_path: Path, monkeypatch) -> None:
    """A sync save returns once its checkpoint is committed and the retired one renamed out of
    the way; deleting it (a tenth of the save's time for a large checkpoint) runs on a sweeper
    thread that wait(), the next save and close() join."""
    import threading

    gate, deleting = threading.Event(), threading.Event()
    real = ck.delete_trees

    def slow_delete(paths):
        deleting.set()
        gate.wait(60)
        real(paths)
    monkeypatch.setattr(ck, "delete_trees", slow_delete)
    toy = Toy()
    mgr = toy.manager(tmp_path, keep=2)
    for s in (1, 2):
        toy.step()
        mgr.save(s)
    toy.step()
    saved = threading.Thread(target=mgr.save, args=(3,))
    saved.start()
    assert deleting.wait(30)
    saved.join(30)
    assert not saved.is_alive(), "save() waited for retention's deletes"
    # Step 1 no longer looks like a checkpoint, though its files are still being deleted.
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 3]
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.glob("step-00000001*")] == ["step-00000001.deleting"]
    waited = threading.Thread(target=mgr.wait)
    waited.start()
    waited.join(0.5)
    assert waited.is_alive(), "wait() returned before the deletes were done"
    gate.set()
    waited.join(30)
    assert not waited.is_alive() and not list(tmp_path.glob("step-00000001*"))
    # close() joins a sweep too: nothing is left behind when the process exits after it.
    gate.clear()
    deleting.clear()
    toy.step()
    mgr.save(4)
    assert deleting.wait(30)
    threading.Timer(0.5, gate.set).start()
    mgr.close()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]


EXIT_WITHOUT_CLOSE = """
import sys, time
import torch
from orchestrator.runtime import checkpoint as ck
real = ck.delete_trees
ck.delete_trees = lambda paths: (time.sleep(1.5), real(paths))      # a sweep the exit must wait for
root, mode = sys.argv[1], sys.argv[2]
mgr = ck.CheckpointManager(root, keep=2, async_save=(mode == "async"))
mgr.register(model=torch.nn.Linear(2, 2))
for step in (1, 2, 3):
    mgr.save(step)
deadline = time.monotonic() + 60
while not list(ck.Path(root).glob("*.deleting-*")) and time.monotonic() < deadline:
    time.sleep(0.01)           # step 3 committed (async: on the writer thread) and step 1 retired
print("retired", flush=True)
"""                            # and the script ends without close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_exit_without_close_still_finishes_retentions_deletes(tmp_path: Path, mode: str) -> None:
    """The sweeper is not a daemon, however the save ran (an async save's writer thread is a
    daemon, and a thread it starts would be one too): a job that ends without close() leaves no
    half-deleted folder behind."""
    script = tmp_path / "job.py"
    script.write_text(EXIT_WITHOUT_CLOSE)
    root = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, str(script), str(root), mode], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0 and "retired" in done.stdout, done.stderr[-2000:]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-00000002", "step-00000003"]


def test_save_restore_round_trip_is_exact(tmp_path: Path) -> None:
    toy = Toy()
    mgr = toy.manager(tmp_path, keep=2, every_steps=2)
    for _ in range(3):
        toy.step()
    path = mgr.save(3, epoch=0, samples=15, extra={"dtype": "fp32"})
    assert (path / COMMIT_MARKER).exists() and committed_step(tmp_path) == 3
    expected = toy.fingerprint()   # state + the random draws that follow the save

    other = Toy(seed=1)            # different init: everything must come from the checkpoint
    other.step()
    state = restored(other.manager(tmp_path))
    assert (state.step, state.epoch, state.samples, state.extra, state.exact) == (3, 0, 15, {"dtype": "fp32"}, True)
    assert same(other.fingerprint(), expected)


def test_async_save_snapshots_at_call_time(tmp_path: Path) -> None:
    toy = Toy()
    toy.step()
    mgr = toy.manager(tmp_path, async_save=True)
    before = [p.detach().clone() for p in toy.model.parameters()]
    mgr.save(1)
    with torch.no_grad():               # training goes on while the writer thread runs
        for p in toy.model.parameters():
            p.add_(1.0)
    mgr.wait()
    assert committed_step(tmp_path) == 1
    assert (tmp_path / "step-00000001" / "rank-00000.done").exists()
    fresh = Toy(seed=5)
    fresh.manager(tmp_path).restore()
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.model.parameters(), strict=True))


def test_old_checkpoints_survive_a_failed_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy = Toy()
    mgr = toy.manager(tmp_path, keep=2)
    for s in (1, 2):
        toy.step()
        mgr.save(s)
    real = ck.write_atomic

    def fail_marker(path, data):
        if Path(path).name == COMMIT_MARKER:
            raise OSError("killed before the marker")
        return real(path, data)
    monkeypatch.setattr(ck, "write_atomic", fail_marker)
    toy.step()
    with pytest.raises(OSError):
        mgr.save(3)
    # Nothing was deleted: retention only runs after a commit.
    assert [(c.step, c.committed) for c in list_checkpoints(tmp_path)] == [(1, True), (2, True), (3, False)]
    assert committed_step(tmp_path) == 2


def test_a_sync_save_skips_the_zip_crc_and_gives_torch_its_option_back(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile

    toy = Toy()
    toy.step()
    mgr = toy.manager(tmp_path, keep=2)
    path = mgr.save(1)
    expected = toy.fingerprint()
    crcs = [i.CRC for f in ("shared.pt", "rank-00000.pt") for i in zipfile.ZipFile(path / f).infolist()]
    assert crcs and set(crcs) == {0}              # the digest is the check; torch.load does not read it
    assert torch.serialization.get_crc32_options() is True
    fresh = Toy(seed=3)
    assert restored(fresh.manager(tmp_path)).step == 1 and same(fresh.fingerprint(), expected)

    # A save that fails midway sets the option back too; and a user's own choice is kept.
    def broken(obj, p):
        raise OSError(5, "Input/output error", str(p))
    with monkeypatch.context() as mp:
        mp.setattr(ck, "save_fsync", broken)
        with pytest.raises(OSError):
            mgr.save(2)
    assert torch.serialization.get_crc32_options() is True
    torch.serialization.set_crc32_options(False)
    try:
        mgr.save(3)
        assert torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)


def test_save_replaces_a_torn_folder_of_the_same_step(tmp_path: Path) -> None:
    torn = fake_ckpt(tmp_path, 4, committed=False)
    (torn / "rank-00007.pt").write_bytes(b"left by a dead attempt of another world size")
    toy = Toy()
    toy.step()
    mgr = toy.manager(tmp_path)
    mgr.save(4)
    info = latest_complete(tmp_path)
    assert info is not None
    assert info.step == 4
    assert not (info.path / "rank-00007.pt").exists()
    assert json.loads((info.path / COMMIT_MARKER).read_text())["files"].keys() == {"meta.json", "shared.pt",
                                                                                   "rank-00000.pt"}
    mgr.wait()         # retention's deletes run on a sweeper thread
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["step-00000004"]   # the stale copy is gone


def test_retention_through_the_manager_and_progress_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    toy = Toy()
    mgr = toy.manager(tmp_path / "c", keep=3, every_steps=2, progress=Progress(stream=out, enabled=True))
    assert [s for s in range(7) if mgr.should_save(s)] == [2, 4, 6]
    for s in range(1, 11):
        toy.step()
        if mgr.should_save(s):
            mgr.save(s)
    assert [c.step for c in list_checkpoints(tmp_path / "c")] == [6, 8, 10]
    events = [progress_payload(line) for line in out.getvalue().splitlines()]
    assert [(e["event"], e["step"]) for e in events] == [("checkpoint", s) for s in (2, 4, 6, 8, 10)]
    assert all(e["path"].endswith(ck.step_dir_name(e["step"])) and e["seconds"] >= 0 for e in events)


def test_restore_nothing_and_explicit_path(tmp_path: Path) -> None:
    toy = Toy()
    mgr = toy.manager(tmp_path)
    assert mgr.restore() is None
    fake_ckpt(tmp_path, 9, committed=False)
    with pytest.raises(ck.CheckpointError, match="not a committed checkpoint"):
        mgr.restore(tmp_path / "step-00000009")
