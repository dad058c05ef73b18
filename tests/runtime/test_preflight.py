"""Preflight checks (shm, devices, runtime libraries, bf16) and the NaN/inf dtype guard."""

from __future__ import annotations

import os

import pytest
import torch

from orchestrator.runtime.advice import TROUBLESHOOTING
from orchestrator.runtime.dtype_guard import DtypeGuard, NonFiniteLossError
from orchestrator.runtime.preflight import (
    GiB,
    MiB,
    Finding,
    check_devices,
    check_runtime_libraries,
    check_shm,
    parse_size,
    run_preflight,
)


def fs_of(size_bytes: int, free_bytes: int | None = None):
    """A statvfs result for a filesystem of the given size (what os.statvfs returns)."""
    free = size_bytes if free_bytes is None else free_bytes
    bs = 4096
    return lambda path: os.statvfs_result((bs, bs, size_bytes // bs, free // bs, free // bs, 1000, 1000, 1000, 0, 255))


# ---------------------------------------------------------------- shm

def test_docker_default_shm_is_an_error_with_the_fix():
    f = check_shm(8, 4, 1 * MiB, statvfs=fs_of(64 * MiB))
    assert f.level == "error" and f.check == "shm"
    assert "64.0 MiB" in f.message and "8 workers" in f.message
    assert "resources.shm" in f.hint and "--shm-size" in f.hint


def test_small_shm_warns_and_large_is_ok():
    assert check_shm(8, statvfs=fs_of(512 * MiB)).level == "warn"  # below 1 GiB with workers
    assert check_shm(8, statvfs=fs_of(16 * GiB)).level == "ok"
    # 8 workers x prefetch 4 x 64 MiB batches x 2 = 4 GiB needed
    f = check_shm(8, 4, 64 * MiB, statvfs=fs_of(2 * GiB))
    assert f.level == "warn" and "4.0 GiB" in f.message
    # size fine but the space is taken (stale files of a crashed run)
    f = check_shm(8, 4, 64 * MiB, statvfs=fs_of(16 * GiB, free_bytes=1 * GiB))
    assert f.level == "warn" and "less free" in f.message


def test_shm_without_workers_and_explicit_minimum():
    assert check_shm(0, statvfs=fs_of(64 * MiB)).level == "ok"
    f = check_shm(0, statvfs=fs_of(8 * GiB), min_bytes=16 * GiB)
    assert f.level == "error" and "below the required 16.0 GiB" in f.message


def test_shm_missing_path_and_real_dev_shm(tmp_path):
    f = check_shm(2, shm_path=str(tmp_path / "nope"))
    assert f.level == "warn" and "cannot be read" in f.message
    real = check_shm(0, shm_path="/dev/shm")  # the real statvfs of this machine's /dev/shm
    assert real.level == "ok" and real.message.startswith("/dev/shm is ")


def test_parse_size():
    assert parse_size("16g") == 16 * GiB and parse_size("64Mi") == 64 * MiB
    assert parse_size("1GiB") == GiB and parse_size("1024") == 1024
    with pytest.raises(ValueError, match="bad size"):
        parse_size("lots")


# ---------------------------------------------------------------- devices and libraries

def test_missing_device_module_is_reported_with_the_hint():
    # torch_musa is not installed here: the real import fails.
    found = check_devices("musa", 8, find_library=lambda n: None, which=lambda n: None)
    err = found[0]
    assert err.level == "error" and err.check == "device-module"
    assert "torch.musa is not available" in err.message and "torch_musa" in err.message
    assert "vendor's PyTorch image" in err.hint and "driver version" in err.hint
    libs = next(f for f in found if f.check == "runtime-library")
    assert libs.level == "warn" and "libmthreads_core.so" in libs.message
    smi = next(f for f in found if f.check == "smi")
    assert smi.level == "warn" and "mthreads-gmi" in smi.message


def test_device_count_mismatch_names_the_causes():
    # Real torch.cuda on a CPU-only build: importable, zero devices.
    found = check_devices("cuda", 2, find_library=lambda n: None, which=lambda n: None)
    err = found[0]
    assert err.level == "error" and "torch.cuda.device_count() is 0, expected 2" in err.message
    assert "driver version does not match" in err.hint
    assert "libcuda.so" in err.hint  # the missing runtime library, folded into the hint


def test_runtime_libraries_found_and_cpu_needs_nothing():
    found = check_runtime_libraries("musa", find_library=lambda n: f"lib{n}.so.1", which=lambda n: f"/usr/bin/{n}")
    assert [f.level for f in found] == ["ok", "ok"]
    assert check_devices("cpu", None) == [Finding("ok", "devices", "vendor cpu: no accelerator expected")]


def test_run_preflight_cpu_machine():
    findings = run_preflight(None, "cpu", num_workers=8, statvfs=fs_of(64 * MiB))
    by_check = {f.check: f for f in findings}
    assert by_check["devices"].level == "ok"
    assert by_check["shm"].level == "error"
    assert by_check["bf16"].level == "ok"
    assert all(isinstance(f.to_dict(), dict) for f in findings)


def test_troubleshooting_table_is_complete():
    for key in ("data_starvation", "communication", "random_crashes", "low_precision",
                "resume_repeats_data", "numa_imbalance"):
        assert set(TROUBLESHOOTING[key]) == {"symptom", "cause", "fix"}


# ---------------------------------------------------------------- dtype guard

class Device:
    """Stands in for a vendor device module's dtype queries (no accelerator on this machine)."""

    __name__ = "fake.device"

    def __init__(self, bf16: bool):
        self.bf16 = bf16

    def is_bf16_supported(self):
        return self.bf16


def test_guard_on_cpu_steps_bf16_to_fp32_on_injected_nan():
    messages: list[str] = []
    guard = DtypeGuard(preferred="bf16", report=messages.append)
    assert guard.dtype == torch.bfloat16
    assert guard.observe(torch.tensor(1.5)) is False
    assert guard.observe(torch.tensor(float("nan"))) is True
    assert guard.dtype == torch.float32
    assert guard.events == [{"from": "bf16", "to": "fp32", "step": 2, "reason": "loss is NaN/inf"}]
    assert "switching bf16 -> fp32" in messages[0]


def test_guard_on_device_ladder_and_fp32_gives_up():
    guard = DtypeGuard("bf16", Device(bf16=True), fp32_patience=2, report=lambda m: None)
    assert guard.observe(float("inf")) is True and guard.dtype == torch.float16
    assert guard.needs_grad_scaler
    assert guard.observe(float("nan")) is True and guard.dtype == torch.float32
    assert guard.observe(float("nan")) is False  # first strike at fp32
    assert guard.observe(0.5) is False          # a finite loss resets the count
    assert guard.observe(float("nan")) is False
    with pytest.raises(NonFiniteLossError, match="consecutive steps in fp32"):
        guard.observe(float("nan"))


def test_guard_skips_bf16_when_the_device_lacks_it():
    messages: list[str] = []
    guard = DtypeGuard("bf16", Device(bf16=False), report=messages.append)
    assert guard.dtype == torch.float16
    assert "does not support bf16" in messages[0]
    with pytest.raises(ValueError, match="use bf16, fp16 or fp32"):
        DtypeGuard("int8")


@pytest.mark.timeout(120)
def test_guard_in_a_real_training_loop_with_an_injected_nan():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = DtypeGuard("bf16", report=lambda m: None)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    dtypes = []
    for step in range(6):
        with guard.autocast("cpu"):
            out = model(x)
        dtypes.append(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        if step == 2:
            loss = loss * float("nan")  # the injected fault
        if guard.observe(loss):
            opt.zero_grad()
            continue  # skip the poisoned step; the next one runs at the new dtype
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert dtypes[:3] == [torch.bfloat16] * 3 and dtypes[3:] == [torch.float32] * 3
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_grads_and_loss_are_checked_before_the_step():
    from orchestrator.runtime.dtype_guard import agree_step_finite, grads_finite

    model = torch.nn.Linear(4, 1)
    assert grads_finite(model.parameters())   # no gradients yet
    model(torch.randn(2, 4)).sum().backward()
    assert grads_finite(model.parameters())
    assert agree_step_finite(0.5, model.parameters()) == (True, 0.5, "")
    assert model.bias.grad is not None
    model.bias.grad[0] = float("inf")
    assert not grads_finite(model.parameters())
    assert agree_step_finite(0.5, list(model.parameters())) == (False, 0.5, "gradients are NaN/inf")
    # Under a GradScaler inf gradients are its business: only the loss counts.
    assert agree_step_finite(0.5, list(model.parameters()), check_grads=False)[0]
    finite, loss, why = agree_step_finite(float("nan"), list(model.parameters()))
    assert not finite and why == "loss is NaN/inf"


def test_guard_state_round_trip_and_reasons():
    messages: list[str] = []
    guard = DtypeGuard("bf16", Device(bf16=True), report=messages.append)
    guard.observe(float("nan"), reason="gradients are NaN/inf")
    assert guard.name == "fp16" and "gradients are NaN/inf" in messages[-1]
    state = guard.state_dict()
    fresh = DtypeGuard("bf16", Device(bf16=True), report=lambda m: None)
    fresh.load_state_dict(state)
    assert fresh.name == "fp16" and fresh.steps_seen == 1
    cpu = DtypeGuard("bf16", report=lambda m: None)
    cpu.load_state_dict("fp16")          # not on the cpu ladder: the next rung down
    assert cpu.name == "fp32"
    cpu.load_state_dict({"dtype": "bf16"})
    assert cpu.name == "bf16"
    only_fp32 = DtypeGuard("fp32", report=lambda m: None)
    only_fp32.load_state_dict("bf16")    # asked for fp32 this time: never climbs back up
    assert only_fp32.name == "fp32"
    with pytest.raises(ValueError, match="not on this guard's ladder"):
        only_fp32.load_state_dict("int8")
