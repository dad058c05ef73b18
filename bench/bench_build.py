"""Cold build vs code-only rebuild of the example image; prints wall times, their ratio, image size.

    python bench/bench_build.py [SPEC]      (default examples/worldmodel/job.yaml)

Needs a Docker engine (.ci/start-dockerd.sh). The example is copied to a temp folder and built
FROM the local test base image (tests/docker/baseimage.py; built first if missing), so no
registry or index is needed. "Cold" = --no-cache (every layer of the example image runs; the
base image itself is not rebuilt). "Code-only" = one line appended to the training script.
Whole-process wall times of `wmctl build-image`, as a user sees them. Target: ratio <= 0.15.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(args: list[str], cwd: Path, env: dict) -> float:
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return elapsed


def main() -> None:
    import docker

    from orchestrator.imagebuild import wheel
    from tests.docker.baseimage import ensure_base_image

    spec_src = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO / "examples" / "worldmodel" / "job.yaml"
    client = docker.from_env(timeout=900)
    base = ensure_base_image(client)
    tag = "wmctl-bench/build:latest"
    with tempfile.TemporaryDirectory(prefix="wmctl-bench-") as tmp:
        work = Path(tmp) / spec_src.parent.name
        shutil.copytree(spec_src.parent, work, ignore=shutil.ignore_patterns("__pycache__", ".wmctl"))
        spec = work / spec_src.name
        pinned = wheel.build_wheel(Path(tmp))  # same runtime wheel for both builds
        env = {**os.environ, "PYTHONPATH": str(REPO), wheel.ENV_WHEEL: str(pinned)}
        common = ["build-image", str(spec), "--tag", tag, "--set", f"image.base={base}", "-q"]
        cold = run(common + ["--no-cache"], work, env)
        code = work / "train.py"
        if not code.is_file():
            code = next(work.glob("*.py"))
        code.write_text(code.read_text() + "\n# bench: code-only change\n")
        warm = run(common, work, env)
        size = client.images.get(tag).attrs["Size"]
        base_size = client.images.get(base).attrs["Size"]
        for image in client.images.list(name=tag.rsplit(":", 1)[0]):  # the tag and its content tags
            for t in image.tags:
                client.images.remove(t, force=True)
    print(f"cold build (--no-cache):   {cold:7.2f} s")
    print(f"code-only rebuild:         {warm:7.2f} s")
    print(f"ratio rebuild/cold:        {warm / cold:7.3f}   (target <= 0.15)")
    print(f"image size:                {size / 2**20:7.1f} MiB (base {base_size / 2**20:.1f} MiB, "
          f"job layers {(size - base_size) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
