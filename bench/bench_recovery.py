"""Node kill -> first resumed training step, through the real `wmctl submit --auto-resume`, on the
local and Docker backends; and steps redone per failure. Prints figures, asserts nothing.

The job is tests/integration/jobs/counter.py (2 nodes x 1 rank, gloo, c10d; a checkpoint restore
and a progress line per step). Each trial is a fresh run: wait for a committed checkpoint, SIGKILL
node 1 (local: every process of the node; Docker: `docker kill` of its container), let the
supervisor recover, then read the supervisor's own timings from the run record:

  detection     kill -> teardown starts (the supervisor has classified the failure)
  teardown      the whole attempt killed and removed
  resubmission  plan + submit of the next attempt
  restart       containers/processes start, torch import, rendezvous, restore, first step
  total         kill -> first step of the next attempt         (target < 15 s)

Then steps redone per failure: SIGKILL at a random step with the default checkpoint interval
(checkpoint.every_steps 200), and SIGTERM (graceful: the job checkpoints before it stops).

    PYTHONPATH=. python bench/bench_recovery.py [--backend local|docker|both] [--trials 3]
    PYTHONPATH=. python bench/bench_recovery.py --spares [--trials 3]

``--spares`` (local): the same kill, alternating a run without a spare (a new attempt) and one
with ``restart.spares: 1`` (the spare takes the node's place in place, docs/spares.md), with the
in-place path split into detect (kill -> the supervisor's decision), worker restart (decision ->
every keeper of the new round forked its torchrun: the old tree killed), re-rendezvous (-> the
last agent's "Rendezvous complete", torchrun's own INFO line), worker start + checkpoint load
(-> the job's `resume` line: a worker's interpreter, torch import, process group, the load) and
first step (-> the first step after it). Goal on a quiet machine: <= 3 s with the spare.

Docker needs an engine and the test base image (built on first use, see tests/docker/baseimage.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.runtime.protocol import parse_progress  # noqa: E402
from tests.integration import harness as h  # noqa: E402

IMAGE = "wmctl-bench/counter:latest"


def build_image() -> str:
    import docker

    from tests.docker.baseimage import ensure_base_image

    base = ensure_base_image(docker.from_env(timeout=900))
    ctx = Path(tempfile.mkdtemp(prefix="wmctl-bench-image-"))
    shutil.copy(h.JOBS / "counter.py", ctx / "counter.py")
    (ctx / "job.yaml").write_text(yaml.safe_dump({"name": "counter", "command": ["python", "counter.py"],
                                                 "image": {"vendor": "cpu", "base": base, "tag": IMAGE}}))
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "build-image", str(ctx / "job.yaml"), "--quiet"],
                   check=True, cwd=ctx, env={**os.environ, "PYTHONPATH": str(REPO)})
    return IMAGE


def write_spec(home: Path, name: str, backend: str, *, steps: int, every: int | None, sleep: float,
               spares: int = 0) -> Path:
    ckpt = home / f"ckpt-{name}"
    ckpt.mkdir(parents=True)
    command = ["python", "counter.py", "--steps", str(steps), "--sleep", str(sleep)]
    spec: dict = {"name": name, "nodes": 2, "nproc_per_node": 1, "affinity": "none",
                  "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s",
                              **({"spares": spares} if spares else {})},
                  "rendezvous": {"join_timeout": "60s"}}
    if every is not None:
        command += ["--every", str(every)]
        spec["checkpoint"] = {"every_steps": every}
    else:
        command += ["--every", "200"]        # the spec's default checkpoint.every_steps
    if backend == "local":
        spec["image"] = {"vendor": "cpu", "context": str(h.JOBS)}
        spec.setdefault("checkpoint", {})["dir"] = str(ckpt)
    else:
        spec["image"] = {"vendor": "cpu", "tag": IMAGE}
        spec["resources"] = {"shm": "256Mi"}
        spec["volumes"] = [{"name": "ckpt", "mount": "/workspace/ckpt", "host_path": str(ckpt)}]
        spec.setdefault("checkpoint", {})["dir"] = "/workspace/ckpt"
    spec["command"] = command
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def progress(backend: str, home: Path, run: str, attempt: int) -> list[dict]:
    if backend == "local":
        return h.progress(home, run, attempt)
    out = subprocess.run(["docker", "logs", f"{run}-a{attempt}-0"], capture_output=True, text=True)
    return [p for p in map(parse_progress, (out.stdout + out.stderr).splitlines()) if p]


def kill(backend: str, run: str, node: int, sig: int = signal.SIGKILL) -> None:
    if backend == "local":
        h.kill_node(run, 0, node, sig)
    else:
        verb = ["kill"] if sig == signal.SIGKILL else ["stop", "-t", "60"]
        subprocess.run(["docker", *verb, f"{run}-a0-{node}"], check=True, capture_output=True)


def one_trial(backend: str, home: Path, name: str, *, at_step: int, steps: int, every: int | None,
              sleep: float, sig: int = signal.SIGKILL) -> dict:
    spec = write_spec(home, name, backend, steps=steps, every=every, sleep=sleep)
    extra = ("--backend", "docker") if backend == "docker" else ()
    w = h.Watch(spec, home, *extra)
    h.wait_until(lambda: any(p["event"] == "step" and p["step"] >= at_step
                             for p in progress(backend, home, name, 0)), 300, f"step {at_step}")
    killed_at = time.time()
    if sig == signal.SIGTERM:
        for node in (0, 1):
            if backend == "local":
                h.signal_agent(home, name, 0, node, sig)
            else:
                kill(backend, name, node, sig)
    else:
        kill(backend, name, 1, sig)
    code = w.wait(600)
    if code != 0:
        raise SystemExit(f"{name}: wmctl exited {code}\n{w.output[-3000:]}")
    rec = h.record(home, name)
    a0, a1 = rec["attempts"][:2]
    t0, t1 = a0["timings"], a1["timings"]
    teardown_start = a0["ended_at"] - t0["teardown_s"]
    first_step = a1["submitted_at"] + t1["first_step_s"]
    return {"detection": teardown_start - killed_at, "teardown": t0["teardown_s"], "resubmission": t1["submit_s"],
            "restart": t1["first_step_s"] - t1["submit_s"], "total": first_step - killed_at,
            "redone": (a0["last_step"] or 0) - (a1["resumed_from_step"] or 0), "outcome": a0["outcome"]}


GLOG_TIME = re.compile(r"^I(\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*Rendezvous complete for workers")


def rendezvous_done(log: Path, after: float) -> float | None:
    """When torchrun (LOGLEVEL=INFO) said its rendezvous was complete, first time after ``after``."""
    year = time.localtime(after).tm_year
    for line in log.read_text(errors="replace").splitlines():
        m = GLOG_TIME.match(line)
        if m:
            month, day, hour, minute, sec = m.groups()
            at = time.mktime((year, int(month), int(day), int(hour), int(minute), 0, 0, 0, -1)) + float(sec)
            if at > after:
                return at
    return None


def spare_trial(home: Path, name: str) -> dict:
    """A SIGKILL of node 1 replaced in place by the spare: the split of kill -> first resumed step."""
    spec = write_spec(home, name, "local", steps=60, every=5, sleep=0.1, spares=1)
    data = yaml.safe_load(spec.read_text())
    data["env"] = {"LOGLEVEL": "INFO"}          # torchrun's INFO lines carry the rendezvous' end
    spec.write_text(yaml.safe_dump(data))
    w = h.Watch(spec, home)
    h.wait_until(lambda: any(p["event"] == "step" and p["step"] >= 12 for p in h.progress(home, name, 0)),
                 300, "step 12")
    killed_at = time.time()
    kill("local", name, 1)
    code = w.wait(600)
    if code != 0:
        raise SystemExit(f"{name}: wmctl exited {code}\n{w.output[-3000:]}")
    rec = h.record(home, name)
    a0 = rec["attempts"][0]
    if len(rec["attempts"]) != 1 or not a0.get("recoveries"):
        raise SystemExit(f"{name}: no in-place recovery\n{w.output[-3000:]}")
    decided = a0["recoveries"][0]["time"]
    folder = h.run_folder(home, name) / "attempt-0"
    started = max(json.loads(p.read_text())["started"] for p in folder.glob("node-*.pid.json")
                  if json.loads(p.read_text()).get("round") == 1)
    later = [p for p in h.progress(home, name, 0) if p.get("time", 0) > decided]
    resumed = min(p["time"] for p in later if p["event"] == "resume")
    first = min(p["time"] for p in later if p["event"] == "step")
    met = [t for t in (rendezvous_done(log, decided) for log in folder.glob("node-*.log")) if t is not None]
    rdzv = max(met) if met else started
    return {"detect": decided - killed_at, "worker restart": started - decided, "re-rendezvous": rdzv - started,
            "start+load": resumed - rdzv, "first step": first - resumed, "total": first - killed_at}


def spare_comparison(home: Path, trials: int) -> None:
    without, with_spare = [], []
    for i in range(trials):       # alternating, so a machine that gets busier hurts both alike
        without.append(one_trial("local", home, f"nospare-{i}", at_step=12, steps=60, every=5, sleep=0.1))
        with_spare.append(spare_trial(home, f"spare-{i}"))
    show("local, no spare: SIGKILL of node 1 -> first resumed step (a new attempt)", without)
    keys = ["detect", "worker restart", "re-rendezvous", "start+load", "first step", "total"]
    print("\nlocal, one spare: SIGKILL of node 1 -> first resumed step (in place, no new attempt)")
    print("  trial " + " ".join(f"{k:>17}" for k in keys))
    for i, r in enumerate(with_spare):
        print(f"  {i:>5} " + " ".join(f"{r[k]:>16.2f}s" for k in keys))
    print("  median" + " ".join(f"{statistics.median(r[k] for r in with_spare):>16.2f}s" for k in keys))
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (goal <= 3 s on a quiet machine)")


def show(title: str, rows: list[dict]) -> None:
    keys = ["detection", "teardown", "resubmission", "restart", "total"]
    print(f"\n{title}")
    print("  trial " + " ".join(f"{k:>13}" for k in keys) + "   redone")
    for i, r in enumerate(rows):
        print(f"  {i:>5} " + " ".join(f"{r[k]:>12.2f}s" for k in keys) + f"   {r['redone']:>6}")
    print("  median" + " ".join(f"{statistics.median(r[k] for r in rows):>12.2f}s" for k in keys))
    print("  max   " + " ".join(f"{max(r[k] for r in rows):>12.2f}s" for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "docker", "both"], default="both")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--spares", action="store_true", help="local: without and with a spare node, alternating")
    args = parser.parse_args()
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    home = Path(tempfile.mkdtemp(prefix="wmctl-bench-recovery-"))
    os.environ["WMCTL_HOME"] = str(home)
    if args.spares:
        spare_comparison(home, args.trials)
        shutil.rmtree(home, ignore_errors=True)
        return
    rng = random.Random(7)
    for backend in backends:
        if backend == "docker":
            build_image()
        rows = [one_trial(backend, home, f"rec-{backend[0]}{i}", at_step=12, steps=60, every=5, sleep=0.1)
                for i in range(args.trials)]
        show(f"{backend}: SIGKILL of node 1 -> first resumed step (checkpoint every 5 steps, 0.1 s/step)", rows)

        redone = []
        for i in range(args.trials):
            at = rng.randint(210, 390)
            r = one_trial(backend, home, f"red-{backend[0]}{i}", at_step=at, steps=450, every=None, sleep=0.02)
            redone.append((at, r["redone"]))
        print(f"{backend}: steps redone after SIGKILL at a random step, default interval (200): "
              + ", ".join(f"killed at {at}: {n}" for at, n in redone)
              + f"; mean {statistics.mean(n for _, n in redone):.0f}")
        term = one_trial(backend, home, f"term-{backend[0]}", at_step=25, steps=60, every=None, sleep=0.1,
                         sig=signal.SIGTERM)
        print(f"{backend}: steps redone after SIGTERM of every node: {term['redone']} "
              f"(attempt 0 {term['outcome']}; kill -> first resumed step {term['total']:.2f} s)")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
