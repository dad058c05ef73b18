"""`wmctl cancel RUN` -> every process, container and network of the run gone, on the local and
Docker backends, with a watcher (`wmctl submit --auto-resume`) in another process. Prints
figures, asserts nothing. Goal: < 2 s on both.

Each trial is a fresh 2-node run of tests/integration/jobs/counter.py; once it has committed a
checkpoint, `wmctl cancel` runs and the clock stops when nothing of the run is left (local: no
process carrying its tag; Docker: no container or network with its run label). Also printed:
how long the `wmctl cancel` command itself took, and when the watcher exited (code 8).

    PYTHONPATH=. python bench/bench_cancel.py [--backend local|docker|both] [--trials 3] [--graceful]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))
from bench_recovery import build_image, progress, write_spec  # noqa: E402
from tests.integration import harness as h  # noqa: E402


def left(backend: str, run: str) -> list[str]:
    if backend == "local":
        return [str(p) for p in h.leftover_processes(run)]
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=wmctl.io/run={run}"], capture_output=True,
                         text=True).stdout.split()
    nets = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label=wmctl.io/run={run}"],
                          capture_output=True, text=True).stdout.split()
    return out + nets


def one_trial(backend: str, home: Path, name: str, graceful: bool) -> dict[str, float]:
    spec = write_spec(home, name, backend, steps=100000, every=5, sleep=0.05)
    extra = ("--backend", "docker") if backend == "docker" else ()
    w = h.Watch(spec, home, *extra)
    h.wait_until(lambda: any(p["event"] == "checkpoint" for p in progress(backend, home, name, 0)), 180,
                 "a checkpoint")
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "orchestrator.cli", "cancel", name] + (["--graceful"] if graceful else [])
    subprocess.run(cmd, env=w.env, cwd=str(REPO), capture_output=True, check=True)
    command_s = time.perf_counter() - started
    while left(backend, name):
        time.sleep(0.01)
    gone_s = time.perf_counter() - started
    code = w.wait(timeout=120)
    watcher_s = time.perf_counter() - started
    return {"gone": gone_s, "command": command_s, "watcher": watcher_s, "code": code}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["local", "docker", "both"], default="both")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--graceful", action="store_true")
    args = parser.parse_args()
    for backend in (["local", "docker"] if args.backend == "both" else [args.backend]):
        if backend == "docker":
            build_image()
        home = Path(tempfile.mkdtemp(prefix=f"wmctl-bench-cancel-{backend}-"))
        rows = [one_trial(backend, home, f"bc-{backend[:1]}{i}", args.graceful) for i in range(args.trials)]
        gone = [r["gone"] for r in rows]
        print(f"{backend}{' (graceful)' if args.graceful else ''}: cancel -> everything gone: median "
              f"{statistics.median(gone):.2f} s, max {max(gone):.2f} s over {len(rows)} trials (goal < 2 s); "
              f"`wmctl cancel` returned after median {statistics.median(r['command'] for r in rows):.2f} s; "
              f"watcher exited {sorted({int(r['code']) for r in rows})} after median "
              f"{statistics.median(r['watcher'] for r in rows):.2f} s")


if __name__ == "__main__":
    main()
