"""A full disk while checkpointing, on a real (tiny) tmpfs: the error says where, how much was
needed and how much is free, the half-written files are removed so the next save is not doomed
too, the newest committed checkpoint stays the resume point, and the supervisor reads the
rank's error as storage_full (stop, with the path), not as a bug in train.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.failures import JobError, storage_full
from orchestrator.runtime.checkpoint import CheckpointError, list_checkpoints, step_dir_name
from tests.runtime.conftest import committed_step, restored
from tests.runtime.test_checkpoint import Toy, same


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs of our own (CI runs as root; a non-root run fails here instead of skipping)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all but ``leave`` bytes of the disk."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))
    return filler


def test_a_full_disk_is_explained_cleaned_up_and_survivable(small_disk: Path) -> None:
    root = small_disk / "ckpt"
    toy = Toy()
    mgr = toy.manager(root)
    toy.step()
    mgr.save(1)
    at_one = toy.fingerprint()
    Toy().manager(root).restore()          # fingerprint() drew random numbers; back to step 1's state
    size = sum(p.stat().st_size for p in (root / step_dir_name(1)).iterdir())
    filler = fill(small_disk, leave=size // 3)

    toy.step()
    with pytest.raises(CheckpointError) as err:
        mgr.save(2)
    message = str(err.value)
    assert "No space left on device" in message and str(root / step_dir_name(2)) in message
    assert "needed about" in message and "free there" in message
    # Nothing half-written is left to hold the space (the folder itself is gone too).
    assert not (root / step_dir_name(2)).exists()
    assert [c.step for c in list_checkpoints(root)] == [1] and committed_step(root) == 1

    # The supervisor's reading of that error, as the rank prints it.
    job_error = JobError(summary=f"CheckpointError: {message}", lines=(f"CheckpointError: {message}",))
    verdict = storage_full(job_error)
    assert verdict is not None and str(root / step_dir_name(2)) in verdict

    # Space freed: the very next save works, and a resume still finds step 1 until it commits.
    fresh = Toy(seed=3)
    assert restored(fresh.manager(root)).step == 1 and same(fresh.fingerprint(), at_one)
    filler.unlink()
    mgr.save(2)
    assert committed_step(root) == 2


def test_a_full_disk_behind_dcps_own_exception_is_found() -> None:
    """DCP reports a failed shard write as a CheckpointException (a BaseException) holding each
    rank's error: the ENOSPC inside is what the save reports, not DCP's wording."""
    import errno
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from orchestrator.runtime.checkpoint import enospc_in

    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step-00000008/dcp/__1_0.distcp")
    wrapped = CheckpointException("save failed", {1: (full, traceback.StackSummary())})
    assert enospc_in(wrapped) is full
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos") from inner
    except RuntimeError as outer:
        assert enospc_in(outer) is full
    assert enospc_in(CheckpointException("other", {0: (ValueError("x"), traceback.StackSummary())})) is None


# Two gloo ranks; rank 1's write of step 4 fails with ENOSPC (its torch.save raises it, as a full
# disk under rank 1's files would). Every rank must leave save() with an error at once, not rank 0
# waiting in the barrier for a rank that gave up, and step 2 stays the newest checkpoint.
ONE_RANK_FULL = """
import errno, json, sys, time
import torch
from orchestrator.runtime import dist
from orchestrator.runtime.checkpoint import CheckpointError, CheckpointManager, latest_complete
dist.init_from_env(timeout_s=600)
root = sys.argv[1]
model = torch.nn.Linear(2, 2)
m = CheckpointManager(root)
m.register(model=model)
m.save(2)
if dist.rank() == 1:
    real = torch.save
    def full(obj, f, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", f"{root}/step-00000004/rank-00001.pt")
    torch.save = full
started = time.monotonic()
try:
    m.save(4)
    outcome = "saved"
except CheckpointError as err:
    outcome = str(err)
print(json.dumps({"rank": dist.rank(), "outcome": outcome, "seconds": time.monotonic() - started,
                  "latest": latest_complete(root).step}), flush=True)
dist.barrier()
dist.destroy()
"""


@pytest.mark.timeout(300)
def test_a_full_disk_on_one_rank_fails_every_rank_at_once(tmp_path: Path) -> None:
    from tests.runtime.conftest import run_gloo_ranks

    done = run_gloo_ranks(ONE_RANK_FULL, tmp_path, str(tmp_path / "ckpt"))
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    results = {r["rank"]: r for r in (json.loads(p.stdout.splitlines()[-1]) for p in done)}
    assert "No space left on device" in results[1]["outcome"] and "rank 1 needed about" in results[1]["outcome"]
    assert "another rank could not write its part" in results[0]["outcome"]
    assert results[0]["latest"] == results[1]["latest"] == 2
