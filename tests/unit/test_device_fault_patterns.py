"""The shipped vendor profiles' device_fault_patterns, checked against the words their runtimes
print: a failed device's line is found (failures.device_fault), while an out-of-memory line, an
ordinary program error and a plain traceback line of the same vendor are not. The patterns are read
from the profiles (images/<vendor>.yaml), never repeated here; the lines are."""

from __future__ import annotations

import pytest

from orchestrator import failures as F
from orchestrator.resources import images_dir
from orchestrator.vendors import available_profiles, load_profile

# A failed device, in the vendor's words (each line quoted from, or built as, the source named).
FAULTS: dict[str, list[str]] = {
    # cudaGetErrorString(cudaErrorECCUncorrectable) through c10's "CUDA error: "; NVML_ERROR_GPU_IS_LOST
    "cuda": ["[rank9]:RuntimeError: CUDA error: uncorrectable ECC error encountered",
             "pynvml.NVMLError_GpuIsLost: GPU is lost"],
    # ROCm/clr hipamd/src/hip_error.cpp: hipErrorECCNotCorrectable
    "rocm": ["[rank2]:RuntimeError: HIP error: uncorrectable ECC error encountered"],
    "ascend": [
        # Ascend/pytorch NPUQueue.cpp ThrowDeviceError / MakeSureQueueEmpty:
        # throw std::runtime_error(throwError + ", " + ...) with throwError from deviceErrorMap
        "[rank5]:RuntimeError: UCE ERROR, ",
        "[rank5]:RuntimeError: HBM MULTI BIT ECC ERROR, ",
        # NPUException.h NPU_CHECK_ERROR_CHECK_UCE: __func__:__FILE__:__LINE__ " NPU function error: "
        # device_error_msg ", error code is " code (function, place and code here are illustrative)
        "RuntimeError: synchronize:torch_npu/csrc/core/npu/NPUStream.cpp:300 NPU function error: "
        "UCE ERROR, error code is 507053",
        # NPUException.cpp handleHbmMultiBitEccError: "HBM MULTI BIT ECC ERROR." + the runtime's message,
        # which carries CANN's reason (NPUException.h DEVICE_HBM_ECC_ERROR; the text around it illustrative)
        "[rank5]:RuntimeError: NPU function error: HBM MULTI BIT ECC ERROR.",
        "[rank5]:[ERROR] RUNTIME: device fault, reason=[hbm Multi-bit ECC error]",
    ],
}

# What must not read as a failed device: out of memory, a program bug, a traceback's frame, and (for
# Ascend, whose "UCE ERROR" is also the tail of "reduce error") a near miss.
NOT_FAULTS: dict[str, list[str]] = {
    "cuda": ["[rank9]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
             "total capacity of 79.15 GiB of which 1.02 GiB is free.",
             "[rank9]:RuntimeError: CUDA error: an illegal memory access was encountered",
             '[rank9]:  File "/w/train.py", line 40, in <module>',
             "[rank9]:RuntimeError: Expected all tensors to be on the same device, but found at least two "
             "devices, cuda:0 and cpu!"],
    "rocm": ["[rank2]:torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
             "[rank2]:RuntimeError: HIP error: an illegal memory access was encountered",
             '[rank2]:  File "/w/train.py", line 40, in <module>'],
    "ascend": [
        # NPUCachingAllocator.cpp; CANN's OOM code (NPUException.cpp isCannOOM)
        "[rank5]:RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity)",
        "EL0004: Failed to allocate memory.",
        '[rank5]:  File "/w/train.py", line 40, in <module>',
        "[rank5]:RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, npu:0 and cpu!",
        "[rank5]:ValueError: all_reduce error, tensors of different shapes",
        # what a healthy rank says after stop_device: not its own device's fault
        "RuntimeError: FORCE STOP, ",
    ],
}


def shipped() -> list[str]:
    return available_profiles(images_dir())


def test_every_profile_with_patterns_has_lines_here():
    """A profile that ships patterns gets quoted lines in this test (and one without none)."""
    with_patterns = {n for n in shipped() if load_profile(n, images_dir()).device_fault_patterns}
    assert with_patterns == set(FAULTS) == set(NOT_FAULTS)


@pytest.mark.parametrize("vendor", sorted(FAULTS))
def test_a_failed_device_in_the_vendors_words_is_a_device_fault(vendor):
    patterns = load_profile(vendor, images_dir()).device_fault_patterns
    for line in FAULTS[vendor]:
        evidence = F.device_fault(["step 40", line, "exiting"], patterns)
        assert evidence is not None, line
        assert "decided by the node's output" in evidence


@pytest.mark.parametrize("vendor", sorted(FAULTS))
def test_each_pattern_is_exercised_by_a_quoted_line(vendor):
    patterns = load_profile(vendor, images_dir()).device_fault_patterns
    for pattern in patterns:
        assert any(pattern.lower() in line.lower() for line in FAULTS[vendor]), pattern


@pytest.mark.parametrize("vendor", sorted(NOT_FAULTS))
def test_out_of_memory_and_program_errors_are_not_device_faults(vendor):
    patterns = load_profile(vendor, images_dir()).device_fault_patterns
    for line in NOT_FAULTS[vendor]:
        assert F.device_fault([line], patterns) is None, line
