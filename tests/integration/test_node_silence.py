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


@pytest.mark.parametrize("which", ["peer", "rank0"])
def test_a_frozen_node_is_lost_within_node_silence_timeout_and_resumed(tmp_path, which):
    """A node's training process frozen (its torchrun agent runs on and looks healthy).
    ``peer``: the node without global rank 0: rank 0's reader names it. ``rank0``: the node of
    global rank 0, the reader itself: group rank 1's witness names it."""
    run = f"silent-{which}"
    spec = h.write_spec(tmp_path, run, steps=60, sleep=0.2, job_args=["--beat"],
                        restart={"heartbeat_timeout": "10m", "node_silence_timeout": "5s"})
    w = h.Watch(spec, tmp_path)
    h.wait_checkpoint(tmp_path, run, 0, 10)
    # c10d assigns ranks in join order: rank 0 is on the node whose log has the checkpoint lines
    rank0 = next(n for n in (0, 1) if any(p.get("event") == "checkpoint" for p in map(
        h.parse_progress, (h.run_folder(tmp_path, run) / "attempt-0" / f"node-{n}.log").read_text().splitlines()) if p))
    frozen = 1 - rank0 if which == "peer" else rank0
    workers = [pid for pid in h.node_pids(run, 0, frozen)
               if "counter.py" in h.cmdline(pid) and "torch.distributed.run" not in h.cmdline(pid)
               and "orchestrator.backends.local.agent" not in h.cmdline(pid)]
    assert workers
    frozen_at = time.time()
    for pid in workers:
        h.os.kill(pid, signal.SIGSTOP)
    assert w.wait() == 0, w.output
    rec = h.record(tmp_path, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["node_lost", "succeeded"], rec["final_report"]
    first = rec["attempts"][0]
    assert "no liveness beat" in first["evidence"] and f"localhost-{frozen}" in first["evidence"], first["evidence"]
    assert "node_silent" in w.output
    assert first["failed_host"] == f"localhost-{frozen}"
    print(f"frozen -> torn down in {first['ended_at'] - frozen_at:.1f} s (node_silence_timeout 5 s)")
    assert not h.leftover_processes(run)
