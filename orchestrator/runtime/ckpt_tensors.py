"""The tensors of a checkpoint: one walk over nested state (dicts, lists, tuples of tensors),
and what the manager and the sharded half do with it (host copies, sizes, NaN/inf checks, the
model under its wrappers).

torch is imported when first needed: the checkpoint modules load without it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

if TYPE_CHECKING:
    import torch


def _torch() -> Any:
    import torch

    return torch


def _keep(obj: Any) -> Any:
    return obj


def map_tensors(obj: Any, on_tensor: Callable[[torch.Tensor], Any],
                on_other: Callable[[Any], Any] = _keep) -> Any:
    """``obj`` rebuilt with ``on_tensor`` applied to every tensor (DTensors included) and
    ``on_other`` to every other leaf, through dicts, lists and tuples."""
    tensor = _torch().Tensor

    def walk(o: Any) -> Any:
        if isinstance(o, tensor):
            return on_tensor(o)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple):
            return tuple(walk(v) for v in o)
        return on_other(o)

    return walk(obj)


def tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj`` (through dicts, lists and tuples), in order."""
    tensor = _torch().Tensor
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, tensor):
            yield o
        elif isinstance(o, dict):
            stack.extend(reversed(list(o.values())))
        elif isinstance(o, (list, tuple)):
            stack.extend(reversed(o))


def host_copy(obj: Any) -> Any:
    """Deep copy with every tensor cloned to host memory: the snapshot an async writer may own,
    and what DCP loads into (a failed load leaves the live objects as they were)."""
    return map_tensors(obj, lambda t: t.detach().to("cpu", copy=True))


def payload_bytes(obj: Any) -> int:
    """About how many bytes ``obj`` takes on disk: its tensors' storage (the rest is small)."""
    return sum(int(t.nelement() * t.element_size()) for t in tensor_leaves(obj))


def unwrap(model: Any) -> Any:
    """The module whose state_dict has the model's own names: through DDP and DataParallel
    (``.module``) and torch.compile (``._orig_mod``) only. A user module that merely has an
    attribute called ``module`` is saved whole."""
    torch = _torch()
    wrappers: tuple[Any, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    # A compiled model implies torch._dynamo is loaded; importing it here would cost seconds.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    compiled = getattr(eval_frame, "OptimizedModule", None)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif compiled is not None and isinstance(model, compiled):
            model = model._orig_mod
        else:
            return model


def nonfinite_tensors(items: Iterable[tuple[str, Any]]) -> list[str]:
    """The names of the floating-point tensors in ``items`` (name, tensor) that hold a NaN or an
    infinity. In the blocking part of every save, so cheap: one sum per tensor (a NaN or an
    infinity anywhere makes the sum NaN or infinite; ``isfinite().all()`` costs about ten times
    as much, see bench/bench_checkpoint.py) and one device->host read per device. A sum can
    also overflow on finite values; those tensors alone are checked element by element, so
    the answer is exact."""
    torch = _torch()
    by_device: dict[Any, list[tuple[str, Any, Any]]] = {}
    for name, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            t = t.detach()
            # Half-precision sums accumulate in float32 anyway; returning float32 keeps their
            # result from overflowing float16's 65504.
            acc = torch.float32 if t.element_size() < 4 else None
            by_device.setdefault(t.device, []).append((name, t, t.sum(dtype=acc)))
    bad: list[str] = []
    for flags in by_device.values():
        ok = torch.isfinite(torch.stack([s.double() for _, _, s in flags])).tolist()
        bad += [name for (name, t, _), good in zip(flags, ok, strict=True)
                if not good and not bool(torch.isfinite(t).all())]
    return bad
