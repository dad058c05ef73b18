"""Step timing: the arithmetic (backward split, shares of the whole step) and the warnings, on a
scripted clock so that no assertion depends on how fast this machine is."""

from __future__ import annotations

import json

import pytest

from orchestrator.runtime.protocol import format_progress
from orchestrator.runtime.timing import StepTimer, classify, split_backward
from tests.runtime.conftest import progress_payload

KEYS = {"data_s", "compute_s", "comm_s", "other_s", "step_s", "data_share", "compute_share", "comm_share",
        "other_share", "comm_vs_compute", "comm_measured", "bottleneck", "warnings"}


class Clock:
    """perf_counter stand-in: time moves only when the test says so."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def ddp_step(timer: StepTimer, clock: Clock, *, data=0.0, fwd=0.0, bwd=0.0, sync_extra=0.0, opt=0.0,
             micro=2, distributed=True, other=0.0) -> dict:
    """One optimizer step of ``micro`` micro-batches, timed the way the example times it: the
    last backward synchronises and takes ``sync_extra`` longer (the all-reduce it cannot hide)."""
    for m in range(micro):
        with timer.data():
            clock.advance(data / micro)
        with timer.forward():
            clock.advance(fwd / micro)
        sync = distributed and m == micro - 1
        with timer.backward(sync=sync):
            clock.advance(bwd / micro + (sync_extra if sync else 0.0))
    with timer.optimizer():
        clock.advance(opt)
    clock.advance(other)   # logging, a checkpoint: untimed
    return timer.end_step()


# ---------------------------------------------------------------- arithmetic


def test_split_backward():
    assert split_backward([0.1, 0.1, 0.1], [0.4]) == pytest.approx((0.4, 0.3))
    assert split_backward([0.2], [0.15]) == (0.35, 0.0)          # faster sync pass: no negative comm
    assert split_backward([0.1, 0.3], []) == (0.4, 0.0)          # not distributed
    assert split_backward([], [0.5]) == (0.5, None)              # accumulation 1: no reference


def test_allreduce_hidden_in_backward_is_counted_as_communication():
    clock = Clock()
    timer = StepTimer(clock=clock)
    s = ddp_step(timer, clock, data=0.0, fwd=0.2, bwd=0.4, sync_extra=0.5, opt=0.1, micro=4)
    assert KEYS <= set(s)
    # backwards: 3 x 0.1 no_sync + 1 x 0.6 sync -> comm 0.5, compute 0.2 + 0.4 + 0.1
    assert s["comm_s"] == pytest.approx(0.5) and s["compute_s"] == pytest.approx(0.7)
    assert s["step_s"] == pytest.approx(1.2) and s["other_s"] == pytest.approx(0.0)
    assert s["comm_share"] == pytest.approx(0.5 / 1.2, abs=1e-4)
    assert s["comm_vs_compute"] == pytest.approx(0.5 / 1.2, abs=1e-4)
    assert s["bottleneck"] == "compute"
    # a CPU timer (no profile handed over): gloo advice, never "use the vendor's library" (test_timing_advice)
    assert any("communication is 42% of the step" in w and "gloo" in w for w in s["warnings"])


def test_shares_are_of_the_whole_step_and_add_up():
    clock = Clock()
    timer = StepTimer(clock=clock)
    s = ddp_step(timer, clock, data=0.2, fwd=0.2, bwd=0.2, sync_extra=0.1, opt=0.0, micro=2, other=0.3)
    assert s["step_s"] == pytest.approx(1.0)
    assert (s["data_share"], s["compute_share"], s["comm_share"], s["other_share"]) == pytest.approx(
        (0.2, 0.4, 0.1, 0.3))
    assert s["data_share"] + s["compute_share"] + s["comm_share"] + s["other_share"] == pytest.approx(1.0)
    # comm is 10% of the step but 20% of compute+comm: the whole-step share decides, no warning
    assert s["comm_vs_compute"] == pytest.approx(0.2) and s["warnings"] == []


def test_data_starvation_warns_and_names_the_fix():
    clock = Clock()
    timer = StepTimer(clock=clock)
    s = ddp_step(timer, clock, data=0.8, fwd=0.05, bwd=0.1, micro=2, distributed=False)
    assert s["bottleneck"] == "data" and s["data_share"] == pytest.approx(0.8 / 0.95, abs=1e-4)
    assert s["comm_s"] == 0.0 and s["comm_measured"] is True       # one process: nothing to sync
    assert len(s["warnings"]) == 1 and "starving" in s["warnings"][0] and "num_workers" in s["warnings"][0]


def test_without_accumulation_communication_is_unmeasured_not_zero():
    clock = Clock()
    timer = StepTimer(clock=clock)
    s = ddp_step(timer, clock, fwd=0.1, bwd=0.1, sync_extra=0.9, micro=1)
    assert s["comm_s"] is None and s["comm_share"] is None and s["comm_measured"] is False
    assert "gradient accumulation >= 2" in s["comm_note"]
    assert s["compute_s"] == pytest.approx(1.1)
    assert not any("communication" in w for w in s["warnings"])
    assert timer.summary()["comm_s"] is None
    assert progress_payload(format_progress("step", timing=s))["timing"]["comm_s"] is None


def test_explicit_comm_phase_and_summary_means():
    clock = Clock()
    timer = StepTimer(clock=clock)
    for _ in range(2):
        with timer.data():
            clock.advance(0.1)
        with timer.compute():
            clock.advance(0.5)
        with timer.comm():
            clock.advance(0.4)
        s = timer.end_step()
        assert s["comm_share"] == pytest.approx(0.4) and s["bottleneck"] == "compute"
    ddp_step(timer, clock, data=2.0, fwd=0.0, bwd=0.0, micro=2, distributed=False)
    agg = timer.summary()
    assert agg["steps"] == 3 and KEYS <= set(agg)
    assert agg["data_s"] == pytest.approx((0.1 + 0.1 + 2.0) / 3, abs=1e-6)   # rounded to 6 digits
    assert agg["comm_s"] == pytest.approx(0.8 / 3, abs=1e-6)
    assert agg["step_s"] == pytest.approx(4.0 / 3, abs=1e-6)
    line = format_progress("step", step=3, timing=agg)
    assert progress_payload(line)["timing"] == json.loads(json.dumps(agg))


def test_thresholds_are_configurable():
    s = classify(0.25, 0.5, 0.25, 1.0, warn_comm=0.2, warn_data=0.2)
    assert len(s["warnings"]) == 2
    s = classify(0.25, 0.5, 0.25, 1.0, warn_comm=0.3, warn_data=0.3)
    assert s["warnings"] == []


class SyncRecorder:
    """Stands in for torch.cuda & co. on a machine without an accelerator."""

    __name__ = "fake.device"

    def __init__(self):
        self.calls = 0

    def synchronize(self):
        self.calls += 1


def test_device_is_synchronised_before_every_reading():
    dev = SyncRecorder()
    clock = Clock()
    timer = StepTimer(device_module=dev, clock=clock)
    ddp_step(timer, clock, micro=3)
    # 3 x (data, forward, backward) + optimizer: 2 readings each, plus end_step
    assert dev.calls == 2 * 10 + 1
    import torch

    cpu_timer = StepTimer(device_module=torch.cpu)  # cpu: nothing to wait for
    assert cpu_timer._sync is None
    assert StepTimer(device_module="cpu")._sync is None


def test_phases_do_not_nest_and_empty_steps_are_safe():
    timer = StepTimer()
    with pytest.raises(RuntimeError, match="do not nest"):
        with timer.compute():
            with timer.backward():
                pass
    timer.end_step()
    s = timer.end_step()  # nothing timed
    assert s["comm_share"] == 0.0 and s["data_share"] == 0.0
    assert StepTimer().summary()["steps"] == 0
