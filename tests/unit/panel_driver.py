"""Drives the watcher's display (make_display, as `wmctl watch` makes it) with the news a
supervisor sends after a lost node: a failed attempt, a backoff of ``--backoff`` seconds, lines.
Run by tests/unit/test_panel_terminal.py in a real pseudo-terminal and in a pipe.

    python tests/unit/panel_driver.py [--plain] [--backoff S] [--hold S]
"""

from __future__ import annotations

import argparse
import time

from orchestrator.backends import base as b
from orchestrator.display import make_display
from orchestrator.state import AttemptRecord, RunRecord
from orchestrator.watchview import News

ap = argparse.ArgumentParser()
ap.add_argument("--plain", action="store_true")
ap.add_argument("--backoff", type=float, default=0.0)
ap.add_argument("--hold", type=float, default=0.3)
args = ap.parse_args()

now = time.time()
record = RunRecord(run="drive", backend="local", spec_path="", overrides={}, spec_hash="", auto_resume=True,
                   created_at=now - 30)
a0 = AttemptRecord(0, now - 30, last_step=12, last_checkpoint_step=10)
record.attempts.append(a0)
nodes = [b.NodeStatus(0, b.RUNNING, "localhost-0"), b.NodeStatus(1, b.RUNNING, "localhost-1")]
timing = {"step_s": 0.08, "compute_share": 0.62, "data_share": 0.33, "comm_share": 0.05, "bottleneck": "compute"}
events = [b.Event(b.PROGRESS, now - 20, 0, "localhost-0",
                  progress={"event": "start", "max_steps": 40, "time": now - 20})]
events += [b.Event(b.PROGRESS, now - 12 + s, 0, "localhost-0",
                   progress={"event": "step", "step": s, "loss": 1.0 / s, "samples": 8 * s, "timing": timing,
                             "time": now - 12 + s}) for s in range(1, 13)]
events.append(b.Event(b.PROGRESS, now - 2, 0, "localhost-0", progress={"event": "checkpoint", "step": 10,
                                                                          "time": now - 2}))

display = make_display(plain=args.plain)
try:
    display.line("attempt 0 submitted on local (2 node(s))", now - 30)
    display.line("attempt 0: step 12 loss 0.0833, 80.0 ms: compute 62% data 33% comm 5%", now - 1)
    display.news(News(record, a0, nodes, events, now - 1, 25.0))
    if args.backoff:
        a0.outcome, a0.decision, a0.failed_node = "node_lost", "retry", 0
        a0.evidence = "the node's processes vanished without an exit status (killed)"
        display.line(f"attempt 0 failed: node_lost on node 0 -> decision: retry; backing off {args.backoff:.0f} s")
        lost = [b.NodeStatus(0, b.LOST, "localhost-0"), nodes[1]]
        display.news(News(record, a0, lost, [], now - 1, 25.0, backoff_until=time.time() + args.backoff))
    time.sleep(args.hold)
finally:
    display.close()
