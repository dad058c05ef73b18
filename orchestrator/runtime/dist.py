"""Small torch.distributed helpers that also work in a single process without torchrun.

torch is imported lazily so ``rank()`` / ``world_size()`` stay cheap and so this module can be
imported by code that only needs the environment-derived values.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from orchestrator.runtime.protocol import ENV_DIST_BACKEND, ENV_PG_TIMEOUT, ENV_TORCH_MODULE
from orchestrator.runtime.vendor import CPU, VendorUnknown, for_job

# Short on purpose: when a peer node vanishes, survivors block in a collective until this
# timeout (defaults: 10 min NCCL, 30 min gloo). The supervisor tears the attempt down anyway,
# but a short timeout bounds the damage when it cannot.
DEFAULT_PG_TIMEOUT_S = 120.0



def _dist() -> Any | None:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        return default


def rank() -> int:
    d = _dist()
    return d.get_rank() if d else env_int("RANK", 0)


def world_size() -> int:
    d = _dist()
    return d.get_world_size() if d else env_int("WORLD_SIZE", 1)


def local_rank() -> int:
    return env_int("LOCAL_RANK", 0)


def is_main() -> bool:
    return rank() == 0


def torch_module_name() -> str:
    return (os.environ.get(ENV_TORCH_MODULE) or "cpu").strip().lower()


def device_module() -> Any | None:
    """The vendor's torch device module (torch.cuda, torch.musa, ...) if present and usable, else None."""
    import torch

    name = torch_module_name()
    if name == "cpu":
        return None
    mod = getattr(torch, name, None)
    try:
        return mod if mod is not None and mod.is_available() else None
    except (AttributeError, RuntimeError):
        return None


def pg_timeout_s() -> float:
    raw = os.environ.get(ENV_PG_TIMEOUT, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_PG_TIMEOUT_S
    except ValueError:
        value = DEFAULT_PG_TIMEOUT_S
    return value if value > 0 else DEFAULT_PG_TIMEOUT_S


def default_backend() -> str:
    explicit = os.environ.get(ENV_DIST_BACKEND, "").strip()
    if explicit:
        return explicit
    if device_module() is None:
        return CPU.dist_backend
    try:
        profile = for_job()
    except VendorUnknown:      # a handed-over profile that cannot be read
        return CPU.dist_backend
    # The profile's collective library, for the device module it names.
    return profile.dist_backend if profile.torch_module == torch_module_name() else CPU.dist_backend


def init_from_env(backend: str | None = None, timeout_s: float | None = None, *,
                  verify_affinity: bool = True, set_device: bool = True) -> bool:
    """Initialise the default process group from torchrun's env. Returns True when distributed.

    A plain ``python train.py`` (no WORLD_SIZE, or WORLD_SIZE=1) stays single-process.

    ``set_device``: make device LOCAL_RANK current first (torchrun's convention), so the
    collective library sets up on the rank's own device rather than device 0.
    ``verify_affinity``: after init, put back the CPU set ``wmctl-bind`` (or
    ``apply_binding_for_this_rank``) gave this rank if init changed it; NCCL 2.30 resets the
    affinity while it sets up (torch.distributed and some vendor plugins do). Prints one note when it had to.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return True
    if env_int("WORLD_SIZE", 1) <= 1 or not dist.is_available():
        return False
    if set_device:
        mod = device_module()
        if mod is not None and hasattr(mod, "set_device") and local_rank() < mod.device_count():
            mod.set_device(local_rank())
    timeout = datetime.timedelta(seconds=timeout_s if timeout_s is not None else pg_timeout_s())
    dist.init_process_group(backend=backend or default_backend(), timeout=timeout)
    from orchestrator.runtime import liveness

    liveness.start()       # each node's beat; rank 0 reports a node that goes silent
    if verify_affinity:
        # NCCL builds its communicator lazily, at the first collective, and that is where it
        # touches the affinity: run one now so the check sees the state training will run in.
        dist.barrier()
        from orchestrator.runtime.affinity import verify_binding

        verify_binding()
    return True


def barrier() -> None:
    d = _dist()
    if d is not None:
        d.barrier()


def all_reduce_max(value: int) -> int:
    """Max of an int over all ranks (the same value everywhere); the value itself when single."""
    d = _dist()
    if d is None:
        return value
    import torch

    t = torch.tensor([value], dtype=torch.int64, device=_collective_device())
    d.all_reduce(t, op=d.ReduceOp.MAX)
    return int(t.item())


def all_reduce_mean(value: float) -> float:
    """Mean of a float over all ranks (NaN anywhere gives NaN everywhere)."""
    d = _dist()
    if d is None:
        return value
    import torch

    t = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    d.all_reduce(t, op=d.ReduceOp.SUM)
    return float(t.item()) / d.get_world_size()


def all_reduce_mean_and_any(value: float, flag: bool) -> tuple[float, bool]:
    """Mean of a float and OR of a flag over all ranks, in one collective.

    The flag travels in its own slot, so a NaN value cannot hide (or fake) it.
    """
    d = _dist()
    if d is None:
        return value, bool(flag)
    import torch

    t = torch.tensor([value, 1.0 if flag else 0.0], dtype=torch.float64, device=_collective_device())
    d.all_reduce(t, op=d.ReduceOp.SUM)
    total, flags = t.tolist()
    return total / d.get_world_size(), flags > 0


def broadcast_object(obj: Any, src: int = 0) -> Any:
    d = _dist()
    if d is None:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=src)
    return box[0]


def _collective_device() -> Any:
    import torch

    d = _dist()
    if d is None or d.get_backend() == "gloo":
        return torch.device("cpu")
    mod = device_module()
    if mod is None:
        return torch.device("cpu")
    return torch.device(torch_module_name(), mod.current_device())


def destroy() -> None:
    d = _dist()
    if d is not None:
        d.destroy_process_group()
