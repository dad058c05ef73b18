"""Deterministic kernels, so that a resumed run can equal an uninterrupted one bit for bit.

A checkpoint restores every bit of state (weights, optimizer, RNG streams, sample position); the
resumed run then equals the uninterrupted one only if the same steps compute the same bits. On a
CPU they do. On an accelerator some kernels do not: cuBLAS with several workspaces, atomics in
scatter/index backward passes, cuDNN autotuning that picks another algorithm after a restart. Two
uninterrupted runs of one job then differ already, and no checkpoint can make a resume exact.

``enable()`` asks torch for deterministic kernels (an error, not a silent fallback, for an op that
has none), fixes cuBLAS's workspace and turns cuDNN autotuning off. It costs speed on devices
(a few percent for most models, more for attention backward); it is a switch the job turns on
(`WMCTL_DETERMINISTIC=1`, or the example's ``--deterministic``), never a default.

Call it before the first kernel runs: cuBLAS reads CUBLAS_WORKSPACE_CONFIG when a handle is made.
"""

from __future__ import annotations

import os

ENV_DETERMINISTIC = "WMCTL_DETERMINISTIC"   # "1": the job asks for deterministic kernels
# cuBLAS's documented setting for reproducible results with several streams (cuBLAS docs,
# "Results reproducibility"); ":16:8" also works and uses less memory, and is slower.
CUBLAS_WORKSPACE = ":4096:8"


def requested(environ: dict[str, str] | None = None) -> bool:
    value = (environ if environ is not None else os.environ).get(ENV_DETERMINISTIC, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def enable() -> list[str]:
    """Turn deterministic kernels on; returns what was set, for the job's log."""
    import torch

    done = []
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        done.append(f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE}")
    torch.use_deterministic_algorithms(True)
    done.append("torch.use_deterministic_algorithms(True)")
    cudnn = getattr(torch.backends, "cudnn", None)
    if cudnn is not None:
        cudnn.deterministic = True
        cudnn.benchmark = False
        done.append("cudnn.deterministic, no autotuning")
    return done
