"""`wmctl submit --dry-run` as a user runs it, and rendering at cluster scale. Prints, asserts nothing.

1. Whole-process wall time and peak RSS of `wmctl submit SPEC --dry-run --backend kubernetes` on the
   2-node x 8-accelerator spec (tests/unit/data/full.yaml), for every backend; target <= 0.25 s.
   Each run is a fresh interpreter (what a user pays: Python start-up, imports, render, print).
   Against the floor every CLI of this stack pays, `python -c "import click, jinja2, yaml"` in a
   fresh interpreter: goal, the Kubernetes dry run at most 1.3x that. The ratio is printed twice:
   in wall time, and in instructions executed (valgrind's callgrind, when valgrind is installed:
   one run each, and the same on a busy machine, where wall times are noise).
2. In-process render of the same spec at 1024 nodes (one Indexed Job: the manifest does not grow
   with nodes, the Docker plan does); target < 2 s.
3. When TorchX is installed (``--torchx PATH``, ``$TORCHX``, ``torchx`` on PATH, or the separate
   venv ``/tmp/tx`` made with ``python3 -m venv /tmp/tx && /tmp/tx/bin/pip install torchx==0.7.0 kubernetes``;
   never a dependency of this project): the same kind of dry run there, ``torchx run --dryrun -s
   kubernetes -cfg queue=default dist.ddp -j 2x8 --script train.py``, in a fresh interpreter each
   time, and wmctl's Kubernetes dry run as a ratio of it. TorchX wants DOCKER_HOST set; the bench
   sets a placeholder when it is not (a dry run contacts nothing). With valgrind, its
   instructions too.

    python bench/bench_dryrun.py [--runs 10] [--torchx PATH] [--no-valgrind]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    argv = dry_run_argv(backend)
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


FLOOR = [sys.executable, "-c", "import click, jinja2, yaml"]


def dry_run_argv(backend: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "submit", str(SPEC), "--dry-run", "--backend", backend]


def one_import_floor() -> float:
    t0 = time.perf_counter()
    subprocess.run(FLOOR, check=True, env=ENV)
    return time.perf_counter() - t0


def instructions(argv: list[str], *, cwd: Path = REPO, env: dict[str, str] | None = None) -> int:
    """Instructions ``argv`` executes from start to exit, counted by valgrind's callgrind (one run:
    the count hardly moves between runs, and not with the machine's load). Run it once without
    valgrind first, so its .pyc files exist."""
    env = {**(env or ENV), "PYTHONHASHSEED": "0"}     # the same dict layouts, run to run
    with tempfile.TemporaryDirectory(prefix="wmctl-bench-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv], cwd=cwd,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"callgrind run of {argv[:3]} failed: {proc.stderr[-2000:]}")
        for line in out.read_text().splitlines():
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise SystemExit(f"callgrind wrote no totals for {argv[:3]}")


def find_torchx(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("TORCHX"), shutil.which("torchx"), "/tmp/tx/bin/torchx"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


TORCHX_ENV = {**ENV, "DOCKER_HOST": ENV.get("DOCKER_HOST") or "unix:///var/run/docker.sock"}


def torchx_argv(torchx: str) -> list[str]:
    """TorchX 0.7's Kubernetes dry run of a 2 x 8 DDP job. The console script's own interpreter runs
    it (read from its #! line), so valgrind counts Python, not a shell."""
    # --workspace "": no image build from the current folder (TorchX's default workspace would
    # build and push one, which needs a registry); the job's own dry run, as wmctl's is.
    args = ["run", "--workspace", "", "--dryrun", "-s", "kubernetes", "-cfg", "queue=default", "dist.ddp",
            "-j", "2x8", "--script", "train.py"]
    with open(torchx, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    interpreter = first[2:].split() if first.startswith("#!") else []
    return [*interpreter, torchx, *args]


def one_torchx(torchx: str, workdir: Path) -> float:
    """Wall seconds of one TorchX 0.7 Kubernetes dry run of a 2 x 8 DDP job (fresh interpreter)."""
    argv, env = torchx_argv(torchx), TORCHX_ENV
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
    parser.add_argument("--no-valgrind", action="store_true", help="skip the instruction counts (callgrind)")
    args = parser.parse_args()
    counting = not args.no_valgrind and shutil.which("valgrind") is not None

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
          f"{medians['kubernetes'] / floor:.2f}x of it in wall time (goal <= 1.3x)")
    floor_ir = ours_ir = None
    if counting:
        floor_ir, ours_ir = instructions(FLOOR), instructions(dry_run_argv("kubernetes"))
        print(f"instructions (callgrind): floor {floor_ir / 1e6:.0f}M, kubernetes dry run {ours_ir / 1e6:.0f}M: "
              f"{ours_ir / floor_ir:.2f}x (goal <= 1.3x)")
    else:
        print("instructions: valgrind not found (or --no-valgrind); no instruction ratio")
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
            tx_ir = instructions(torchx_argv(torchx), cwd=Path(tmp), env=TORCHX_ENV) if counting else None
        print(f"torchx 0.7 `torchx run --dryrun -s kubernetes dist.ddp -j 2x8`: {tx:.3f} s ({tx / floor:.2f}x the "
              f"floor); wmctl's kubernetes dry run {medians['kubernetes'] / tx:.2f}x of it")
        if tx_ir is not None and floor_ir and ours_ir:
            print(f"torchx instructions: {tx_ir / 1e6:.0f}M ({tx_ir / floor_ir:.2f}x the floor); wmctl's kubernetes "
                  f"dry run {ours_ir / tx_ir:.2f}x of it")

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
