"""DataLoader workers under a preemption SIGTERM sent to the whole process group (what torchrun's
os.killpg does), and per-sample random streams that make augmentation exact across resumes."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from orchestrator.runtime.data import (PreemptibleDataLoader, ResumableDistributedSampler, WorkerInit,
                                       sample_generator, sample_numpy_rng, sample_seed)

REPO = Path(__file__).resolve().parents[2]

# The trainer: a preemption handler (as in every job), a loader with 2 workers, and a wait
# after the first batch for the test to signal the group. Then it must read every batch.
TRAINER = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from orchestrator.runtime.data import PreemptibleDataLoader
    from orchestrator.runtime.preemption import PreemptionHandler

    class Items(Dataset):
        def __len__(self):
            return 12
        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.tensor([i, MARK])

    MARK = 0
    def user_init(worker_id):
        global MARK
        MARK = 100 + worker_id   # the user's own init function still runs

    kind = sys.argv[1]
    handler = PreemptionHandler().install()
    cls = PreemptibleDataLoader if kind == "preemptible" else DataLoader
    loader = cls(Items(), batch_size=2, num_workers=2, worker_init_fn=user_init)
    it = iter(loader)
    got = [next(it)]
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while not handler.local_flag and time.monotonic() < deadline:
        time.sleep(0.01)
    got += list(it)
    print(json.dumps({"signal": handler.received, "rows": torch.cat(got).tolist()}), flush=True)
""")


def _run_trainer(tmp_path: Path, kind: str) -> tuple[int, str, str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line + proc.stderr.read()
    # What torchrun does to a worker: SIGTERM to its process group, DataLoader workers included.
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"trainer hung; stderr:\n{err[-3000:]}")
    return proc.returncode, out, err


@pytest.mark.timeout(120)
def test_workers_survive_a_group_sigterm_and_the_trainer_reads_every_batch(tmp_path: Path) -> None:
    rc, out, err = _run_trainer(tmp_path, "preemptible")
    assert rc == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["signal"] == signal.SIGTERM          # the trainer itself got the preemption
    rows = result["rows"]
    assert [r[0] for r in rows] == list(range(12))     # no batch lost
    assert {r[1] for r in rows} == {100, 101}          # the user's worker_init_fn ran in both workers


@pytest.mark.timeout(120)
def test_a_plain_dataloader_dies_of_the_same_signal(tmp_path: Path) -> None:
    # The failure the wrapper exists for; if torch ever changes this, the test says so.
    rc, out, err = _run_trainer(tmp_path, "plain")
    assert rc != 0 and "killed by signal: Terminated" in err, (rc, out, err[-3000:])


def test_worker_init_chains_pickles_and_unwraps() -> None:
    calls: list[int] = []
    init = WorkerInit(calls.append)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        init(3)
        assert calls == [3]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert pickle.loads(pickle.dumps(WorkerInit(None))).user_fn is None   # spawn start method
    loader = PreemptibleDataLoader(list(range(4)), worker_init_fn=WorkerInit(print))
    assert isinstance(loader.worker_init_fn, WorkerInit) and loader.worker_init_fn.user_fn is print


# ---------------------------------------------------------------- per-sample random streams


def test_sample_streams_depend_only_on_seed_epoch_and_index() -> None:
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)
    seeds = {sample_seed(s, e, i) for s in range(3) for e in range(3) for i in range(50)}
    assert len(seeds) == 3 * 3 * 50
    a = torch.rand(4, generator=sample_generator(7, 1, 5))
    torch.rand(100)   # the global RNG plays no part
    assert torch.equal(a, torch.rand(4, generator=sample_generator(7, 1, 5)))
    assert not torch.equal(a, torch.rand(4, generator=sample_generator(7, 2, 5)))
    assert (sample_numpy_rng(7, 1, 5).random(3) == sample_numpy_rng(7, 1, 5).random(3)).all()


class AugmentedItems(torch.utils.data.Dataset):
    """Random augmentation drawn from the sample's own stream, keyed by (epoch, index)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, key):
        epoch, i = key
        g = sample_generator(11, epoch, i)
        return torch.tensor([float(i)]), torch.rand(2, generator=g)


def _augmentations(num_workers: int, start: int, epoch: int = 1) -> dict[int, torch.Tensor]:
    sampler = ResumableDistributedSampler(24, num_replicas=1, rank=0, seed=5, yield_epoch=True)
    sampler.set_epoch(epoch)
    sampler.advance(start)   # a resume in the middle of the epoch
    loader = PreemptibleDataLoader(AugmentedItems(), batch_size=3, sampler=sampler, num_workers=num_workers)
    out = {}
    for idx, aug in loader:
        for i, a in zip(idx.flatten().tolist(), aug, strict=True):
            out[int(i)] = a
    return out


@pytest.mark.timeout(120)
def test_augmentation_is_exact_across_workers_and_mid_epoch_resume() -> None:
    full = _augmentations(0, 0)
    assert len(full) == 24
    for workers, start in ((2, 0), (2, 7), (0, 13)):
        part = _augmentations(workers, start)
        assert part.keys() <= full.keys() and len(part) == 24 - start
        for i, a in part.items():
            assert torch.equal(a, full[i]), (workers, start, i)
    other_epoch = _augmentations(0, 0, epoch=2)
    assert not all(torch.equal(other_epoch[i], full[i]) for i in full)
