"""The communication advice fits the job's hardware: no "use the vendor's collective library" on
CPU (gloo is all there is), the library named when an accelerator job all-reduces with another
one, and other remedies when it already uses the vendor's own."""

from __future__ import annotations

import pytest

from orchestrator.runtime.advice import communication_hint
from orchestrator.runtime.protocol import ENV_VENDOR_PROFILE
from orchestrator.runtime.timing import StepTimer
from orchestrator.runtime.vendor import CPU, RuntimeProfile

from .test_timing import Clock, SyncRecorder, ddp_step

MUSA = RuntimeProfile(name="musa", torch_module="musa", dist_backend="mccl")
VENDOR_LIBRARY = "library the vendor tunes"


def comm_bound_warning(timer: StepTimer, clock: Clock) -> str:
    step = ddp_step(timer, clock, fwd=0.2, bwd=0.2, sync_extra=0.4)      # comm 40% of the step
    [warning] = [w for w in step["warnings"] if w.startswith("communication")]
    return warning


def test_cpu_gloo_is_not_told_to_use_a_vendor_library():
    clock = Clock()
    warning = comm_bound_warning(StepTimer(clock=clock, profile=CPU, dist_backend="gloo"), clock)
    assert VENDOR_LIBRARY not in warning and "dist_backend" not in warning
    assert "gloo" in warning and "gradient accumulation" in warning


def test_an_accelerator_job_on_gloo_is_told_which_library_to_use():
    clock = Clock()
    timer = StepTimer(device_module=SyncRecorder(), clock=clock, profile=MUSA, dist_backend="gloo")
    warning = comm_bound_warning(timer, clock)
    assert "all-reduces with gloo; use mccl" in warning and VENDOR_LIBRARY in warning


def test_a_job_already_on_the_vendor_library_gets_other_remedies():
    clock = Clock()
    timer = StepTimer(device_module=SyncRecorder(), clock=clock, profile=MUSA, dist_backend="mccl")
    warning = comm_bound_warning(timer, clock)
    assert VENDOR_LIBRARY not in warning and "use mccl" not in warning
    assert "bucket_cap_mb" in warning


def test_the_profile_comes_from_what_wmctl_hands_the_job(monkeypatch):
    monkeypatch.setenv(ENV_VENDOR_PROFILE, CPU.to_json())
    clock = Clock()
    warning = comm_bound_warning(StepTimer(clock=clock), clock)
    assert VENDOR_LIBRARY not in warning and "gloo" in warning
    monkeypatch.setenv(ENV_VENDOR_PROFILE, MUSA.to_json())
    warning = comm_bound_warning(StepTimer(device_module=SyncRecorder(), clock=clock, dist_backend="gloo"), clock)
    assert "use mccl" in warning


def test_the_library_in_use_is_read_from_a_real_process_group(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0)
    try:
        clock = Clock()
        warning = comm_bound_warning(StepTimer(device_module=SyncRecorder(), clock=clock, profile=MUSA), clock)
    finally:
        dist.destroy_process_group()
    assert "all-reduces with gloo; use mccl" in warning


@pytest.mark.parametrize("accelerator,tuned,in_use,says", [
    (False, None, "gloo", "host memory"),
    (True, "nccl", "nccl", "bucket_cap_mb"),
    (True, "nccl", "gloo", "use nccl"),
    (True, "nccl", None, "all-reduce with nccl"),
])
def test_communication_hint_table(accelerator, tuned, in_use, says):
    assert says in communication_hint(accelerator, tuned, in_use)
