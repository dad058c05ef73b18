"""Kubernetes (simulated): a machine dies with and without a spare node (issue 25), the
replacement's image pull taking 5 minutes.

The real supervisor and Kubernetes backend against the fake API server (tests/kube/fakeapi),
Kubernetes durations, the spec's and the product's own waits played SCALE times faster; figures
printed in Kubernetes seconds. A 2-node attempt commits checkpoint 10; node 1's machine dies. The
runtime's beat finds it (restart.node_silence_timeout 15 s: rank 0 reports the silence 3 s after
the last beat, then every 2 s, as liveness.py does).

- with one spare (restart.spares: 1): the watcher fences the lost pod and writes round 1 to the
  rounds ConfigMap; the keepers (emulated here: the fake runs no process) hear of it through their
  watch (KEEPER_POLL_S at most, assumed) and their new round reaches its first resumed step
  RESTART_IN_PLACE_S later (--in-place-s: the keeper's prewarmed torchrun, rendezvous, worker
  start, checkpoint load; measured on local at 3.4-4.5 s, docs/spares.md). The new spare that
  replaces the used one (an elastic Job index) lands on a node that has never pulled the image:
  its 5-minute pull runs in the background.
- without: a new attempt, excluding the dead node, lands on a node that has never pulled the
  image: its pull (PULL_S) is on the critical path, then RESTART_S (--restart-s) to the first
  resumed step.

    PYTHONPATH=. python bench/bench_kube_recovery.py --only spares [--spare-trials 3]
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Any

from orchestrator import supervisor
from orchestrator.backends.kubernetes import teardown
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.backends.kubernetes.spares import rounds_name
from orchestrator.runtime.keeper import newest_of
from orchestrator.runtime.protocol import format_progress
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore, RunRecord
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView
from tests.kube.conftest import make_client
from tests.kube.fakeapi.cluster import Cluster, Timings
from tests.kube.fakeapi.server import FakeApiServer

SCALE = 0.02
PULL_S = 300.0
SILENCE_S = 15.0
KEEPER_POLL_S = 0.25     # a watch's news: the API server's fan-out, well under this
NODES = ("node-a", "node-b", "node-c", "node-d", "node-e")


def _round(server: FakeApiServer, ns: str) -> int:
    """The newest round of attempt 0's rounds ConfigMap (-1: none)."""
    found = server.api.store.list("configmaps", ns, lambda cm: cm["metadata"]["name"] == rounds_name("sp-a0"))[0]
    current = newest_of((found[0].get("data") or {}) if found else {})
    return int(current["round"]) if current is not None else -1


def _start_runtime(server: FakeApiServer, reporter: dict, dead: str, killed: float, stop: threading.Event,
                   in_place_s: float | None) -> None:
    """What the fake does not run, emulated on rank 0's pod log: its runtime's liveness reports
    about the dead node and, with a spare, the round's keepers resuming."""
    S = SCALE
    ns, container = reporter["metadata"]["namespace"], reporter["spec"]["containers"][0]["name"]

    def beat_reader() -> None:
        # rank 0's runtime (liveness.py): 3 s after the last beat, then every 2 s; it goes with its
        # round (a keeper kills its torchrun, and the runtime with it, when a newer round names it)
        silent = 3.0
        while not stop.wait(max(0.0, silent * S - (time.time() - killed))) and _round(server, ns) < 1:
            server.api.append_log(ns, reporter["metadata"]["name"], container,
                                  format_progress("node_silent", host=dead, silent_s=round(silent * S, 3),
                                                  group_rank=1))
            silent += 2.0

    def keepers() -> None:           # the round's keepers: read the rounds, restart, resume
        while not stop.wait(KEEPER_POLL_S * S):
            if _round(server, ns) >= 1:
                stop.wait((in_place_s or 0.0) * S)
                for event, step in (("resume", 10), ("step", 11)):
                    server.api.append_log(ns, reporter["metadata"]["name"], container,
                                          format_progress(event, step=step))
                return
    threading.Thread(target=beat_reader, daemon=True).start()
    if in_place_s is not None:
        threading.Thread(target=keepers, daemon=True).start()


def trial(*, spares: int, in_place_s: float, restart_s: float, pull_s: float = PULL_S) -> dict[str, Any]:
    S = SCALE
    os.environ["WMCTL_HOME"] = tempfile.mkdtemp(prefix="wmctl-bench-spares-")
    server = FakeApiServer().start()
    cluster = Cluster(server.api, Timings(scale=S))
    for n in NODES:
        cluster.add_node(n, capacity={"cpu": "1.5"})      # one node's pod (and the small store) per node
    spec = from_dict({
        "name": "sp", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": 0, "heartbeat_timeout": "10m", "spares": spares},
    })
    spec.restart.node_silence_timeout = SILENCE_S * S
    warm: set[str] = set()            # the nodes that pulled the image for attempt 0: the rest pull cold
    cold = lambda p: p["spec"].get("nodeName") not in warm    # noqa: E731
    cluster.script(job="sp-a0", run_seconds=None, sigterm_seconds=None)
    cluster.script(job="sp-a0", index=0, run_seconds=None, sigterm_seconds=None,
                   logs=[(0.0, format_progress("checkpoint", step=10)), (0.05, format_progress("step", step=12))])
    cluster.script(when=lambda p: p["metadata"]["name"].endswith("-store"), run_seconds=None)
    resumed = [(restart_s * S, format_progress("resume", step=10)),
               (restart_s * S + 0.5 * S, format_progress("step", step=11))]
    # torchrun's agents wait at the rendezvous for every pod of the attempt (fakeapi/agent.py)
    cluster.script(job="sp-a1", rendezvous=True, run_seconds=(restart_s + 2) * S, logs=resumed)
    cluster.start()
    backend = KubernetesBackend(make_client(server.url), watch_timeout=30)
    gone_poll_s = teardown.GONE_POLL_S
    teardown.GONE_POLL_S = gone_poll_s * S
    store = LocalRunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="sp.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[tuple[float, str]] = []
    sup = supervisor.Supervisor(spec, load_profile("cpu"), backend, store, record,
                                EchoView(lambda ln: lines.append((time.time(), ln))),
                                supervisor.SupervisorOptions(auto_resume=True,
                                                             poll_interval=supervisor.POLL_INTERVAL_S * S))
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    stop = threading.Event()

    def running(job: str) -> list[dict]:
        return [p for p in server.api.store.list("pods")[0]
                if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]

    def first(pred, limit_s: float = 1200.0) -> float | None:
        deadline = time.time() + limit_s * S + 30
        while time.time() < deadline:
            hit = next((t for t, ln in lines if pred(ln)), None)
            if hit is not None:
                return hit
            time.sleep(0.005)
        return None

    try:
        deadline = time.time() + 300
        while not (len(running("sp-a0")) == 2 + spares and any("checkpoint" in ln for _, ln in lines)):
            if time.time() > deadline:
                raise RuntimeError("attempt 0 never ran:\n" + "\n".join(ln for _, ln in lines))
            time.sleep(0.01)
        by_index = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p for p in running("sp-a0")}
        warm.update(p["spec"]["nodeName"] for p in by_index.values())
        # every pod that starts from now on, on a node that never pulled the image, pulls for PULL_S
        cluster.script(job="sp-a0", when=cold, run_seconds=None, start_delay=pull_s * S)
        cluster.script(job="sp-a1", when=cold, rendezvous=True, run_seconds=(restart_s + 2) * S,
                       start_delay=pull_s * S, logs=resumed)
        dead, reporter = by_index["1"]["spec"]["nodeName"], by_index["0"]
        killed = time.time()
        cluster.kill_node(dead)

        _start_runtime(server, reporter, dead, killed, stop, in_place_s if spares else None)
        replaced = first(lambda ln: "takes its place in round" in ln or ln.startswith("attempt 0 failed"))
        back = first(lambda ln: " resumed from step" in ln)
        out: dict[str, Any] = {"path": "in place" if any("takes its place" in ln for _, ln in lines) else "new attempt"}
        if replaced is not None:
            out["detect"] = (replaced - killed) / S
        if back is not None:
            out["total"] = (back - killed) / S
            out["after detect"] = (back - (replaced or killed)) / S
        if spares and back is not None:      # the used spare's replacement: a new index, pulling meanwhile
            first(lambda ln: "started in the background" in ln, limit_s=60.0)
            out["new spare pulling"] = cluster.run_until(lambda: any(
                p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "3"
                and p["status"].get("phase") == "Pending" for p in server.api.store.list("pods")[0]), timeout=10)
        if os.environ.get("KSP_DEBUG"):
            for t, ln in lines:
                print(f"{(t - killed) / S:8.1f} {ln}")
        return out
    finally:
        teardown.GONE_POLL_S = gone_poll_s
        stop.set()
        backend.close()
        cluster.stop()
        server.stop()


def spares_report(trials: int, in_place_s: float, restart_s: float) -> None:
    goal = SILENCE_S + 10.0
    print(f"\nmachine death -> first resumed step, with and without a spare (alternating), the replacement's image "
          f"pull {PULL_S:.0f} s; Kubernetes timings played {1 / SCALE:.0f}x faster, printed in Kubernetes seconds; "
          f"node_silence_timeout {SILENCE_S:g} s; in place: keepers hear of the round within {KEEPER_POLL_S:g} s and "
          f"resume {in_place_s:g} s later (assumed); a new attempt's pod resumes {restart_s:g} s after it runs "
          "(assumed). This machine is shared and busy: the controller loop's latencies are magnified "
          f"{1 / SCALE:.0f}x.")
    rows: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for i in range(trials):
        for spares in (0, 1):
            r = trial(spares=spares, in_place_s=in_place_s, restart_s=restart_s)
            rows[spares].append(r)
            print(f"  trial {i}, spares {spares}: " + json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                                                 for k, v in r.items()}), flush=True)
    for spares, rs in rows.items():
        totals = sorted(r["total"] for r in rs if "total" in r)
        if not totals:
            print(f"  spares {spares}: never resumed")
            continue
        median = totals[len(totals) // 2]
        print(f"  spares {spares}: median {median:.1f} s, worst {totals[-1]:.1f} s"
              + (f"; goal <= node_silence_timeout + 10 s = {goal:g} s: {'met' if totals[-1] <= goal else 'MISSED'}"
                 if spares else ""))
