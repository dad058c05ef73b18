"""Cold build vs code-only rebuild of the example image, against the engine's own one-layer rebuild.

    python bench/bench_build.py [SPEC] [--online] [--rounds N] [--no-bytecode]
                                    (default examples/worldmodel/job.yaml, 5 rounds)

Needs a Docker engine (.ci/start-dockerd.sh). The example is copied to a temp folder and built
FROM the local test base image (tests/docker/baseimage.py; built first if missing), so no
registry or index is needed. By default the build is offline, from the torch wheelhouse the base
image was built from (torch + numpy, about 200 MB: the field report's case, where every build
used to send the whole wheelhouse again); --online builds without one. "Cold" = --no-cache
(every layer of the example image runs, wheels images included; the base image itself is not
rebuilt). "Code-only" = one line appended to the training script, then `wmctl build-image`: the
whole process's wall time, as a user sees it (start-up, spec, plan, engine, record). wmctl runs
as an installed one does, from bytecode: the cold build writes it under a temporary
PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is set (as on the project's CI machines);
--no-bytecode keeps the environment's setting, so every run compiles wmctl's modules again.

Floor: what the engine itself needs for a one-layer rebuild with one changed file: `FROM <the
cold-built image>` + `COPY train.py`, after the same kind of one-line change, timed in-process
through the SDK (no process start, client already connected) on the same engine. The two are
measured in alternation, N rounds, so a busy machine slows both alike; the figure is the median
of the per-round ratios. Goal: code-only rebuild <= 2.5x the floor.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TAG = "wmctl-bench/build:latest"
FLOOR_BASE = "wmctl-bench/floor-base:latest"
FLOOR_TAG = "wmctl-bench/floor:latest"


def run(args: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed, result.stdout


def engine_seconds(stdout: str) -> float | None:
    """The build's own time, as `wmctl build-image` reports it ("built <id> in 1.2s ...")."""
    found = re.search(r"^built [0-9a-f]+ in ([0-9.]+)s", stdout, re.M)
    return float(found.group(1)) if found else None


def floor_build(client, code: Path) -> float:
    """Seconds for the engine to build `FROM FLOOR_BASE` + `COPY train.py` (the file just changed)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dockerfile = f"FROM {FLOOR_BASE}\nCOPY train.py /floor/train.py\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(str(code), arcname="train.py")
    buf.seek(0)
    t0 = time.perf_counter()
    for chunk in client.api.build(fileobj=buf, custom_context=True, tag=FLOOR_TAG, rm=True,
                                  forcerm=True, decode=True):
        if "error" in chunk:
            sys.exit(f"floor build failed: {chunk['error']}")
    return time.perf_counter() - t0


def remove_bench_images(client) -> None:
    for repo in (TAG, FLOOR_BASE, FLOOR_TAG):   # the tags and the content tags
        for image in client.images.list(name=repo.rsplit(":", 1)[0]):
            for t in image.tags:
                client.images.remove(t, force=True)


def main() -> None:
    import docker

    from orchestrator.imagebuild import wheel
    from tests.docker.baseimage import ensure_base_image, host_wheelhouse

    argv = sys.argv[1:]
    rounds = 5
    if "--rounds" in argv:
        i = argv.index("--rounds")
        rounds = int(argv[i + 1])
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    online = "--online" in argv
    spec_src = Path(args[0]).resolve() if args else REPO / "examples" / "worldmodel" / "job.yaml"
    client = docker.from_env(timeout=900)
    base = ensure_base_image(client)
    wheelhouse = None if online else host_wheelhouse()
    ours: list[float] = []
    ours_engine: list[float] = []
    floor: list[float] = []
    with tempfile.TemporaryDirectory(prefix="wmctl-bench-") as tmp:
        work = Path(tmp) / spec_src.parent.name
        shutil.copytree(spec_src.parent, work, ignore=shutil.ignore_patterns("__pycache__", ".wmctl"))
        spec = work / spec_src.name
        pinned = wheel.build_wheel(Path(tmp))  # same runtime wheel for every build
        env = {**os.environ, "PYTHONPATH": str(REPO), wheel.ENV_WHEEL: str(pinned)}
        if "--no-bytecode" not in argv:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        common = ["build-image", str(spec), "--tag", TAG, "--set", f"image.base={base}", "-q"]
        if wheelhouse is not None:
            common += ["--wheelhouse", str(wheelhouse)]
        try:
            cold, _ = run(common + ["--no-cache"], work, env)
            code = work / "train.py"
            if not code.is_file():
                code = next(work.glob("*.py"))
            floor_code = Path(tmp) / "floor-train.py"
            shutil.copyfile(code, floor_code)
            repo, _, tag = FLOOR_BASE.rpartition(":")
            client.api.tag(TAG, repo, tag)
            floor_build(client, floor_code)                 # warm: FROM resolved, layer cached
            for n in range(rounds):
                code.write_text(code.read_text() + f"\n# bench: code-only change {n}\n")
                seconds, out = run(common, work, env)
                ours.append(seconds)
                ours_engine.append(engine_seconds(out) or float("nan"))
                floor_code.write_text(floor_code.read_text() + f"\n# bench: floor change {n}\n")
                floor.append(floor_build(client, floor_code))
            size = client.images.get(TAG).attrs["Size"]
            base_size = client.images.get(base).attrs["Size"]
        finally:
            remove_bench_images(client)
    if wheelhouse is not None:
        wh_size = sum(p.stat().st_size for p in wheelhouse.rglob("*") if p.is_file())
        print(f"offline build, wheelhouse {wheelhouse} ({wh_size / 2**20:.1f} MiB)")
    else:
        print("online build (no wheelhouse)")
    print("wmctl from bytecode" if "--no-bytecode" not in argv
          else f"wmctl bytecode as the environment has it (PYTHONDONTWRITEBYTECODE="
               f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r})")
    med = statistics.median
    ratios = [o / f for o, f in zip(ours, floor, strict=True)]
    print(f"cold build (--no-cache):   {cold:7.2f} s")
    print(f"code-only rebuild:         {med(ours):7.2f} s median of {rounds} "
          f"(engine build {med(ours_engine):.2f} s of it, as wmctl reports; the rest is start-up, plan, record)")
    print(f"ratio rebuild/cold:        {med(ours) / cold:7.3f}   (target <= 0.15)")
    print(f"engine floor (FROM image + COPY train.py, one changed file): {med(floor):.2f} s median")
    print(f"code-only rebuild / floor: {med(ratios):7.2f}x median of per-round ratios "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (goal <= 2.5x)")
    print(f"image size:                {size / 2**20:7.1f} MiB (base {base_size / 2**20:.1f} MiB, "
          f"job layers {(size - base_size) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
