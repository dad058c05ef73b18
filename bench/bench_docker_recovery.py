"""Docker: `docker kill` of a worker node -> first training step of the next attempt. Target < 15 s.

Runs the real Docker backend on the real engine with the test base image (present locally) and
the 2-node gloo job of tests/docker/data/backend (all_reduce + a progress line every 0.2 s). A
supervisor-like loop polls every POLL_S; on node 1's NODE_EXITED it cancels the attempt
(SIGKILL + remove of every container and the network) and submits attempt N+1 with node 1's
host excluded, then waits for that attempt's first step progress line from rank 0.

Prints, per trial and as median/max: detection (kill returned -> event polled), teardown
(cancel), resubmission (submit returned), rendezvous + first step (containers start, torch
import, c10d rendezvous, init_process_group, first all_reduce), total. There is no checkpoint
restore in this job: the supervisor's own bench adds it.

    PYTHONPATH=. python bench/bench_docker_recovery.py [--trials 3]
    PYTHONPATH=. python bench/bench_docker_recovery.py --spares [--trials 3]

``--spares``: through the real `wmctl submit --backend docker --auto-resume` with the counter job
(checkpoint every 5 steps, a restore on resume), `docker kill` of node 1 after step 12, alternating
a run without a spare (a new attempt: bench_recovery.py's split) and one with ``restart.spares: 1``
(the spare container takes node 1's place in round 1, docs/spares.md), split into detect (kill ->
the supervisor's decision), worker restart (-> every keeper of round 1 forked its torchrun),
re-rendezvous (-> the last agent's "Rendezvous complete"), worker start + checkpoint load (-> the
job's `resume` line) and first step. Goal on a quiet machine: <= 3 s with the spare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402

from orchestrator.backends import base  # noqa: E402
from orchestrator.backends.docker.engine import DockerBackend  # noqa: E402
from tests.docker.baseimage import ensure_base_image  # noqa: E402
from tests.docker.test_backend_docker import make_plan  # noqa: E402

POLL_S = 0.1
RUN = "dkb-bench"


def wait_for(be: DockerBackend, ref: base.AttemptRef, done, limit: float = 180.0) -> list[base.Event]:
    seen: list[base.Event] = []
    deadline = time.monotonic() + limit
    while True:
        seen += be.poll(ref).events
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {limit:.0f} s; events: {seen}")
        time.sleep(POLL_S)


def first_step(seen: list[base.Event]) -> bool:
    return any(e.kind == base.PROGRESS and e.progress.get("event") == "step" for e in seen)


def trial(client, image: str) -> dict[str, float]:
    be = DockerBackend(client)
    env = {"WMCTL_TEST_LOOP_S": "120"}
    try:
        ref = be.submit(make_plan(RUN, image, env=env))
        wait_for(be, ref, first_step)
        t0 = time.monotonic()
        client.containers.get(f"{RUN}-a0-1").kill()
        t_kill = time.monotonic()
        seen = wait_for(be, ref, lambda s: any(e.kind == base.NODE_EXITED and e.node == 1 for e in s), 60)
        lost = next(e for e in seen if e.kind == base.NODE_EXITED and e.node == 1)
        t_detect = time.monotonic()
        be.cancel(ref)
        t_down = time.monotonic()
        ref1 = be.submit(make_plan(RUN, image, env=env, attempt=1, exclude=(lost.host,)))
        t_submit = time.monotonic()
        wait_for(be, ref1, first_step)
        t_step = time.monotonic()
        be.cancel(ref1)
    finally:
        for a in be.attempts(RUN):
            be.cancel(a)
        be.close()
    return {"detection": t_detect - t_kill, "teardown": t_down - t_detect, "resubmission": t_submit - t_down,
            "rendezvous+first step": t_step - t_submit, "total": t_step - t0}


def spare_trial(home: Path, name: str) -> dict[str, float]:
    """`docker kill` of node 1 replaced in place by the spare container: the split of kill -> first
    resumed step, from the run record, the keepers' pid files and the archived container logs."""

    import yaml

    import bench_recovery as br
    from tests.integration import harness as h

    spec = br.write_spec(home, name, "docker", steps=60, every=5, sleep=0.1, spares=1)
    data = yaml.safe_load(spec.read_text())
    data["env"] = {"LOGLEVEL": "INFO"}          # torchrun's INFO lines carry the rendezvous' end
    spec.write_text(yaml.safe_dump(data))
    w = h.Watch(spec, home, "--backend", "docker")
    client = docker.from_env()

    def steps() -> list[dict]:
        out = []
        for slot in range(3):
            try:
                text = client.containers.get(f"{name}-a0-{slot}").logs().decode(errors="replace")
            except docker.errors.NotFound:
                continue
            out += [p for p in map(br.parse_progress, text.splitlines()) if p and p["event"] == "step"]
        return out

    h.wait_until(lambda: any(p["step"] >= 12 for p in steps()), 300, "step 12")
    killed_at = time.time()
    client.containers.get(f"{name}-a0-1").kill()
    code = w.wait(600)
    if code != 0:
        raise SystemExit(f"{name}: wmctl exited {code}\n{w.output[-3000:]}")
    return br.spare_split(home, name, w.output, killed_at, "slots/slot-*.pid.json")


def spare_comparison(trials: int) -> None:
    import os
    import shutil
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_recovery as br

    home = Path(tempfile.mkdtemp(prefix="wmctl-bench-docker-spares-"))
    os.environ["WMCTL_HOME"] = str(home)
    br.IMAGE = os.environ.get("WMCTL_BENCH_IMAGE", br.IMAGE)     # sessions side by side on one engine
    br.build_image()
    without, with_spare = [], []
    try:
        for i in range(trials):       # alternating, so a machine that gets busier hurts both alike
            without.append(br.one_trial("docker", home, f"dkbs-nospare-{i}", at_step=12, steps=60, every=5,
                                        sleep=0.1))
            with_spare.append(spare_trial(home, f"dkbs-spare-{i}"))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    br.show("docker, no spare: docker kill of node 1 -> first resumed step (a new attempt)", without)
    keys = ["detect", "worker restart", "re-rendezvous", "start+load", "first step", "total"]
    print("\ndocker, one spare: docker kill of node 1 -> first resumed step (in place, no new attempt)")
    print("  trial " + " ".join(f"{k:>17}" for k in keys))
    for i, r in enumerate(with_spare):
        print(f"  {i:>5} " + " ".join(f"{r[k]:>16.2f}s" for k in keys))
    print("  median" + " ".join(f"{statistics.median(r[k] for r in with_spare):>16.2f}s" for k in keys))
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (goal <= 3 s on a quiet machine)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--spares", action="store_true", help="without and with a spare container, alternating")
    args = ap.parse_args()
    if args.spares:
        spare_comparison(args.trials)
        return
    client = docker.from_env(timeout=900)
    image = ensure_base_image(client)
    rows = []
    for i in range(args.trials):
        row = trial(client, image)
        rows.append(row)
        print(f"trial {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
    for key in rows[0]:
        vals = [r[key] for r in rows]
        print(f"{key:>22}: median {statistics.median(vals):6.2f} s   max {max(vals):6.2f} s")
    total = statistics.median(r["total"] for r in rows)
    print(f"node kill -> first step of the next attempt: median {total:.2f} s (target < 15 s)")


if __name__ == "__main__":
    main()
