"""Per-step timing: data wait, compute, communication and the rest, as shares of the whole step.

The field report's method: time each phase with a device synchronisation around it (device work
is asynchronous, so without one the time lands in whichever phase syncs next), and call
communication the bottleneck above 30 % (on H100 it is usually under 10 %). Shares here are of
the whole step (data + compute + comm + other = step), so they add up and name where the time went.

How communication is measured, and why this way: DDP all-reduces gradient buckets *during* the
backward pass of the micro-step that synchronises, overlapped with the rest of that backward;
``optimizer.step()`` does no communication at all. What slows the step is the part of the
all-reduce that the backward cannot hide. So backward passes are timed one by one: the backward
of a ``no_sync()`` micro-step is pure compute, and the excess of the synchronising backward over
the mean no_sync backward of the same step is counted as communication (the rest as compute).
A DDP comm hook timing the all-reduce futures was the alternative; it was not chosen because
(1) a future's duration is mostly overlapped with compute, so it overstates what communication
costs the step, (2) when an NCCL future completes relative to the device work depends on the
backend, and (3) hooks replace DDP's own (and need support from MCCL/HCCL/CNCL); the excess only
needs the device synchronisation the timer already does. Limits: it needs gradient accumulation
of 2 or more (without a no_sync micro-step there is no compute-only reference: communication is
then reported as unmeasured, ``null``), and micro-batches of unequal size add noise.

Summaries are plain dicts of floats/strings/None, ready for a JSON progress line.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable

from . import pace
from . import vendor as vendor_profiles
from .advice import communication_hint, hint

PHASES = ("data", "compute", "comm")
_BOTTLENECK = {"data": "data", "compute": "compute", "comm": "communication", "other": "other"}
UNMEASURED_NOTE = ("communication not measured: it needs gradient accumulation >= 2 "
                   "(a no_sync micro-step gives the compute-only reference)")


def _rounded(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def split_backward(nosync: list[float], sync: list[float]) -> tuple[float, float | None]:
    """(compute, comm) seconds of a step's backward passes.

    ``nosync``: durations of backward passes without gradient synchronisation; ``sync``: those
    with it. comm is the sync passes' excess over the mean no_sync pass (never negative), None
    when there are sync passes but no no_sync reference.
    """
    compute = sum(nosync)
    if not sync:
        return compute, 0.0
    if not nosync:
        return compute + sum(sync), None
    ref = sum(nosync) / len(nosync)
    comm = sum(max(0.0, s - ref) for s in sync)
    return compute + sum(sync) - comm, comm


def classify(data_s: float, compute_s: float, comm_s: float | None, step_s: float,
             warn_comm: float = 0.30, warn_data: float = 0.30, comm_advice: str | None = None) -> dict:
    """Shares of the whole step, the bottleneck and the warnings. ``comm_s`` None: unmeasured.
    ``comm_advice``: what to do about communication on this job's hardware (advice.communication_hint)."""
    step_s = max(step_s, data_s + compute_s + (comm_s or 0.0))
    other_s = max(0.0, step_s - data_s - compute_s - (comm_s or 0.0))

    def share(x: float | None) -> float | None:
        if x is None:
            return None
        return x / step_s if step_s > 0 else 0.0

    phases = {"data": data_s, "compute": compute_s, "comm": comm_s or 0.0, "other": other_s}
    bottleneck = _BOTTLENECK[max(phases, key=lambda p: phases[p])]
    comm_share, data_share = share(comm_s), share(data_s)
    busy = compute_s + (comm_s or 0.0)
    warnings: list[str] = []
    if comm_share is not None and comm_share > warn_comm:
        warnings.append(
            f"communication is {comm_share:.0%} of the step (threshold {warn_comm:.0%}; on H100 it is "
            f"usually under 10%): {comm_advice or hint('communication')}"
        )
    if data_share is not None and data_share > warn_data:
        warnings.append(
            f"data wait is {data_share:.0%} of the step (threshold {warn_data:.0%}): the input pipeline "
            f"is starving the device; {hint('data_starvation')}"
        )
    out = {
        "data_s": _rounded(data_s),
        "compute_s": _rounded(compute_s),
        "comm_s": _rounded(comm_s),
        "other_s": _rounded(other_s),
        "step_s": _rounded(step_s),
        "data_share": _rounded(data_share, 4),
        "compute_share": _rounded(share(compute_s), 4),
        "comm_share": _rounded(comm_share, 4),
        "other_share": _rounded(share(other_s), 4),
        # The report's own figure, comm / (compute + comm), for comparing with its numbers.
        "comm_vs_compute": None if comm_s is None else round(comm_s / busy if busy > 0 else 0.0, 4),
        "comm_measured": comm_s is not None,
        "bottleneck": bottleneck,
        "warnings": warnings,
    }
    if comm_s is None:
        out["comm_note"] = UNMEASURED_NOTE
    return out


class StepTimer:
    """Accumulates phase times within a step; ``end_step()`` closes the step and returns its summary.

    Per micro-batch: ``data()`` around fetching the batch, ``forward()`` around the forward pass,
    ``backward(sync=...)`` around the backward pass (``sync=True`` for the micro-step whose
    backward all-reduces, i.e. outside ``no_sync()`` under DDP; False when not distributed),
    then ``optimizer()`` around the update. ``comm()`` is for explicit collectives (e.g. a loss
    all-reduce). Anything untimed (logging, checkpoints) lands in "other".

    ``device_module``: the vendor's torch module (torch.cuda, torch.musa, ...) whose
    ``synchronize()`` is called before each clock reading; None or cpu: no sync.

    Each step's summary also has ``reach_s``: from the step's first phase to the start of its
    first collective phase (``backward(sync=True)`` or ``comm()``), the rank's own work without
    the wait for a slow peer. ``publish`` (default True): on a multi-node torchrun job, send it to
    the watcher through the c10d store (pace.py: stragglers).

    The communication advice fits the job: ``profile`` (default: the job's vendor profile, as
    wmctl hands it over) names the library the vendor tunes; ``dist_backend`` (default: the
    initialised process group's) the one in use. On CPU there is no vendor library to suggest.
    """

    def __init__(self, device_module=None, warn_comm_share: float = 0.30, warn_data_share: float = 0.30,
                 clock: Callable[[], float] = time.perf_counter,
                 profile: vendor_profiles.RuntimeProfile | None = None, dist_backend: str | None = None,
                 publish: bool = True):
        is_cpu = (device_module is None or device_module == "cpu"
                  or getattr(device_module, "__name__", "") == "torch.cpu")
        self._sync = None if is_cpu else getattr(device_module, "synchronize", None)
        self._profile = profile
        self._accelerator = not is_cpu
        self._dist_backend = dist_backend
        self.warn_comm_share = warn_comm_share
        self.warn_data_share = warn_data_share
        self._clock = clock
        self._current: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._bwd_nosync: list[float] = []
        self._bwd_sync: list[float] = []
        self._totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._total_step = 0.0
        self._unmeasured_steps = 0
        self._step_start: float | None = None
        self._reached: float | None = None     # when this step's first collective began
        self._active: str | None = None
        self._publish = publish
        self.steps = 0

    def comm_advice(self) -> str:
        """What to do about a high communication share, for this job's device and library."""
        if self._profile is None:
            try:
                self._profile = vendor_profiles.for_job()
            except vendor_profiles.VendorUnknown:
                self._profile = vendor_profiles.CPU
        accelerator = self._accelerator or self._profile.accelerator
        tuned = self._profile.dist_backend if self._profile.accelerator else None
        return communication_hint(accelerator, tuned, self._dist_backend or _backend_in_use())

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    @contextmanager
    def _phase(self, name: str, sink: list[float] | None = None, collective: bool = False):
        if self._active is not None:
            raise RuntimeError(f"timer phase {name!r} started inside {self._active!r}: phases do not nest")
        start = self._now()
        if self._step_start is None:
            self._step_start = start
        if collective and self._reached is None:
            self._reached = start
        self._active = name
        try:
            yield
        finally:
            elapsed = self._now() - start
            if sink is not None:
                sink.append(elapsed)
            else:
                self._current[name] += elapsed
            self._active = None

    def data(self):
        return self._phase("data")

    def compute(self):
        return self._phase("compute")

    forward = compute
    optimizer = compute

    def backward(self, sync: bool = False):
        return self._phase("backward", self._bwd_sync if sync else self._bwd_nosync, collective=sync)

    def comm(self):
        return self._phase("comm", collective=True)

    def end_step(self) -> dict:
        """Close the step: its times, shares, bottleneck and warnings. The step runs from its
        first phase to this call, so untimed work (logging, checkpoints) counts in step_s."""
        end = self._now()
        bwd_compute, bwd_comm = split_backward(self._bwd_nosync, self._bwd_sync)
        data = self._current["data"]
        compute = self._current["compute"] + bwd_compute
        comm = None if bwd_comm is None else self._current["comm"] + bwd_comm
        timed = data + compute + (comm if comm is not None else self._current["comm"])
        step_s = max(end - self._step_start, timed) if self._step_start is not None else timed
        if comm is None:
            # Explicit collectives were still timed: keep them out of "other" but do not call
            # the total "communication" when the all-reduce in backward could not be separated.
            compute += self._current["comm"]
        summary = classify(data, compute, comm, step_s, self.warn_comm_share, self.warn_data_share,
                           self.comm_advice())
        # The time to reach the step's first collective: this rank's own work, a slow peer's wait
        # excluded (pace.py). A step with no collective timed is all its own work.
        reach = (self._reached - self._step_start if self._reached is not None and self._step_start is not None
                 else step_s)
        summary["reach_s"] = _rounded(reach)
        self._totals["data"] += data
        self._totals["compute"] += compute
        self._totals["comm"] += comm or 0.0
        self._unmeasured_steps += comm is None
        self._total_step += step_s
        self.steps += 1
        self._current = dict.fromkeys(PHASES, 0.0)
        self._bwd_nosync, self._bwd_sync = [], []
        self._step_start = self._reached = None
        summary["step"] = self.steps
        publisher = pace.publisher() if self._publish else None
        if publisher is not None:
            publisher.record(reach, self.steps)
        return summary

    def summary(self) -> dict:
        """Means per step over all closed steps; shares from the totals."""
        n = max(self.steps, 1)
        comm = None if self._unmeasured_steps else self._totals["comm"] / n
        out = classify(self._totals["data"] / n, self._totals["compute"] / n, comm, self._total_step / n,
                       self.warn_comm_share, self.warn_data_share, self.comm_advice())
        out["steps"] = self.steps
        return out


def _backend_in_use() -> str | None:
    """The initialised default process group's backend (gloo, nccl or a vendor's library), if any. Never
    imports torch: a job that all-reduces has imported it already."""
    tdist = sys.modules.get("torch.distributed")
    try:
        if tdist is not None and tdist.is_available() and tdist.is_initialized():
            return str(tdist.get_backend()).lower()
    except (RuntimeError, ValueError):
        return None
    return None
