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

``--goodput`` (local): goodput, useful step time over wall time, for a run with one node death
per 100 steps (SIGKILL of a training node's whole group at steps 100, 200, 300 of 400, a
checkpoint every 20 steps), with no spare (each death a new attempt) and with one replenished
spare (each death in place), beside the same run with no death (the ceiling). Useful step time
is the run's steps times its median step interval: what the steps cost had nothing failed.

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


def spare_trial(home: Path, name: str, sig: int = signal.SIGKILL) -> dict:
    """Node 1 SIGKILLed (or frozen: SIGSTOP) and replaced in place by the spare: the split of
    kill -> first resumed step."""
    spec = write_spec(home, name, "local", steps=60, every=5, sleep=0.1, spares=1)
    data = yaml.safe_load(spec.read_text())
    data["env"] = {"LOGLEVEL": "INFO"}          # torchrun's INFO lines carry the rendezvous' end
    spec.write_text(yaml.safe_dump(data))
    w = h.Watch(spec, home)
    h.wait_until(lambda: any(p["event"] == "step" and p["step"] >= 12 for p in h.progress(home, name, 0)),
                 300, "step 12")
    killed_at = time.time()
    kill("local", name, 1, sig)
    code = w.wait(600)
    if code != 0:
        raise SystemExit(f"{name}: wmctl exited {code}\n{w.output[-3000:]}")
    return spare_split(home, name, w.output, killed_at, "node-*.pid.json")


def spare_split(home: Path, name: str, output: str, killed_at: float, pid_files: str) -> dict:
    """The split of kill -> first resumed step of an in-place recovery, from the run's record,
    its keepers' pid files (``pid_files``, a glob in the attempt folder) and its logs: local's
    and Docker's benches alike."""
    rec = h.record(home, name)
    a0 = rec["attempts"][0]
    if len(rec["attempts"]) != 1 or not a0.get("recoveries"):
        raise SystemExit(f"{name}: no in-place recovery\n{output[-3000:]}")
    decided = a0["recoveries"][0]["time"]
    folder = h.run_folder(home, name) / "attempt-0"
    pids = [json.loads(p.read_text()) for p in folder.glob(pid_files)]
    started = max(p["started"] for p in pids if p.get("round") == 1)
    later = [p for p in h.progress(home, name, 0) if p.get("time", 0) > decided]
    resumed = min(p["time"] for p in later if p["event"] == "resume")
    first = min(p["time"] for p in later if p["event"] == "step" and p["time"] >= resumed)   # not the old round's
    met = [t for t in (rendezvous_done(log, decided) for log in folder.glob("node-*.log")) if t is not None]
    rdzv = max(met) if met else started
    return {"detect": decided - killed_at, "worker restart": started - decided, "re-rendezvous": rdzv - started,
            "start+load": resumed - rdzv, "first step": first - resumed, "total": first - killed_at}


def spare_comparison(home: Path, trials: int) -> None:
    keys = ["detect", "worker restart", "re-rendezvous", "start+load", "first step", "total"]
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        without, with_spare = [], []
        tag = "kill" if sig == signal.SIGKILL else "stop"
        for i in range(trials):       # alternating, so a machine that gets busier hurts both alike
            without.append(one_trial("local", home, f"nospare-{tag}{i}", at_step=12, steps=60, every=5, sleep=0.1,
                                     sig=sig))
            with_spare.append(spare_trial(home, f"spare-{tag}{i}", sig))
        what = "SIGKILL" if sig == signal.SIGKILL else "SIGSTOP (frozen)"
        show(f"local, no spare: {what} of node 1 -> first resumed step (a new attempt)", without)
        print(f"\nlocal, one spare: {what} of node 1 -> first resumed step (in place, no new attempt)")
        print("  trial " + " ".join(f"{k:>17}" for k in keys))
        for i, r in enumerate(with_spare):
            print(f"  {i:>5} " + " ".join(f"{r[k]:>16.2f}s" for k in keys))
        print("  median" + " ".join(f"{statistics.median(r[k] for r in with_spare):>16.2f}s" for k in keys))
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (goal <= 3 s on a quiet machine "
          "for SIGKILL; node_silence_timeout + 3 s for a frozen node)")


def newest_step(home: Path, name: str) -> tuple[int, int]:
    """(attempt, step) of the newest step line of the run's newest attempt, (-1, -1) before one."""
    folder = h.run_folder(home, name)
    attempts = sorted(int(p.name.split("-")[1]) for p in folder.glob("attempt-*"))
    if not attempts:
        return -1, -1
    steps = [p["step"] for p in h.progress(home, name, attempts[-1]) if p["event"] == "step"]
    return attempts[-1], max(steps, default=-1)


def active_slot(home: Path, name: str, attempt: int, avoid: int) -> int:
    """A training node of the attempt's newest round other than ``avoid`` where it can (spares), else 1."""
    rounds = sorted((h.run_folder(home, name) / f"attempt-{attempt}" / "rounds").glob("round-*.json"))
    if not rounds:
        return 1
    active = json.loads(rounds[-1].read_text())["active"]
    return next((slot for slot in active if slot != avoid), active[0])


def goodput_trial(home: Path, name: str, *, spares: int, deaths: bool, steps: int = 400, period: int = 100) -> dict:
    spec = write_spec(home, name, "local", steps=steps, every=20, sleep=0.1, spares=spares)
    data = yaml.safe_load(spec.read_text())
    data["restart"]["max_attempts"] = 10
    spec.write_text(yaml.safe_dump(data))
    started = time.time()
    w = h.Watch(spec, home)
    next_kill, last_victim, killed = period, -1, []
    while w.proc.poll() is None:
        attempt, step = newest_step(home, name)
        if deaths and step >= next_kill and next_kill < steps:
            victim = active_slot(home, name, attempt, last_victim)
            if h.kill_node(name, attempt, victim):
                killed.append((attempt, victim, step))
                last_victim = victim
            next_kill += period
        time.sleep(0.05)
    wall = time.time() - started
    if w.wait(10) != 0:
        raise SystemExit(f"{name}: wmctl exited {w.proc.returncode}\n{w.output[-3000:]}")
    rec = h.record(home, name)
    intervals = []
    for a in rec["attempts"]:
        times = {}
        for p in h.progress(home, name, a["attempt"]):
            if p["event"] == "step":
                times[p["step"]] = p["time"]       # a redone step: its last run
        ordered = sorted(times.items())
        intervals += [t2 - t1 for (s1, t1), (s2, t2) in zip(ordered, ordered[1:], strict=False)
                      if s2 == s1 + 1 and t2 > t1]
    useful = steps * statistics.median(intervals)
    return {"wall": wall, "useful": useful, "goodput": useful / wall, "deaths": len(killed),
            "attempts": len(rec["attempts"]), "in place": sum(len(a.get("recoveries", [])) for a in rec["attempts"])}


def goodput(home: Path, trials: int) -> None:
    cases = [("no death", 0, False), ("no spare", 0, True), ("one spare, replenished", 1, True)]
    rows: dict[str, list[dict]] = {label: [] for label, _, _ in cases}
    for i in range(trials):       # alternating, so a machine that gets busier hurts every case alike
        for label, spares, deaths in cases:
            rows[label].append(goodput_trial(home, f"gp-{spares}{int(deaths)}-{i}", spares=spares, deaths=deaths))
    print("\nlocal goodput: 400 steps of 0.1 s, a checkpoint every 20, one node SIGKILLed per 100 steps")
    print(f"  {'case':<24} {'wall':>8} {'useful':>8} {'goodput':>8} {'deaths':>7} {'attempts':>9} {'in place':>9}")
    for label, got in rows.items():
        for r in got:
            print(f"  {label:<24} {r['wall']:>7.1f}s {r['useful']:>7.1f}s {r['goodput']:>8.1%} {r['deaths']:>7} "
                  f"{r['attempts']:>9} {r['in place']:>9}")
        print(f"  {label + ' (median)':<24} {'':>8} {'':>8} {statistics.median(r['goodput'] for r in got):>8.1%}")
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


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
    parser.add_argument("--goodput", action="store_true",
                        help="local: goodput with one node death per 100 steps, without and with a spare")
    args = parser.parse_args()
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    home = Path(tempfile.mkdtemp(prefix="wmctl-bench-recovery-"))
    os.environ["WMCTL_HOME"] = str(home)
    if args.goodput:
        goodput(home, args.trials)
        shutil.rmtree(home, ignore_errors=True)
        return
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
