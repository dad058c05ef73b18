"""Node death -> first resumed training step on the real Slurm cluster (.ci/start-slurm.sh), through
the real `wmctl submit -b slurm --auto-resume`. Prints figures, asserts nothing.

The job is tests/integration/jobs/counter.py (2 nodes x 1 rank, gloo, c10d, the runtime's
per-node beat on, checkpoint every 5 steps, 0.2 s a step), restart.node_silence_timeout 3s. Each
trial is a fresh run: wait for a committed checkpoint, then node 1 of the allocation dies:

  SIGKILL  its slurmd, step daemons and tasks SIGKILLed (tests/slurm/conftest.py node_kill)
  SIGSTOP  the same processes frozen (a hung machine: nothing ends, no connection breaks)

and the supervisor recovers. The split, from the run record and Slurm:

  detect      death -> teardown starts (the failure classified)
  teardown    scancel of the attempt
  allocation  teardown end -> Slurm starts the next job (its StartTime, 1 s resolution), submit included
  start       job start -> the job's `resume` line (srun, torch import, rendezvous, restore)
  load        `resume` line -> first resumed step
  total       death -> first resumed step                      (goal < 15 s for SIGKILL)

Slurm's own detection is SlurmdTimeout-bound (this cluster sets 10 s: a node shows '*' after about
14 s and DOWN after about 27 s; at Slurm's default, 300 s, after 300 s or more); wmctl's does not
wait for it. Run as root on the CI machine (it kills and restarts slurmd):

    SLURM_CONF=/etc/wmctl-slurm/slurm.conf PYTHONPATH=. python bench/bench_slurm_recovery.py [--trials 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration import harness as h  # noqa: E402
from tests.slurm.conftest import DEFAULT_CONF, SlurmCluster, alive, conf_values  # noqa: E402

KEYS = ["detect", "teardown", "allocation", "start", "load", "total"]


def cluster() -> SlurmCluster:
    conf = Path(os.environ.get("SLURM_CONF") or DEFAULT_CONF)
    c = SlurmCluster(conf=conf, settings=conf_values(conf), nodes=[])
    c.nodes = sorted(c.node_states())
    os.environ["SLURM_CONF"] = str(conf)
    return c


def job_field(c: SlurmCluster, home: Path, run: str, attempt: int, key: str) -> str:
    job = json.loads((h.run_folder(home, run) / f"attempt-{attempt}" / "job.json").read_text())
    return c.job(job["job_id"]).get(key, "")


def one_trial(c: SlurmCluster, home: Path, run: str, sig: int) -> dict:
    spec = h.write_spec(home, run, steps=80, every=5, sleep=0.2, job_args=["--beat"],
                        restart={"node_silence_timeout": "3s", "heartbeat_timeout": "120s"})
    w = h.Watch(spec, home, "-b", "slurm")
    h.wait_checkpoint(home, run, 0, 10, timeout=180)
    nodelist = job_field(c, home, run, 0, "NodeList")
    victim = c.run("scontrol", "show", "hostnames", nodelist).stdout.split()[1]
    frozen: set[int] = set()
    died_at = time.time()
    if sig == signal.SIGKILL:
        c.node_kill(victim)
    else:
        frozen = c.node_processes(victim)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        c.killed.append(victim)
    try:
        code = w.wait(400)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        h.wait_until(lambda: not any(alive(pid) for pid in frozen), 30, "the frozen processes' end")
        c.node_revive(victim)
    if code != 0:
        raise SystemExit(f"{run}: wmctl exited {code}\n{w.output[-3000:]}")
    rec = h.record(home, run)
    a0 = rec["attempts"][0]
    t0 = a0["timings"]
    teardown_start = a0["ended_at"] - t0["teardown_s"]
    started = datetime.strptime(job_field(c, home, run, 1, "StartTime"), "%Y-%m-%dT%H:%M:%S").timestamp()
    progress = h.progress(home, run, 1)
    resume = next(p["time"] for p in progress if p["event"] == "resume")
    first = next(p["time"] for p in progress if p["event"] == "step")
    return {"detect": teardown_start - died_at, "teardown": t0["teardown_s"], "allocation": started - a0["ended_at"],
            "start": resume - started, "load": first - resume, "total": first - died_at,
            "outcome": a0["outcome"], "evidence": a0["evidence"], "victim": victim}


def show(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("  trial " + " ".join(f"{k:>11}" for k in KEYS))
    for i, r in enumerate(rows):
        print(f"  {i:>5} " + " ".join(f"{r[k]:>10.2f}s" for k in KEYS) + f"   {r['outcome']} {r['victim']}")
    print("  median" + " ".join(f"{statistics.median(r[k] for r in rows):>10.2f}s" for k in KEYS))
    print(f"  evidence (trial 0): {rows[0]['evidence'][:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    c = cluster()
    print(f"Slurm cluster {c.conf}: nodes {', '.join(c.nodes)}; SlurmdTimeout={c.settings.get('SlurmdTimeout', '300')}")
    home = Path(tempfile.mkdtemp(prefix="wmctl-bench-slurm-"))
    os.environ["WMCTL_HOME"] = str(home)
    for sig, name in ((signal.SIGKILL, "SIGKILL"), (signal.SIGSTOP, "SIGSTOP")):
        rows = [one_trial(c, home, f"bsr-{name.lower()}-{i}", sig) for i in range(args.trials)]
        show(f"slurm: {name} of node 1 -> first resumed step (node_silence_timeout 3 s, beat on)", rows)
    subprocess.run(["rm", "-rf", str(home)], check=False)


if __name__ == "__main__":
    main()
