"""Per-step timing: data wait vs compute (forward+backward) vs communication.

The field report's method: time each phase with a device synchronisation around it (device work
is asynchronous, so without one the time lands in whichever phase syncs next), and call
communication the bottleneck when comm / (compute + comm) > 30 % (on H100 it is usually < 10 %).
Summaries are plain dicts of floats/strings, ready for a JSON progress line.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable

from .preflight import hint

PHASES = ("data", "compute", "comm")
_BOTTLENECK = {"data": "data", "compute": "compute", "comm": "communication"}


def _rounded(x: float) -> float:
    return round(x, 6)


def _classify(data_s: float, compute_s: float, comm_s: float, step_s: float,
              warn_comm: float, warn_data: float) -> dict:
    busy = compute_s + comm_s
    comm_share = comm_s / busy if busy > 0 else 0.0
    data_share = data_s / step_s if step_s > 0 else 0.0
    phases = {"data": data_s, "compute": compute_s, "comm": comm_s}
    bottleneck = _BOTTLENECK[max(PHASES, key=lambda p: phases[p])]
    warnings: list[str] = []
    if comm_share > warn_comm:
        warnings.append(
            f"communication is {comm_share:.0%} of compute+communication (threshold {warn_comm:.0%}; "
            f"on H100 it is usually under 10%): {hint('communication')}"
        )
    if data_share > warn_data:
        warnings.append(
            f"data wait is {data_share:.0%} of the step (threshold {warn_data:.0%}): the input pipeline "
            f"is starving the device; {hint('data_starvation')}"
        )
    return {
        "data_s": _rounded(data_s),
        "compute_s": _rounded(compute_s),
        "comm_s": _rounded(comm_s),
        "step_s": _rounded(step_s),
        "comm_share": round(comm_share, 4),
        "data_share": round(data_share, 4),
        "bottleneck": bottleneck,
        "warnings": warnings,
    }


class StepTimer:
    """Accumulates phase times within a step (a phase may run several times, e.g. once per
    gradient-accumulation micro-batch); ``end_step()`` closes the step and returns its summary.

    ``device_module``: the vendor's torch module (torch.cuda, torch.musa, ...) whose
    ``synchronize()`` is called before each clock reading; None or cpu: no sync.
    """

    def __init__(self, device_module=None, warn_comm_share: float = 0.30, warn_data_share: float = 0.30,
                 clock: Callable[[], float] = time.perf_counter):
        is_cpu = device_module is None or device_module == "cpu" or getattr(device_module, "__name__", "") == "torch.cpu"
        self._sync = None if is_cpu else getattr(device_module, "synchronize", None)
        self.warn_comm_share = warn_comm_share
        self.warn_data_share = warn_data_share
        self._clock = clock
        self._current: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._total_step = 0.0
        self._step_start: float | None = None
        self._active: str | None = None
        self.steps = 0

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    @contextmanager
    def _phase(self, name: str):
        if self._active is not None:
            raise RuntimeError(f"timer phase {name!r} started inside {self._active!r}: phases do not nest")
        start = self._now()
        if self._step_start is None:
            self._step_start = start
        self._active = name
        try:
            yield
        finally:
            self._current[name] += self._now() - start
            self._active = None

    def data(self):
        return self._phase("data")

    def compute(self):
        return self._phase("compute")

    def comm(self):
        return self._phase("comm")

    def end_step(self) -> dict:
        """Close the step: its times, shares, bottleneck and warnings. The step runs from its
        first phase to this call, so untimed work (logging, checkpoints) counts in step_s."""
        end = self._now()
        cur = self._current
        step_s = max(end - self._step_start, sum(cur.values())) if self._step_start is not None else sum(cur.values())
        summary = _classify(cur["data"], cur["compute"], cur["comm"], step_s,
                            self.warn_comm_share, self.warn_data_share)
        for p in PHASES:
            self._totals[p] += cur[p]
        self._total_step += step_s
        self.steps += 1
        self._current = dict.fromkeys(PHASES, 0.0)
        self._step_start = None
        summary["step"] = self.steps
        return summary

    def summary(self) -> dict:
        """Means per step over all closed steps; shares from the totals."""
        n = max(self.steps, 1)
        out = _classify(self._totals["data"] / n, self._totals["compute"] / n, self._totals["comm"] / n,
                        self._total_step / n, self.warn_comm_share, self.warn_data_share)
        out["steps"] = self.steps
        return out
