"""Every rank's pace (runtime/pace.py, StepTimer's reach figure): the time to reach the step's
collective excludes the wait for a slow peer, and reaches global rank 0 through the store."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.runtime.pace import node_figures
from orchestrator.runtime.protocol import parse_progress
from orchestrator.runtime.timing import StepTimer

JOB = Path(__file__).with_name("pace_job.py")
REPO = Path(__file__).resolve().parents[2]


def test_two_gloo_ranks_only_the_slow_ranks_figure_grows():
    import torch.distributed as dist

    # the store apart, as torchrun's agent (and wmctl's spares) host it: the ranks join it
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=60),
                           wait_for_workers=False)
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
               "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True",
               "WMCTL_NODE_NAME": f"node-{rank}"}
        procs.append(subprocess.Popen([sys.executable, str(JOB), "--delay", "0.05"], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = {r["rank"]: r for out in outs for line in out.splitlines() if line.startswith("RESULT ")
               for r in [json.loads(line[7:])]}
    # both ranks' whole steps include the 50 ms (the fast one waits inside the all-reduce) ...
    assert results[0]["step_s"] >= 0.045 and results[1]["step_s"] >= 0.045, results
    # ... but only the slow rank takes that long to reach the collective
    assert results[1]["reach_s"] >= 0.045, results
    assert results[0]["reach_s"] < 0.5 * results[1]["reach_s"], results
    # and the figures reached global rank 0's reader through the store, one per node
    paces = [p for p in map(parse_progress, outs[0].splitlines()) if p and p.get("event") == "pace"]
    assert paces, outs[0]
    newest = paces[-1]["nodes"]
    assert newest["1"]["host"] == "node-1" and newest["1"]["reach_ms"] >= 45, paces
    assert newest["0"]["reach_ms"] < 0.5 * newest["1"]["reach_ms"], paces


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_reach_is_the_work_before_the_first_collective_with_and_without_accumulation():
    clock = Clock()
    timer = StepTimer(clock=clock, publish=False)
    # no accumulation: data + forward, then the synchronising backward (the wait is in there)
    with timer.data():
        clock.t += 0.01
    with timer.forward():
        clock.t += 0.02
    with timer.backward(sync=True):
        clock.t += 0.5
    with timer.optimizer():
        clock.t += 0.01
    assert timer.end_step()["reach_s"] == 0.03
    # accumulation of 2: the no_sync micro-step's forward and backward count too
    for sync in (False, True):
        with timer.forward():
            clock.t += 0.02
        with timer.backward(sync=sync):
            clock.t += 0.04 if not sync else 0.3
    summary = timer.end_step()
    assert summary["reach_s"] == 0.08 and summary["step_s"] == 0.38
    # a step with no collective timed (one process): all of it is its own work
    with timer.compute():
        clock.t += 0.2
    assert timer.end_step()["reach_s"] == 0.2


def test_node_figures_keep_each_nodes_slowest_rank():
    raw = {0: b'{"ms": 3.0, "steps": 10, "g": 0, "host": "a"}', 1: b'{"ms": 9.0, "steps": 11, "g": 0, "host": "a"}',
           2: b'{"ms": 4.0, "steps": 11, "g": 1, "host": "b"}', 3: b"not json"}
    assert node_figures(raw) == {"steps": 11, "nodes": {"0": {"reach_ms": 9.0, "host": "a"},
                                                        "1": {"reach_ms": 4.0, "host": "b"}}}
    assert node_figures({}) is None
