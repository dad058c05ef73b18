"""Kubernetes (simulated): a replacement node whose image pull takes 5 minutes (issue 23 item 3).

Attempt 0 runs on two nodes and commits a checkpoint; one node is deleted (the loss is seen at
once: NodeDeleted). Attempt 1 excludes it and lands on the survivor's node and on a node that
has never pulled the image: its pull takes PULL_S (Kubernetes seconds). Every pod runs
torchrun's agent as the fake models it (tests/kube/fakeapi/agent.py): it waits at the
rendezvous for every pod of its Job and gives up after the timeouts on its command line; here
rendezvous.join_timeout is 2m, shorter than the pull. Kubernetes durations, the spec's and the
product's own waits are played SCALE times faster; figures are printed in Kubernetes seconds.

Compared: wmctl now (the rendezvous waits restart.image_pull_timeout more: the run continues) and
main before (torchrun's timeouts were the spec's alone: the survivor's agent gave up while its peer
pulled, the attempt was a `rendezvous` failure with no new checkpoint, and the run stopped).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Any

from orchestrator.backends.kubernetes import render, teardown
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.runtime.protocol import format_progress
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore, RunRecord
from orchestrator import supervisor
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView
from tests.kube.conftest import make_client
from tests.kube.fakeapi.cluster import Cluster, Timings
from tests.kube.fakeapi.server import FakeApiServer

SCALE = 0.01
PULL_S = 300.0


def trial(*, before: bool, restart_s: float = 10.0, pull_s: float = PULL_S) -> dict[str, Any]:
    S = SCALE
    os.environ["WMCTL_HOME"] = tempfile.mkdtemp(prefix="wmctl-bench-pull-")
    server = FakeApiServer().start()
    cluster = Cluster(server.api, Timings(scale=S))
    for n in ("node-a", "node-b", "node-c"):
        cluster.add_node(n, capacity={"cpu": "1"})          # one pod per node
    spec = from_dict({
        "name": "cp", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "rendezvous": {"join_timeout": "2m"},
        "restart": {"max_attempts": 3, "backoff": 0, "heartbeat_timeout": "10m"},
    })
    # restart.image_pull_timeout stays 30m: in the torchrun line it is Kubernetes seconds (the fake
    # scales them); the watcher's own bound on the pull (real seconds here) is not reached
    cluster.script(job="cp-a0", run_seconds=None, logs=[(0.0, format_progress("checkpoint", step=10))])
    resumed = [(restart_s * S, format_progress("resume", step=10)), (restart_s * S + 0.5 * S,
                                                                      format_progress("step", step=11))]
    cluster.start()
    backend = KubernetesBackend(make_client(server.url), watch_timeout=30)
    real_args = render.torchrun_args
    if before:        # main before: torchrun's timeouts were the spec's alone
        render.torchrun_args = lambda *a, peer_start_s=0.0, **kw: real_args(*a, **kw)   # type: ignore[assignment]
    gone_poll_s = teardown.GONE_POLL_S
    teardown.GONE_POLL_S = gone_poll_s * S
    store = LocalRunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="cp.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[tuple[float, str]] = []
    sup = supervisor.Supervisor(spec, load_profile("cpu"), backend, store, record,
                                EchoView(lambda ln: lines.append((time.time(), ln))),
                                supervisor.SupervisorOptions(auto_resume=True,
                                                             poll_interval=supervisor.POLL_INTERVAL_S * S))
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("outcome", sup.run()), daemon=True)
    thread.start()
    try:
        def running(job: str) -> list[dict]:
            return [p for p in server.api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]
        deadline = time.time() + 60
        while not (len(running("cp-a0")) == 2 and any("checkpoint" in ln for _, ln in lines)):
            if time.time() > deadline:
                raise RuntimeError("attempt 0 never ran:\n" + "\n".join(ln for _, ln in lines))
            time.sleep(0.01)
        used = {p["spec"]["nodeName"] for p in running("cp-a0")}
        victim = sorted(used)[-1]
        cold = ({"node-a", "node-b", "node-c"} - used).pop()    # never pulled the image: its pull is cold
        cluster.script(job="cp-a1", rendezvous=True, run_seconds=(restart_s + 2) * S, logs=resumed)
        cluster.script(job="cp-a1", when=lambda p: p["spec"].get("nodeName") == cold, rendezvous=True,
                       run_seconds=(restart_s + 2) * S, start_delay=pull_s * S, logs=resumed)
        killed = time.time()
        cluster.delete_node(victim)
        thread.join(timeout=(pull_s + 2400) * S + 60)
        outcome = result.get("outcome")
        resumed_at = next((t for t, ln in lines if ln.startswith("attempt 1: resumed from step")), None)
        attempts = store.load().attempts
        return {"continued": bool(outcome is not None and outcome.exit_code == 0),
                "lost_s": (resumed_at - killed) / S if resumed_at else None,
                "attempts": [(a.attempt, a.outcome or "-") for a in attempts],
                "report": outcome.report if outcome is not None else "watcher still running"}
    finally:
        render.torchrun_args = real_args        # type: ignore[assignment]
        teardown.GONE_POLL_S = gone_poll_s
        backend.close()
        cluster.stop()
        server.stop()


def cold_pull(trials: int, restart_s: float) -> None:
    print(f"\nreplacement node pulls the image for {PULL_S:.0f} s (rendezvous.join_timeout 2m), Kubernetes timings "
          f"played {1 / SCALE:.0f}x faster, printed in Kubernetes seconds; restart of a pod to its first resumed "
          f"step assumed {restart_s:g} s:")
    for label, before in (("main before: torchrun's timeouts the spec's alone", True),
                          ("now: the rendezvous waits restart.image_pull_timeout (30m) more", False)):
        for i in range(trials):
            r = trial(before=before, restart_s=restart_s)
            lost = f"{r['lost_s']:.0f} s" if r["lost_s"] is not None else "-"
            print(f"  {label}, trial {i}: run continues: {'yes' if r['continued'] else 'NO'}; "
                  f"time lost (node deleted -> first resumed step): {lost}; attempts {r['attempts']}", flush=True)
            if not r["continued"]:
                print(f"    {r['report'][:300]}")
