"""Helpers for the runtime tests that run the example world model under real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.vendors import load_profile, register_runtime_profiles
from tests.session_once import build_once, session_root

if TYPE_CHECKING:        # the job's runtime (torch) is imported by the tests that use it, not here
    from orchestrator.runtime.checkpoint import CheckpointManager, ResumeState

# The runtime reads no YAML: in a job wmctl hands it the profile (WMCTL_VENDOR_PROFILE), and the
# CLI registers every profile before calling into it. The tests play the CLI's part.
register_runtime_profiles()


def vendor_env(vendor: str) -> dict[str, str]:
    """What wmctl's launcher gives a job of ``vendor``: its name and its runtime profile."""
    return {"WMCTL_VENDOR": vendor, "WMCTL_VENDOR_PROFILE": load_profile(vendor).runtime_profile().to_json()}

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "worldmodel" / "train.py"

# Tiny on purpose: 2 ranks x 3 micro-batches x batch 2 per step over 40 clips (20 per rank,
# so optimizer steps straddle epoch boundaries and the last batch of an epoch is partial).
MAX_STEPS = 16
CKPT_EVERY = 4
ACCUM = 3
TINY = ["--num-clips", "40", "--frames", "6", "--size", "24", "--d-model", "32", "--nhead", "2",
        "--layers", "1", "--batch_size", "2", "--gradient_accumulation_steps", str(ACCUM),
        "--max_steps", str(MAX_STEPS), "--warmup-steps", "3", "--checkpoint-every", str(CKPT_EVERY),
        "--checkpoint-keep", "2", "--lr", "1e-3"]


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["WMCTL_HEARTBEAT_EVERY"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["WMCTL_TORCH_MODULE"] = "cpu"
    for key in ("WMCTL_CHECKPOINT_DIR", "WMCTL_CHECKPOINT_EVERY", "WMCTL_TEST_SLEEP_BEFORE_COMMIT"):
        env.pop(key, None)
    env.update(extra)
    return env


def torchrun_cmd(args: list[str], nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(TRAIN), *args]


@dataclass
class Job:
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        from orchestrator.runtime.protocol import parse_progress

        out = [e for e in (parse_progress(line) for line in self.text().splitlines()) if e]
        return [e for e in out if kind is None or e["event"] == kind]

    def completed(self, timeout: float = 240) -> None:
        """The job ran to its end. torchrun exits 0, or, now and then on a loaded machine, a rank
        dies of SIGABRT in gloo's teardown after the job reported ``exit completed`` ("terminate
        called without an active exception", torchrun then SIGTERMs the rest and exits 1): every
        result was written before it (the final dump precedes the last barrier), and the
        supervisor counts it as benign for the same reason (supervisor._benign_exit). Anything
        else fails the test."""
        rc = self.wait(timeout)
        if rc == 0:
            return
        text = self.text()
        exits = self.events("exit")
        codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", text))
        assert exits and exits[-1]["status"] == "completed" and "-6" in codes and codes <= {"-6", "-15"} \
            and "terminate called without an active exception" in text, f"torchrun rc {rc}\n{text[-4000:]}"

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.wait(timeout=30)
            pytest.fail(f"job did not finish within {timeout} s; log:\n{self.text()[-4000:]}")


def start_job(args: list[str], log: Path, env: dict[str, str] | None = None, nproc: int = 2) -> Job:
    fh = open(log, "ab")
    # Own session: the test can signal torchrun's whole group, like a container runtime would.
    proc = subprocess.Popen(torchrun_cmd(args, nproc), stdout=fh, stderr=subprocess.STDOUT, env=env or job_env(),
                            cwd=str(REPO), start_new_session=True)
    fh.close()
    return Job(proc, log)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL torchrun's process group and every descendant.

    torchrun starts each worker in a new session, so killing torchrun's group alone leaves the
    workers (and their DataLoader workers) running: collect the whole tree first.
    """
    victims = descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for v in victims:
        try:
            os.kill(v, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(cond: Callable[[], bool], timeout: float, job: Job, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if job.proc.poll() is not None:
            pytest.fail(f"job exited with {job.proc.returncode} before {what}; log:\n{job.text()[-4000:]}")
        time.sleep(0.05)
    kill_tree(job.proc.pid)
    pytest.fail(f"timed out waiting for {what}; log:\n{job.text()[-4000:]}")


def effective_samples(prefix: Path, world: int = 2) -> dict[int, dict[tuple[int, int], list[int]]]:
    """rank -> {(step, micro): indices}; a later attempt's record of a step replaces earlier ones."""
    out: dict[int, dict[tuple[int, int], list[int]]] = {}
    for r in range(world):
        seq: dict[tuple[int, int], list[int]] = {}
        path = Path(f"{prefix}.rank-{r}")
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                seq[(rec["step"], rec["micro"])] = rec["indices"]
        out[r] = seq
    return out


def assert_bit_identical(a: Path, b: Path) -> None:
    import torch

    da, db = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    assert da["step"] == db["step"]
    assert da["model"].keys() == db["model"].keys()
    for name, ta in da["model"].items():
        assert torch.equal(ta, db["model"][name]), f"parameter {name} differs"
    sa, sb = da["optimizer"]["state"], db["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for pid, state in sa.items():
        for key, ta in state.items():
            assert torch.equal(ta, sb[pid][key]), f"optimizer state {pid}.{key} differs"
    assert da["optimizer"]["param_groups"] == db["optimizer"]["param_groups"]
    assert da["scheduler"] == db["scheduler"]


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One dataset folder for the whole session, every xdist worker included: the training
    script builds it race-free (ensure_dataset renames a finished folder into place)."""
    return session_root(tmp_path_factory) / "wmdata" / "clips"


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Callable[..., dict[str, Any]]:
    """Uninterrupted run per num_workers value (and extra arguments: --fsdp), run once per
    session and shared, across xdist workers too (tests/session_once.py)."""

    def get(num_workers: int, *extra: str) -> dict[str, Any]:
        def run(d: Path) -> dict[str, str]:
            # No checkpointing at all in the reference run: saving must not perturb training.
            args = TINY + [*extra, "--data-dir", str(shared_data), "--num-workers", str(num_workers),
                           "--dump-final", str(d / "final.pt"),
                           "--record-samples", str(d / "samples")]
            start_job(args, d / "log.txt").completed()
            return {"dir": str(d)}

        d = Path(build_once(tmp_path_factory, f"baseline-nw{num_workers}{''.join(extra).replace('-', '')}",
                            run)["dir"])
        return {"final": d / "final.pt", "samples": effective_samples(d / "samples"), "dir": d}

    return get


def committed_step(root: Path | str) -> int:
    """The step of the newest complete checkpoint under ``root``, which must hold one."""
    from orchestrator.runtime.checkpoint import latest_complete

    info = latest_complete(root)
    assert info is not None, f"no complete checkpoint under {root}"
    return info.step


def progress_payload(line: str) -> dict[str, Any]:
    """What a WMCTL-PROGRESS line says: ``line`` must be one."""
    from orchestrator.runtime.protocol import parse_progress

    payload = parse_progress(line)
    assert payload is not None, line
    return payload


def restored(manager: CheckpointManager) -> ResumeState:
    """``manager.restore()``'s ResumeState: there must be a checkpoint to resume from."""
    state = manager.restore()
    assert state is not None, "nothing to resume from"
    return state


def sigkill_resume_chain(tmp_path: Path, base: list[str], ckpt: Path, sharded: bool = False) -> Path:
    """The chain of SIGKILLs of the whole 2-rank job that test_resume_exact (DDP) and
    test_resume_exact_fsdp (FSDP2) run, each attempt resumed by the next; ``base`` are the
    job's arguments, checkpointing into ``ckpt`` every 4 steps. Returns the final dump.

      attempt 0  killed mid-accumulation (step 7, micro-batch 1)   -> resumes from step 4
      attempt 1  killed while checkpoint 12 is written (every rank's files and done report on
                 disk, no COMMITTED yet: rank 0 sleeps before it) -> resumes from step 8
      attempt 2  killed just after checkpoint 12 committed (re-written over the torn folder)
                                                                   -> resumes from step 12
      attempt 3  runs to the end, its resume reported exact.

    ``sharded``: the checkpoints also hold DCP shards, listed and digested in the marker."""
    from orchestrator.runtime.checkpoint import COMMIT_MARKER, META_FILE, list_checkpoints, read_marker

    def kill(job: Job) -> None:
        kill_tree(job.proc.pid)
        job.proc.wait(timeout=60)

    pause = tmp_path / "paused"
    job = start_job(base + ["--pause-at", "7:1", "--pause-file", str(pause)], tmp_path / "a0.log",
                    job_env(WMCTL_ATTEMPT="0"))
    wait_until(pause.exists, 180, job, "pause at step 7 micro 1")
    kill(job)
    assert committed_step(ckpt) == 4
    if sharded:
        marker = read_marker(ckpt / "step-00000004") or {}
        assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(marker["digests"])
    pause.unlink()

    job = start_job(base, tmp_path / "a1.log", job_env(WMCTL_ATTEMPT="1", WMCTL_TEST_SLEEP_BEFORE_COMMIT="12:300"))
    torn = ckpt / "step-00000012"
    wait_until(lambda: (torn / META_FILE).exists() and all((torn / f"rank-{r:05d}.done").exists() for r in (0, 1)),
               180, job, "checkpoint 12 files on disk")
    assert [e["step"] for e in job.events("resume")] == [4]
    kill(job)
    assert not (torn / COMMIT_MARKER).exists()
    assert not sharded or (torn / "dcp" / ".metadata").exists()
    assert committed_step(ckpt) == 8, [(c.step, c.committed) for c in list_checkpoints(ckpt)]

    job = start_job(base + ["--pause-at", "13:0", "--pause-file", str(pause)], tmp_path / "a2.log",
                    job_env(WMCTL_ATTEMPT="2"))
    wait_until(pause.exists, 180, job, "pause at step 13 micro 0")
    assert [e["step"] for e in job.events("resume")] == [8]
    assert 12 in [e["step"] for e in job.events("checkpoint")]
    kill(job)
    assert committed_step(ckpt) == 12
    assert not any(c.step == 12 and not c.committed for c in list_checkpoints(ckpt))

    final = tmp_path / "final.pt"
    job = start_job(base + ["--dump-final", str(final)], tmp_path / "a3.log", job_env(WMCTL_ATTEMPT="3"))
    job.completed()
    resumed = job.events("resume")
    assert [e["step"] for e in resumed] == [12] and resumed[0]["exact"] is True
    assert job.events("exit")[-1]["status"] == "completed"
    return final


def run_gloo_ranks(script: str, tmp_path: Path, *args: str, world: int = 2,
                   env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """Run ``script`` as ``world`` plain processes forming one gloo group (no torchrun), each
    with RANK/WORLD_SIZE set; the finished processes, rank order. No WMCTL_* identity leaks in."""
    import socket

    path = tmp_path / "ranks.py"
    path.write_text(script)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        e = {k: v for k, v in os.environ.items() if not k.startswith("WMCTL_")}
        e.update({"PYTHONPATH": str(REPO), "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WMCTL_TORCH_MODULE": "cpu", **(env or {})})
        procs.append(subprocess.Popen([sys.executable, str(path), *args], env=e, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=150)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done
