"""The bf16 -> fp16 -> fp32 guard: training starts in the preferred precision and steps down when
the loss or the gradients go NaN/inf, agreed by every rank before optimizer.step().

Standard library at import time; torch loads inside the calls.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

from .advice import TROUBLESHOOTING

class NonFiniteLossError(RuntimeError):
    """The loss stays NaN/inf even in fp32: not a precision problem."""


_LADDER = ("bf16", "fp16", "fp32")


class DtypeGuard:
    """Training precision policy bf16 -> fp16 -> fp32, stepping down on NaN/inf loss.

    ``observe(loss)`` after each step: True when the loss was not finite and the guard stepped
    down (rebuild autocast with ``guard.dtype``; add a GradScaler if ``needs_grad_scaler``).
    At fp32, ``fp32_patience`` consecutive non-finite losses raise NonFiniteLossError.
    """

    def __init__(self, preferred: str = "bf16", device_module=None, *, fp32_patience: int = 3,
                 report: Callable[[str], None] | None = None):
        import torch

        self._torch = torch
        preferred = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32"}.get(preferred, preferred)
        if preferred not in _LADDER:
            raise ValueError(f"preferred dtype {preferred!r}: use bf16, fp16 or fp32")
        on_device = device_module is not None and getattr(device_module, "__name__", "") != "torch.cpu"
        self.device_module = device_module if on_device else None
        self.events: list[dict] = []
        self._report = report or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.fp32_patience = fp32_patience
        self._fp32_bad = 0
        self.steps_seen = 0
        ladder = list(_LADDER[_LADDER.index(preferred):])
        if not on_device and "fp16" in ladder:
            ladder.remove("fp16")  # CPU autocast has no useful fp16 path: bf16 -> fp32
            if preferred == "fp16":
                self._note("fp16", ladder[0], "fp16 is not used on cpu")
        if on_device and "bf16" in ladder and not self._bf16_supported(device_module):
            ladder.remove("bf16")
            self._note("bf16", ladder[0], "the device does not support bf16")
        self._ladder = ladder
        self._index = 0

    @staticmethod
    def _bf16_supported(module) -> bool:
        fn = getattr(module, "is_bf16_supported", None)
        try:
            return bool(fn()) if fn is not None else True
        except RuntimeError:
            return False

    @property
    def name(self) -> str:
        return self._ladder[self._index]

    @property
    def dtype(self):
        t = self._torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32}[self.name]

    @property
    def needs_grad_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self, device_type: str = "cpu"):
        """An autocast context for the dtype in force (disabled at fp32)."""
        return self._torch.autocast(device_type, dtype=self.dtype, enabled=self.name != "fp32")

    def _note(self, old: str, new: str, why: str) -> None:
        event = {"from": old, "to": new, "step": self.steps_seen, "reason": why}
        self.events.append(event)
        self._report(f"wmctl dtype guard: step {self.steps_seen}: {why}; switching {old} -> {new} "
                     f"({TROUBLESHOOTING['low_precision']['cause']})")

    def observe(self, loss, *, reason: str | None = None) -> bool:
        """Count one optimizer step; step down when ``loss`` is not finite.

        ``reason`` names what was not finite when it was not the loss itself (e.g. the
        gradients: pass a NaN loss and reason="gradients are NaN/inf").
        """
        self.steps_seen += 1
        t = self._torch
        value = loss.detach() if isinstance(loss, t.Tensor) else t.tensor(float(loss))
        if bool(t.isfinite(value).all()):
            self._fp32_bad = 0
            return False
        why = reason or "loss is NaN/inf"
        if self._index + 1 < len(self._ladder):
            old = self.name
            self._index += 1
            self._note(old, self.name, why)
            return True
        self._fp32_bad += 1
        if self._fp32_bad >= self.fp32_patience:
            raise NonFiniteLossError(
                f"{why} for {self._fp32_bad} consecutive steps in fp32 (step {self.steps_seen}): "
                "not a low-precision problem. Lower the learning rate, add gradient clipping, "
                "or check the data for NaN/inf values"
            )
        self._report(f"wmctl dtype guard: step {self.steps_seen}: {why} in fp32 "
                     f"({self._fp32_bad}/{self.fp32_patience} before stopping)")
        return False

    def state_dict(self) -> dict:
        """What a checkpoint needs so that a resumed run computes in the same precision."""
        return {"dtype": self.name, "fp32_bad": self._fp32_bad, "steps_seen": self.steps_seen}

    def load_state_dict(self, state) -> None:
        """Accepts ``state_dict()``'s dict, or just the dtype name (older checkpoints)."""
        if isinstance(state, str):
            state = {"dtype": state}
        name = state.get("dtype")
        if name not in self._ladder:
            # E.g. a checkpoint taken at bf16 resumed on a device without bf16: the next rung
            # below it that this device has.
            below = [d for d in _LADDER[_LADDER.index(name) + 1:] if d in self._ladder] if name in _LADDER else []
            if not below:
                raise ValueError(f"dtype {name!r} from the checkpoint is not on this guard's ladder {self._ladder}")
            name = below[0]
        self._index = self._ladder.index(name)
        self._fp32_bad = int(state.get("fp32_bad", 0))
        self.steps_seen = int(state.get("steps_seen", self.steps_seen))


# ---------------------------------------------------------------- before optimizer.step()

def _local(t):
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def grads_finite(parameters) -> bool:
    """True when every gradient of ``parameters`` is finite (parameters without one are skipped).

    One norm per gradient, then a single device->host read: cheap next to the backward pass.
    """
    import torch

    # A DTensor gradient (FSDP2) is checked by its local shard: every rank checks its own and the
    # caller's all-reduce (agree_step_finite) combines them; the whole one would be a collective.
    grads = [_local(p.grad.detach()) for p in parameters if getattr(p, "grad", None) is not None]
    if not grads:
        return True
    foreach_norm = getattr(torch, "_foreach_norm", None)
    try:
        norms = list(foreach_norm(grads)) if foreach_norm is not None else None
    except RuntimeError:   # e.g. mixed devices or a dtype the fused kernel lacks
        norms = None
    if norms is None:
        norms = [torch.linalg.vector_norm(g) for g in grads]
    return bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())


def agree_step_finite(local_loss: float, parameters=None, *, check_grads: bool = True) -> tuple[bool, float, str]:
    """Decide, on every rank together, whether this step's update may be applied.

    Call after the backward passes and before ``optimizer.step()``. Returns ``(finite,
    mean_loss, reason)``: ``finite`` is the same on every rank (one all-reduce carries the loss
    and a non-finite-gradient flag), so either every replica applies the step or none does.
    On False: zero the gradients, skip ``optimizer.step()``, and pass ``reason`` to the dtype
    guard. Leave ``check_grads`` off under a GradScaler, which skips inf gradients itself.
    """
    from orchestrator.runtime import dist

    bad_grads = bool(check_grads and parameters is not None and not grads_finite(parameters))
    mean_loss, any_bad = dist.all_reduce_mean_and_any(float(local_loss), bad_grads)
    if not math.isfinite(mean_loss):
        return False, mean_loss, "loss is NaN/inf"
    if any_bad:
        return False, mean_loss, "gradients are NaN/inf"
    return True, mean_loss, ""
