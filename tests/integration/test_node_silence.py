"""Node loss seen in seconds on the local backend: real torchrun agents (2 nodes x 1 rank, gloo),
a job that starts the runtime's liveness beat, and a node whose training process is frozen with
a real SIGSTOP (a hung host: every process exists, the agent looks healthy). Without the beat
only restart.heartbeat_timeout (10 minutes here) would catch it."""

from __future__ import annotations

import signal
import time

import pytest

from . import harness as h

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _freeze_training(tmp_path, run: str, attempt: int, which: str) -> tuple[int, float]:
    """SIGSTOP the training process of ``which`` node of ``attempt`` once it committed a checkpoint
    past its resume: ``peer``, the node without global rank 0, or ``rank0``. (node, when)."""
    folder = h.run_folder(tmp_path, run) / f"attempt-{attempt}"

    def logged(n: int) -> list[dict]:
        return [p for p in map(h.parse_progress, (folder / f"node-{n}.log").read_text().splitlines()) if p]

    h.wait_new_checkpoint(tmp_path, run, attempt, timeout=120)
    # c10d assigns ranks in join order: rank 0 is on the node whose log has the checkpoint lines
    rank0 = next(n for n in (0, 1) if any(p.get("event") == "checkpoint" for p in logged(n)))
    frozen = 1 - rank0 if which == "peer" else rank0
    workers = h.training_pids(run, attempt, frozen)
    assert workers
    at = time.time()
    for pid in workers:
        h.os.kill(pid, signal.SIGSTOP)
    return frozen, at


def test_a_frozen_node_is_lost_within_node_silence_timeout_and_resumed(tmp_path):
    """A node's training process frozen (its torchrun agent runs on and looks healthy), one per
    attempt. Attempt 0: the node without global rank 0, which rank 0's reader names. Attempt 1:
    the node of global rank 0, the reader itself, which group rank 1's witness names. Attempt 2
    runs to the end, bit-identical to an uninterrupted run."""
    run = "silent"
    spec = h.write_spec(tmp_path, run, steps=80, sleep=0.2, job_args=["--beat"],
                        restart={"heartbeat_timeout": "10m", "node_silence_timeout": "5s"})
    w = h.Watch(spec, tmp_path)
    frozen = {}
    for attempt, which in enumerate(("peer", "rank0")):     # an attempt not begun has no progress yet
        frozen[attempt] = _freeze_training(tmp_path, run, attempt, which)
    assert w.wait() == 0, w.output
    rec = h.record(tmp_path, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["node_lost", "node_lost", "succeeded"], rec["final_report"]
    for attempt, (node, at) in frozen.items():
        got = rec["attempts"][attempt]
        assert "no liveness beat" in got["evidence"] and f"localhost-{node}" in got["evidence"], got["evidence"]
        assert got["failed_host"] == f"localhost-{node}"
        print(f"attempt {attempt}: frozen -> torn down in {got['ended_at'] - at:.1f} s (node_silence_timeout 5 s)")
    assert "node_silent" in w.output
    assert h.final_state(spec) == h.counter_state(80)
    assert not h.leftover_processes(run)
