"""Exact resume on a real accelerator: the check the CPU suite cannot make.

Run by hand on a machine with one CUDA device (never in CI, which has none):

    PYTHONUNBUFFERED=1 python3 bench/device_resume_check.py --out /tmp/resume-check

It runs the example world model under real torchrun on the device (one rank, bf16 autocast,
pinned-memory loader workers) and answers three questions, printing one line for each:

1. Reproducible? Two uninterrupted runs of the same job, with and without deterministic kernels
   (runtime.determinism): do they end with the same bits? If not, no checkpoint can make a resume
   exact, and the product must say so rather than promise it.
2. Exact resume, sync and async saves: SIGKILL mid-accumulation, SIGKILL while a checkpoint is
   written (the torn one must not count), then a resume to the end: equal, bit for bit, to the
   uninterrupted run (model, optimizer state, scheduler)?
3. Preflight: what `python -m orchestrator.runtime.preflight` reports on the device.

Exit status 1 when a resume with deterministic kernels is not bit-exact.
Reuses the CPU suite's job helpers (tests/runtime/conftest.py), so the same kill points are hit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.runtime.checkpoint import COMMIT_MARKER, META_FILE, latest_complete  # noqa: E402
from tests.runtime.conftest import (assert_bit_identical, job_env, kill_tree, start_job, vendor_env,  # noqa: E402
                                    wait_until)

# Bigger than the CPU suite's TINY, so real cuBLAS/attention kernels run; still seconds a run.
ARGS = ["--num-clips", "64", "--frames", "8", "--size", "32", "--d-model", "256", "--nhead", "4",
        "--layers", "2", "--batch_size", "4", "--gradient_accumulation_steps", "3", "--max_steps", "16",
        "--warmup-steps", "3", "--checkpoint-every", "4", "--checkpoint-keep", "2", "--lr", "1e-3",
        "--num-workers", "2", "--pin-memory"]


MODULE = {"name": "cuda"}     # --torch-module cpu tries the script itself on a machine without a device


def env(attempt: int, deterministic: bool, **extra: str) -> dict[str, str]:
    vendor = MODULE["name"] if MODULE["name"] != "cpu" else "cpu"
    return job_env(WMCTL_TORCH_MODULE=MODULE["name"], WMCTL_ATTEMPT=str(attempt),
                   WMCTL_DETERMINISTIC="1" if deterministic else "0", **vendor_env(vendor), **extra)


def same(a: Path, b: Path) -> tuple[bool, str]:
    try:
        assert_bit_identical(a, b)
        return True, "bit-identical"
    except AssertionError as exc:
        return False, str(exc).splitlines()[0]


def uninterrupted(out: Path, data: Path, tag: str, deterministic: bool) -> Path:
    final = out / f"final-{tag}.pt"
    t0 = time.monotonic()
    job = start_job(ARGS + ["--data-dir", str(data), "--dump-final", str(final)], out / f"{tag}.log",
                    env(0, deterministic), nproc=1)
    rc = job.wait(600)
    if rc != 0:
        raise SystemExit(f"{tag}: exit {rc}\n{job.text()[-3000:]}")
    print(f"  {tag}: {time.monotonic() - t0:.1f} s", flush=True)
    return final


def chain(out: Path, data: Path, tag: str, deterministic: bool, mode: str) -> Path:
    """Kill mid-accumulation, kill during a save, resume to the end; the final state."""
    ckpt, pause = out / f"ckpt-{tag}", out / f"pause-{tag}"
    base = ARGS + ["--data-dir", str(data), "--checkpoint-dir", str(ckpt)]
    base += ["--async-checkpoint"] if mode == "async" else []
    job = start_job(base + ["--pause-at", "7:1", "--pause-file", str(pause)], out / f"{tag}-a0.log",
                    env(0, deterministic), nproc=1)
    wait_until(pause.exists, 300, job, "pause at step 7 micro 1")
    kill_tree(job.proc.pid)
    job.proc.wait(60)
    assert latest_complete(ckpt).step == 4, "attempt 0 should leave checkpoint 4"
    job = start_job(base, out / f"{tag}-a1.log", env(1, deterministic, WMCTL_TEST_SLEEP_BEFORE_COMMIT="12:300"),
                    nproc=1)
    torn = ckpt / "step-00000012"
    wait_until(lambda: (torn / META_FILE).exists(), 300, job, "checkpoint 12 written, not committed")
    kill_tree(job.proc.pid)
    job.proc.wait(60)
    assert not (torn / COMMIT_MARKER).exists() and latest_complete(ckpt).step == 8, "torn 12 must not count"
    final = out / f"final-{tag}.pt"
    job = start_job(base + ["--dump-final", str(final)], out / f"{tag}-a2.log", env(2, deterministic), nproc=1)
    rc = job.wait(600)
    if rc != 0:
        raise SystemExit(f"{tag}: exit {rc}\n{job.text()[-3000:]}")
    resumed = [e["step"] for e in job.events("resume")]
    saves = [e for e in job.events("checkpoint")]
    blocking = [e.get("blocking_seconds", e.get("seconds")) for e in saves]
    print(f"  {tag}: resumed from {resumed}, saves {[e['step'] for e in saves]}, "
          f"blocking s {blocking}", flush=True)
    return final


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/resume-check"))
    ap.add_argument("--torch-module", default="cuda")
    args = ap.parse_args()
    MODULE["name"] = args.torch_module
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = out / "clips"
    import torch

    mod = getattr(torch, MODULE["name"], None)
    name = mod.get_device_name(0) if MODULE["name"] != "cpu" and mod is not None else "cpu"
    print(f"torch {torch.__version__}, device {name}", flush=True)
    pre = subprocess.run([sys.executable, "-m", "orchestrator.runtime.preflight"], capture_output=True, text=True,
                         env={**env(0, False), "LOCAL_WORLD_SIZE": "1"}, cwd=REPO, timeout=300)
    print(f"preflight exit {pre.returncode}:\n" + (pre.stdout + pre.stderr)[-2500:], flush=True)

    results: dict[str, object] = {}
    for det in (False, True):
        tag = "det" if det else "default"
        a = uninterrupted(out, data, f"{tag}-run1", det)
        b = uninterrupted(out, data, f"{tag}-run2", det)
        ok, why = same(a, b)
        results[f"reproducible[{tag}]"] = ok
        print(f"reproducible with {tag} kernels: {ok} ({why})", flush=True)
        for mode in (("sync", "async") if det else ("sync",)):
            final = chain(out, data, f"{tag}-{mode}", det, mode)
            ok, why = same(a, final)
            results[f"exact_resume[{tag},{mode}]"] = ok
            print(f"exact resume, {tag} kernels, {mode} saves: {ok} ({why})", flush=True)
    print("RESULT " + json.dumps(results), flush=True)
    (out / "result.json").write_text(json.dumps(results, indent=2))
    return 0 if all(v for k, v in results.items() if "det" in k and "exact" in k) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    raise SystemExit(main())
