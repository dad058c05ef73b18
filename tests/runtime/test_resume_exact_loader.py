"""Exact mid-epoch resume with a plain DataLoader (issue 22, severe item 1), under real torchrun
(2 ranks, gloo, CPU), the whole job SIGKILLed.

The job (loader_job.py) trains an MLP with dropout from ``DataLoader(ds, shuffle=True)`` with
no generator: the sampler's seed and the workers' base seed come from the global RNG at every
``iter()``. It checkpoints every 5 steps and is killed before step 13, in the first epoch (16
batches), so the resume starts from step 10, ten batches into the epoch; 40 steps in all cross
two more epoch starts. Proof of exactness is the sha256 of the final weights, equal to an
uninterrupted run's (which has no checkpointing at all). Cases: the default loader, random
augmentation from the global RNG inside DataLoader workers, and an IterableDataset shuffling
with its own (registered) generator. An unregistered loader must make the resume say
``not exact: unregistered DataLoader``, and it is indeed not exact.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.conftest import REPO, Job, job_env, kill_tree, wait_until
from tests.session_once import build_once

JOB = REPO / "tests" / "runtime" / "loader_job.py"


def start(args: list[str], log: Path, attempt: int | None = None) -> Job:
    env = job_env(**({"WMCTL_ATTEMPT": str(attempt)} if attempt is not None else {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(JOB), *args]
    fh = open(log, "ab")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
    fh.close()
    return Job(proc, log)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], str]:
    """The final-weight hash of an uninterrupted run without checkpoints, per (data, workers): one
    run per session, whichever xdist worker asks first (tests/session_once.py). The default
    loader's is wanted by two tests, which xdist may give two workers."""

    def get(data: str, workers: int) -> str:
        def run(d: Path) -> dict[str, str]:
            job = start(["--data", data, "--num-workers", str(workers), "--dump-hash", str(d / "hash")],
                        d / "log.txt")
            job.completed()
            return {"hash": (d / "hash").read_text()}

        return build_once(tmp_path_factory, f"loader-plain-{data}-{workers}", run)["hash"]

    return get


def killed_and_resumed(tmp_path: Path, data: str, workers: int, register: bool) -> tuple[str, dict]:
    """SIGKILL the whole job before step 13 (checkpoint 10 committed), resume it to the end:
    (final-weight hash, the resume event)."""
    args = ["--data", data, "--num-workers", str(workers), "--checkpoint-dir", str(tmp_path / "ckpt"),
            *(["--register"] if register else [])]
    pause = tmp_path / "paused"
    job = start(args + ["--pause-at", "13", "--pause-file", str(pause)], tmp_path / "a0.log", attempt=0)
    wait_until(pause.exists, 180, job, "the pause before step 13")
    assert 10 in [e["step"] for e in job.events("checkpoint")]
    kill_tree(job.proc.pid)
    job.proc.wait(timeout=60)
    job = start(args + ["--dump-hash", str(tmp_path / "hash")], tmp_path / "a1.log", attempt=1)
    job.completed()
    resumes = job.events("resume")
    assert [e["step"] for e in resumes] == [10], job.text()[-3000:]
    assert job.events("exit")[-1]["status"] == "completed"
    return (tmp_path / "hash").read_text(), resumes[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("data", "workers"), [("map", 0), ("augment", 2), ("iterable", 2)])
def test_registered_plain_loader_resumes_bit_exactly(tmp_path: Path, uninterrupted, data: str, workers: int) -> None:
    got, resume = killed_and_resumed(tmp_path, data, workers, register=True)
    assert resume["exact"] is True and resume["reason"] == ""
    assert got == uninterrupted(data, workers)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_unregistered_loader_is_reported_not_exact(tmp_path: Path, uninterrupted) -> None:
    got, resume = killed_and_resumed(tmp_path, "map", 0, register=False)
    assert resume["exact"] is False and resume["reason"] == "unregistered DataLoader"
    assert any("unregistered DataLoader" in w for w in resume["warnings"])
    # The verdict is honest: this resume does train differently.
    assert got != uninterrupted("map", 0)
