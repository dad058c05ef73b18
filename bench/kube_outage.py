"""Kubernetes (simulated): a control-plane outage during a resubmission (issue 23 item 2).

The real supervisor and backend against the fake API server (tests/kube/fakeapi): attempt 0 loses
a node; the moment its teardown is done the API server goes away for OUTAGE_S real seconds (the
old server's 429 "shutting down" for 5 s, then the load balancer's 503s, as a managed control
plane's upgrade looks: faults.py outage). The supervisor rides the resubmission through it
(Supervisor._ride_out). Printed: whether the run went on, when attempt 1 was submitted after the
outage began, and the time lost past the outage's end (the retry delay that was running when the
API came back). Wall-clock: a 2-minute outage takes 2 minutes.

    PYTHONPATH=. python bench/bench_kube_recovery.py --only outage [--outage-s 120]
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from tests.kube.conftest import make_client
from tests.kube.fakeapi.cluster import Cluster, Timings
from tests.kube.fakeapi.server import FakeApiServer

SCALE = 0.005
SHUTTING_DOWN_S = 5.0


def outage_trial(outage_s: float) -> dict[str, float | str]:
    from orchestrator.specload import from_dict
    from orchestrator.state import LocalRunStore, RunRecord
    from orchestrator.supervisor import Supervisor, SupervisorOptions
    from orchestrator.vendors import load_profile
    from orchestrator.watchview import EchoView

    os.environ["WMCTL_HOME"] = tempfile.mkdtemp(prefix="wmctl-bench-outage-")
    server = FakeApiServer().start()
    cluster = Cluster(server.api, Timings(scale=SCALE))
    for n in ("node-a", "node-b", "node-c"):
        cluster.add_node(n)
    spec = from_dict({
        "name": "ob", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "10m"},
    })
    cluster.script(job="ob-a0", run_seconds=None)
    cluster.script(job="ob-a0", index=0, run_seconds=None,
                   logs=[(0.0, 'WMCTL-PROGRESS {"event":"checkpoint","step":10}')])
    cluster.script(job="ob-a1", run_seconds=0.5)
    cluster.script(job="ob-a1", index=0, run_seconds=0.6, logs=[(0.0, 'WMCTL-PROGRESS {"event":"resume","step":10}')])
    cluster.start()
    backend = KubernetesBackend(make_client(server.url), watch_timeout=30)
    began: list[float] = []
    real_cancel = backend.cancel

    def cancel_then_outage(ref, graceful=False):
        real_cancel(ref, graceful=graceful)
        if ref.attempt == 0 and not began:
            server.faults.outage(outage_s - SHUTTING_DOWN_S, shutting_down_s=SHUTTING_DOWN_S)
            began.append(time.time())
    backend.cancel = cancel_then_outage      # type: ignore[method-assign]
    store = LocalRunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="ob.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[tuple[float, str]] = []
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record,
                     EchoView(lambda ln: lines.append((time.time(), ln))),
                     SupervisorOptions(auto_resume=True, poll_interval=0.05))
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.setdefault("outcome", sup.run()), daemon=True)
    thread.start()
    try:
        def running() -> list[dict]:
            return [p for p in server.api.store.list("pods")[0]
                    if p["metadata"]["labels"].get("job-name") == "ob-a0" and p["status"].get("phase") == "Running"]
        deadline = time.time() + 60
        while not (len(running()) == 2 and any("checkpoint" in ln for _, ln in lines)) and time.time() < deadline:
            time.sleep(0.01)
        victim = next(p["spec"]["nodeName"] for p in running()
                      if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        cluster.kill_node(victim)
        thread.join(timeout=outage_s + 120)
        outcome = result.get("outcome")
        submitted = next((t for t, ln in lines if ln.startswith("attempt 1 submitted")), None)
        if not began or submitted is None or outcome is None:
            raise RuntimeError("the outage trial did not get there:\n" + "\n".join(ln for _, ln in lines))
        return {"status": getattr(outcome, "status", "?"), "outage": outage_s,
                "resubmitted_after": submitted - began[0], "lost_past_outage": submitted - began[0] - outage_s}
    finally:
        backend.close()
        cluster.stop()
        server.stop()


def report(outage_s: float) -> None:
    r = outage_trial(outage_s)
    print(f"\nAPI outage of {outage_s:.0f} s ({SHUTTING_DOWN_S:.0f} s of 429 'shutting down', then 503) as attempt 1 "
          f"is resubmitted (simulated, wall clock):")
    print(f"  run {r['status']}: attempt 1 submitted {r['resubmitted_after']:.1f} s after the outage began; "
          f"time lost past its end {r['lost_past_outage']:.1f} s", flush=True)
