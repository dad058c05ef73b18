"""Step timing with real sleeps standing in for the phases; assertions on classification only."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.runtime.protocol import format_progress, parse_progress
from orchestrator.runtime.timing import StepTimer

KEYS = {"data_s", "compute_s", "comm_s", "step_s", "comm_share", "data_share", "bottleneck", "warnings"}


def run_step(timer, data=0.0, compute=0.0, comm=0.0, micro=1):
    with timer.data():
        time.sleep(data)
    for _ in range(micro):  # gradient accumulation: compute several times per step
        with timer.compute():
            time.sleep(compute / micro)
    with timer.comm():
        time.sleep(comm)
    return timer.end_step()


@pytest.mark.timeout(60)
def test_data_starvation_is_detected():
    timer = StepTimer()
    s = run_step(timer, data=0.2, compute=0.01, comm=0.0)
    assert KEYS <= set(s)
    assert s["bottleneck"] == "data"
    assert s["data_share"] > 0.6           # 0.2 / ~0.21
    assert s["data_s"] >= 0.2 and s["data_s"] > 5 * s["compute_s"]
    assert any("starving" in w and "num_workers" in w for w in s["warnings"])
    assert not any("communication is" in w for w in s["warnings"])


@pytest.mark.timeout(60)
def test_communication_bottleneck_is_detected():
    timer = StepTimer(warn_comm_share=0.30)
    s = run_step(timer, data=0.0, compute=0.02, comm=0.2, micro=2)
    assert s["bottleneck"] == "communication"
    assert s["comm_share"] > 0.6  # comm / (compute + comm)
    assert any("communication is" in w and "collective library" in w for w in s["warnings"])
    assert not any("starving" in w for w in s["warnings"])


@pytest.mark.timeout(60)
def test_compute_bound_step_has_no_warnings_and_summary_aggregates():
    timer = StepTimer()
    for _ in range(2):
        s = run_step(timer, data=0.0, compute=0.2, comm=0.005)
        assert s["bottleneck"] == "compute" and s["warnings"] == []
        assert s["comm_share"] < 0.2 and s["data_share"] < 0.2
    s = run_step(timer, data=0.4, compute=0.01)
    assert s["bottleneck"] == "data"
    agg = timer.summary()
    assert KEYS <= set(agg) and agg["steps"] == 3
    # means over 3 steps: data ~0.4/3, compute ~0.41/3
    assert 0.3 < agg["data_share"] < 0.7
    assert agg["compute_s"] > 0.1 and agg["data_s"] > 0.1
    assert agg["step_s"] >= agg["data_s"] + agg["compute_s"] + agg["comm_s"] - 1e-6
    # fits in a progress line and survives the round trip
    line = format_progress("step", step=3, timing=agg)
    assert parse_progress(line)["timing"] == json.loads(json.dumps(agg))


def test_thresholds_are_configurable():
    timer = StepTimer(warn_comm_share=0.95, warn_data_share=0.99)
    s = run_step(timer, data=0.05, compute=0.01, comm=0.05)
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
    timer = StepTimer(device_module=dev)
    run_step(timer, micro=3)
    # data, 3 x compute, comm: 2 readings each, plus end_step
    assert dev.calls == 2 * 5 + 1
    import torch

    cpu_timer = StepTimer(device_module=torch.cpu)  # cpu: nothing to wait for
    assert cpu_timer._sync is None
    assert StepTimer(device_module="cpu")._sync is None


def test_phases_do_not_nest_and_empty_steps_are_safe():
    timer = StepTimer()
    with pytest.raises(RuntimeError, match="do not nest"):
        with timer.compute():
            with timer.comm():
                pass
    timer.end_step()
    s = timer.end_step()  # nothing timed
    assert s["comm_share"] == 0.0 and s["data_share"] == 0.0
    assert StepTimer().summary()["steps"] == 0
