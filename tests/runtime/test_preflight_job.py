"""The preflight inside a job (local rank 0 at start) and ``python -m orchestrator.runtime.preflight``,
the doctor of an image that has the runtime but not click."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from .conftest import vendor_env

from orchestrator.runtime.preflight import GiB, MiB, PreflightFailed, in_job
from orchestrator.runtime.progress import Progress
from orchestrator.runtime.protocol import parse_progress
from tests.runtime.conftest import REPO, TRAIN, job_env


def fs_of(size_bytes: int):
    bs = 4096
    n = size_bytes // bs
    return lambda path: os.statvfs_result((bs, bs, n, n, n, 1000, 1000, 1000, 0, 255))


class Cards:
    """A vendor device module with ``count`` devices."""

    __name__ = "torch.fake"

    def __init__(self, count: int, bf16: bool = True):
        self.count, self.bf16 = count, bf16

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def is_bf16_supported(self):
        return self.bf16


def run_in_job(env, **kw):
    out, progress_out = io.StringIO(), io.StringIO()
    progress = Progress(stream=progress_out, enabled=True)
    try:
        findings = in_job(env=env, stream=out, progress=progress, find_library=lambda n: None,
                          which=lambda n: None, **kw)
        error = None
    except PreflightFailed as exc:
        findings, error = None, exc
    events = [e for e in map(parse_progress, progress_out.getvalue().splitlines()) if e]
    return findings, error, out.getvalue(), events


def test_no_device_on_an_accelerator_vendor_stops_the_job():
    env = {"WMCTL_VENDOR": "cuda", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    _, error, text, events = run_in_job(env, device_module=Cards(0), statvfs=fs_of(16 * GiB))
    assert error is not None and "torch.cuda.device_count() is 0, expected at least 2" in str(error)
    assert "wmctl preflight: [error] devices:" in text
    assert events[0]["event"] == "preflight" and events[0]["errors"] == 1
    assert events[0]["findings"][0]["fatal"] is True


def test_fewer_devices_than_ranks_and_small_shm_are_reported_not_fatal():
    env = {"WMCTL_VENDOR": "musa", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"}
    findings, error, text, events = run_in_job(env, device_module=Cards(4, bf16=False), num_workers=8,
                                               prefetch_factor=4, batch_bytes=MiB, statvfs=fs_of(64 * MiB),
                                               dtype="bf16")
    assert error is None
    by = {f.check: f for f in findings}
    assert by["devices"].level == "error" and "is 4, expected at least 8" in by["devices"].message
    assert not by["devices"].fatal
    assert by["shm"].level == "error" and "8 workers" in by["shm"].message
    assert by["dtype"].level == "warn" and "does not support" in by["dtype"].message
    assert "wmctl preflight: [error] shm:" in text
    # An exact count from the environment wins over the one-device-per-rank minimum.
    env["WMCTL_EXPECT_DEVICES"] = "4"
    findings, *_ = run_in_job(env, device_module=Cards(4), statvfs=fs_of(16 * GiB))
    assert {f.check: f.level for f in findings}["devices"] == "ok"


def test_only_local_rank_zero_checks_and_cpu_jobs_pass():
    assert in_job(env={"LOCAL_RANK": "1", "WMCTL_VENDOR": "cuda"}, stream=io.StringIO()) == []
    findings, error, text, events = run_in_job({"WMCTL_TORCH_MODULE": "cpu"}, statvfs=fs_of(16 * GiB),
                                               num_workers=2, dtype="fp32")
    assert error is None and all(f.level == "ok" for f in findings)
    assert text.splitlines()[-1] == "wmctl preflight: 0 error(s), 0 warning(s)"


NO_CLICK = ("import sys, runpy; sys.modules['click'] = None; sys.argv = ['preflight'] + sys.argv[1:]; "
            "runpy.run_module('orchestrator.runtime.preflight', run_name='__main__')")


@pytest.mark.timeout(120)
def test_module_entry_point_works_without_click(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WMCTL_VENDOR", None)
    ok = subprocess.run([sys.executable, "-c", NO_CLICK, "--vendor", "cpu", "--num-workers", "0"],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=100)
    assert ok.returncode == 0, ok.stderr
    assert "[ ok  ] devices: vendor cpu" in ok.stdout and "0 error(s)" in ok.stdout
    unknown = subprocess.run([sys.executable, "-c", NO_CLICK, "--vendor", "musa"],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=100)
    assert unknown.returncode == 2 and "WMCTL_VENDOR_PROFILE" in unknown.stderr   # no profile, no guess
    # An image built for MUSA carries its profile (as a job started by wmctl does).
    env.update({k: v for k, v in vendor_env("musa").items() if k == "WMCTL_VENDOR_PROFILE"})
    bad = subprocess.run([sys.executable, "-c", NO_CLICK, "--vendor", "musa", "--expect-devices", "8", "-o", "json"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=100)
    assert bad.returncode == 1, bad.stderr
    data = json.loads(bad.stdout)
    assert data["errors"] >= 1 and data["findings"][0]["check"] == "device-module"
    usage = subprocess.run([sys.executable, "-m", "orchestrator.runtime.preflight", "--shm-min", "lots"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=100)
    assert usage.returncode == 2 and "bad size 'lots'" in usage.stderr and "Traceback" not in usage.stderr


@pytest.mark.timeout(180)
def test_example_stops_at_preflight_on_a_gpu_job_without_gpus(tmp_path):
    # Before the preflight ran in jobs, this trained quietly on the CPU.
    env = job_env(WMCTL_VENDOR="cuda", WMCTL_TORCH_MODULE="cuda")
    proc = subprocess.run([sys.executable, str(TRAIN), "--data-dir", str(tmp_path / "data"), "--num-clips", "4",
                           "--frames", "3", "--size", "16", "--max_steps", "2"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=150)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "wmctl preflight: stopping: torch.cuda.device_count() is 0" in proc.stderr
    events = [e["event"] for e in map(parse_progress, proc.stdout.splitlines()) if e]
    assert events == ["preflight"]          # stopped before any training set-up
    assert not (tmp_path / "data").exists()
