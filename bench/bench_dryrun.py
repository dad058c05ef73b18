"""`wmctl submit --dry-run` as a user runs it, and rendering at cluster scale. Prints, asserts nothing.

1. Whole-process wall time and peak RSS of `wmctl submit SPEC --dry-run --backend kubernetes` on the
   2-node x 8-accelerator spec (tests/unit/data/full.yaml), for every backend; target <= 0.25 s.
   Each run is a fresh interpreter (what a user pays: Python start-up, imports, render, print).
   Against the floor every CLI of this stack pays, `python -c "import click, jinja2, yaml"` in a
   fresh interpreter: goal, the Kubernetes dry run at most 1.3x that.
2. In-process render of the same spec at 1024 nodes (one Indexed Job: the manifest does not grow
   with nodes, the Docker plan does); target < 2 s.
3. When TorchX is installed (``--torchx PATH``, ``$TORCHX``, ``torchx`` on PATH, or the separate
   venv ``/tmp/tx`` made with ``python3 -m venv /tmp/tx && /tmp/tx/bin/pip install torchx==0.7.0 kubernetes``;
   never a dependency of this project): the same kind of dry run there, ``torchx run --dryrun -s
   kubernetes -cfg queue=default dist.ddp -j 2x8 --script train.py``, in a fresh interpreter each
   time, and wmctl's Kubernetes dry run as a ratio of it. TorchX wants DOCKER_HOST set; the bench
   sets a placeholder when it is not (a dry run contacts nothing).

    python bench/bench_dryrun.py [--runs 10] [--torchx PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "tests" / "unit" / "data" / "full.yaml"
sys.path.insert(0, str(REPO))


# What an installed wmctl runs with: compiled bytecode (pip writes it at install). A shell that
# sets PYTHONDONTWRITEBYTECODE would otherwise time the compiler on every run.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def one_process(backend: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `wmctl submit --dry-run` in a fresh interpreter."""
    argv = [sys.executable, "-m", "orchestrator.cli", "submit", str(SPEC), "--dry-run", "--backend", backend]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"dry run failed ({backend}): {proc.stderr.read().decode()[-2000:]}")
    return elapsed, usage.ru_maxrss / 1024


def render_at_scale(nodes: int, backend: str) -> float:
    from orchestrator import api
    from orchestrator.commands._common import plan_document

    t0 = time.perf_counter()
    plan = api.dryrun(api.load_job(SPEC, {"nodes": nodes}), backend).plan
    plan_document(plan, "yaml")
    return time.perf_counter() - t0


def one_import_floor() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import click, jinja2, yaml"], check=True, env=ENV)
    return time.perf_counter() - t0


def find_torchx(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("TORCHX"), shutil.which("torchx"), "/tmp/tx/bin/torchx"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def one_torchx(torchx: str, workdir: Path) -> float:
    """Wall seconds of one TorchX 0.7 Kubernetes dry run of a 2 x 8 DDP job (fresh interpreter)."""
    # --workspace "": no image build from the current folder (TorchX's default workspace would
    # build and push one, which needs a registry); the job's own dry run, as wmctl's is.
    argv = [torchx, "run", "--workspace", "", "--dryrun", "-s", "kubernetes", "-cfg", "queue=default", "dist.ddp",
            "-j", "2x8", "--script", "train.py"]
    env = {**ENV, "DOCKER_HOST": ENV.get("DOCKER_HOST") or "unix:///var/run/docker.sock"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"torchx dry run failed: {proc.stderr.decode()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--torchx", default=None, help="the torchx executable (default: see the module doc)")
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, spec {SPEC.relative_to(REPO)} (2 nodes x 8 accelerators)")
    print(f"{'backend':<11} {'median s':>9} {'min s':>7} {'max s':>7} {'peak RSS MiB':>13}")
    medians = {}
    for backend in ("kubernetes", "docker", "local"):
        one_process(backend)  # warm the page cache and .pyc files
        samples = [one_process(backend) for _ in range(args.runs)]
        walls = [s[0] for s in samples]
        medians[backend] = statistics.median(walls)
        print(f"{backend:<11} {medians[backend]:>9.3f} {min(walls):>7.3f} {max(walls):>7.3f} "
              f"{max(s[1] for s in samples):>13.1f}")
    print("target: submit --dry-run <= 0.25 s (kubernetes)")

    one_import_floor()
    floor = statistics.median([one_import_floor() for _ in range(args.runs)])
    print(f"floor: `python -c \"import click, jinja2, yaml\"` {floor:.3f} s; kubernetes dry run "
          f"{medians['kubernetes'] / floor:.2f}x of it (goal <= 1.3x)")
    baseline = [one_process_python() for _ in range(5)]
    print(f"for scale: bare `python -c pass` {statistics.median(baseline):.3f} s")

    torchx = find_torchx(args.torchx)
    if torchx is None:
        print("torchx: not installed (see the module doc); no comparison")
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="wmctl-bench-torchx-") as tmp:
            (Path(tmp) / "train.py").write_text("print('train')\n")
            one_torchx(torchx, Path(tmp))
            tx = statistics.median([one_torchx(torchx, Path(tmp)) for _ in range(args.runs)])
        print(f"torchx 0.7 `torchx run --dryrun -s kubernetes dist.ddp -j 2x8`: {tx:.3f} s ({tx / floor:.2f}x the "
              f"floor); wmctl's kubernetes dry run {medians['kubernetes'] / tx:.2f}x of it")

    # Kubernetes only: a Docker host runs a handful of "nodes", and the plan refuses more nodes
    # than the host has CPUs for.
    render_at_scale(2, "kubernetes")
    t = render_at_scale(1024, "kubernetes")
    print(f"render + serialise 1024 nodes (kubernetes): {t:.3f} s (target < 2 s)")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")


def one_process_python() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
