"""Kubernetes (simulated) at scale: a 1,024-node job in a 5,000-node cluster. Prints the
watcher's memory and CPU in steady state, the API requests it makes per minute, and how long
a node going Ready=Unknown takes to reach it as NODE_LOST (against a 3-node cluster for
comparison). Figures, never assertions.

The fake API server of tests/kube/fakeapi runs in a child process (its CPU is not the
watcher's), holding 5,000 Nodes of a realistic size (40 images, nodeInfo, addresses, five
conditions, 20 labels: about 8 KB of JSON each) and the attempt's 1,024 running pods (created
directly, with the Job controller's labels: the scripted cluster's controllers are not run at
this size). Steady state: each kubelet reports its Node every 5 minutes when nothing changes
(nodeStatusReportFrequency; heartbeats go to Leases, which wmctl does not read), so about 17
Node updates a second across the cluster, and rank 0 prints a step line a second. The watcher
is the real KubernetesBackend with the real client, polled every 0.25 s like the supervisor.

    PYTHONPATH=. python bench/bench_kube_scale.py [--nodes 5000] [--job-nodes 1024] [--window 30]
    PYTHONPATH=/tmp/main-export python bench/bench_kube_scale.py   # the same against another tree
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("WMCTL_BENCH_TREE", str(ROOT)))
sys.path.insert(1, str(ROOT))          # the fake API server and manifests come from this tree

POLL_S = 0.25


# --- the server process -----------------------------------------------------------------------
def realistic_node(i: int) -> dict:
    name = f"node-{i:05d}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": f"zone-{i % 3}",
              "topology.kubernetes.io/region": "region-1", "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.product": "H100-SXM5-80GB", "nvidia.com/cuda.driver.major": "550",
              **{f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in
                 ("AVX", "AVX2", "AVX512F", "AVX512BW", "AMXBF16", "FMA3", "SHA", "VAES", "VPCLMULQDQ", "XSAVE",
                  "ADX")}}
    conds = [{"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": f"kubelet has {r}",
              "lastHeartbeatTime": now, "lastTransitionTime": now}
             for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                          ("PIDPressure", "SufficientPID"), ("NetworkUnavailable", "RouteCreated"))]
    conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now})
    cap = {"cpu": "192", "memory": "2063731104Ki", "pods": "110", "nvidia.com/gpu": "8",
           "ephemeral-storage": "3750000000Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "providerID": f"aws:///zone/i-{i:017x}"},
            "status": {"capacity": cap, "allocatable": dict(cap), "conditions": conds,
                       "addresses": [{"type": "InternalIP", "address": f"10.1.{i // 250}.{i % 250}"},
                                     {"type": "Hostname", "address": name}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                       "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                                    "kernelVersion": "6.8.0-1015-aws", "osImage": "Ubuntu 22.04.4 LTS",
                                    "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.34.1",
                                    "kubeProxyVersion": "v1.34.1", "operatingSystem": "linux", "architecture": "amd64"},
                       "images": [{"names": [f"registry.example.com/team/image-{j}@sha256:{j:064x}",
                                             f"registry.example.com/team/image-{j}:v{j}"],
                                   "sizeBytes": 1_000_000_000 + j} for j in range(40)]}}


def serve(nodes: int, job_nodes: int, churn_per_s: float) -> None:  # noqa: C901 - one script of a cluster
    from tests.kube.fakeapi.api import RESOURCES
    from tests.kube.fakeapi.server import FakeApiServer

    server = FakeApiServer(history_limit=200_000).start()
    api = server.api
    for i in range(nodes):
        api.create(RESOURCES[("v1", "nodes")], None, realistic_node(i))
    print(json.dumps({"url": server.url}), flush=True)
    state = {"mark": 0, "rank0": None}

    def make_pods() -> None:
        while True:
            jobs = api.store.list("jobs")[0]
            if jobs:
                break
            time.sleep(0.05)
        job = jobs[0]
        tmpl = job["spec"]["template"]
        for i in range(job_nodes):
            pod = json.loads(json.dumps(tmpl))
            meta = pod.setdefault("metadata", {})
            meta["name"] = f"{job['metadata']['name']}-{i}-x{i:04d}"
            meta.setdefault("labels", {}).update({"batch.kubernetes.io/job-completion-index": str(i),
                                                  "job-name": job["metadata"]["name"]})
            meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(i)
            pod["spec"]["nodeName"] = f"node-{i:05d}"
            created = api.create(RESOURCES[("v1", "pods")], job["metadata"]["namespace"], pod)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

            def run(o: dict, now: str = now) -> None:
                o["status"] = {"phase": "Running", "startTime": now,
                               "conditions": [{"type": t, "status": "True"} for t in
                                              ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                               "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                                      "image": c.get("image", ""), "imageID": "", "started": True,
                                                      "state": {"running": {"startedAt": now}}}
                                                     for c in o["spec"]["containers"]]}
            api.store.update("pods", created["metadata"]["namespace"], created["metadata"]["name"], run)
            if i == 0:
                state["rank0"] = created
        print(json.dumps({"pods": job_nodes}), flush=True)

    def churn() -> None:
        step = 0
        last_log = time.monotonic()
        while True:
            time.sleep(1.0 / churn_per_s)
            name = f"node-{random.randrange(nodes):05d}"
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

            def report(o: dict, now: str = now) -> None:
                for c in o["status"]["conditions"]:
                    c["lastHeartbeatTime"] = now
            try:
                api.store.update("nodes", None, name, report)
            except Exception:      # noqa: BLE001 - a node this bench made Unknown by hand: fine
                pass
            r0 = state["rank0"]
            if r0 is not None and time.monotonic() - last_log >= 1.0:
                last_log = time.monotonic()
                step += 1
                line = 'WMCTL-PROGRESS {"event":"step","step":%d}' % step
                api.append_log(r0["metadata"]["namespace"], r0["metadata"]["name"],
                               r0["spec"]["containers"][0]["name"], line)

    threading.Thread(target=make_pods, daemon=True).start()
    threading.Thread(target=churn, daemon=True).start()
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "mark":
            with api.requests_lock:
                state["mark"] = len(api.requests)
            print(json.dumps({"marked": state["mark"]}), flush=True)
        elif cmd[0] == "stats":
            with api.requests_lock:
                reqs = api.requests[state["mark"]:]
            kinds: dict[str, int] = {}
            for r in reqs:
                what = ("watch " if r["query"].get("watch") in ("true", "1") else "") + r["verb"] + " " + \
                    "/".join(p for p in r["path"].split("/")[3:] if p and not p.startswith("node-") and "-a0" not in p)
                kinds[what] = kinds.get(what, 0) + 1
            print(json.dumps({"requests": len(reqs), "kinds": kinds}), flush=True)
        elif cmd[0] == "unknown":
            def unknown(o: dict) -> None:
                for c in o["status"]["conditions"]:
                    if c["type"] == "Ready":
                        c.update(status="Unknown", reason="NodeStatusUnknown",
                                 message="Kubelet stopped posting node status.")
            api.store.update("nodes", None, cmd[1], unknown)
            print(json.dumps({"unknown_at": time.time()}), flush=True)
        elif cmd[0] == "quit":
            break
    server.stop()


# --- the watcher (this process) --------------------------------------------------------------
def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(nodes: int, job_nodes: int, window: float, churn: float) -> dict[str, float]:
    from orchestrator.backends import base
    from orchestrator.backends.kubernetes.engine import KubernetesBackend
    from tests.kube.conftest import make_client
    from tests.kube.manifests import rendered_plan

    child = subprocess.Popen([sys.executable, __file__, "--serve", str(nodes), str(job_nodes), str(churn)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdin and child.stdout

    def ask(cmd: str | None = None) -> dict:
        if cmd:
            child.stdin.write(cmd + "\n")
            child.stdin.flush()
        return json.loads(child.stdout.readline())

    url = ask()["url"]
    rss0 = rss_mib()
    backend = KubernetesBackend(make_client(url))
    try:
        ref = backend.submit(rendered_plan("scale", 0, nodes=job_nodes))
        ask()                                        # the pods exist
        t0 = time.time()
        while True:
            obs = backend.poll(ref)
            if len(obs.nodes) == job_nodes and all(n.phase == base.RUNNING for n in obs.nodes):
                break
            time.sleep(POLL_S)
        synced = time.time() - t0
        time.sleep(3)                                # let the initial lists settle
        ask("mark")
        c0, w0 = cpu_s(), time.time()
        while time.time() - w0 < window:
            backend.poll(ref)
            time.sleep(POLL_S)
        cpu = (cpu_s() - c0) / (time.time() - w0)
        stats = ask("stats")
        rss = rss_mib()
        victim = f"node-{job_nodes // 2:05d}"
        at = ask(f"unknown {victim}")["unknown_at"]
        lost = None
        while lost is None and time.time() - at < 60:
            lost = next((e for e in backend.poll(ref).events if e.kind == base.NODE_LOST), None)
            if lost is None:
                time.sleep(0.01)
        detect = time.time() - at if lost else float("nan")
        return {"sync_s": synced, "rss_mib": rss, "rss_growth_mib": rss - rss0, "cpu_core_pct": 100 * cpu,
                "requests_per_min": stats["requests"] * 60 / window, "detect_s": detect,
                "kinds": stats["kinds"]}
    finally:
        backend.close()
        try:
            child.stdin.write("quit\n")
            child.stdin.flush()
        except BrokenPipeError:
            pass
        child.wait(timeout=30)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--job-nodes", type=int, default=1024)
    ap.add_argument("--window", type=float, default=30.0)
    args = ap.parse_args()
    churn = args.nodes / 300.0
    print(f"watcher of a {args.job_nodes}-node job in a {args.nodes}-node cluster (simulated; {churn:.0f} Node "
          f"updates/s, a step line/s; steady-state window {args.window:.0f} s); code: "
          f"{os.environ.get('WMCTL_BENCH_TREE', 'this tree')}", flush=True)
    big = measure(args.nodes, args.job_nodes, args.window, churn)
    small = measure(3, 2, min(args.window, 10.0), 3 / 300.0)
    print(f"  all pods seen running after {big['sync_s']:.1f} s")
    print(f"  memory: {big['rss_mib']:.0f} MiB RSS, {big['rss_growth_mib']:.0f} MiB of it grown since the "
          "watcher was created, the Kubernetes client's import included (goal < 200 MiB)")
    print(f"  CPU in steady state: {big['cpu_core_pct']:.1f} % of a core (goal < 5 %)")
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(big["kinds"].items()))
    print(f"  API requests: {big['requests_per_min']:.0f} per minute ({kinds})")
    print(f"  Ready=Unknown -> NODE_LOST: {big['detect_s']:.3f} s at {args.nodes} nodes, "
          f"{small['detect_s']:.3f} s at 3 nodes (polled every {POLL_S} s)")


if __name__ == "__main__":
    main()
