"""Cold build vs code-only rebuild of the example image, against the engine's own one-layer rebuild.

    python bench/bench_build.py [SPEC] [--online]      (default examples/worldmodel/job.yaml)

Needs a Docker engine (.ci/start-dockerd.sh). The example is copied to a temp folder and built
FROM the local test base image (tests/docker/baseimage.py; built first if missing), so no
registry or index is needed. By default the build is offline, from the torch wheelhouse the base
image was built from (torch + numpy, about 200 MB: the field report's case, where every build
used to send the whole wheelhouse again); --online builds without one. "Cold" = --no-cache
(every layer of the example image runs, wheels images included; the base image itself is not
rebuilt). "Code-only" = one line appended to the training script. Whole-process wall times of
`wmctl build-image`, as a user sees them.

Floor: what the engine itself needs for a one-layer rebuild with one changed file: `FROM <the
built image>` + `COPY train.py`, built once, then again after the same one-line change, timed
in-process through the same SDK on the same engine. Goal: code-only rebuild <= 2.5x the floor.
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


def engine_floor(client, image: str, code: Path) -> float:
    """Seconds the engine takes to rebuild `FROM image` + `COPY train.py` after a one-line change."""
    import io
    import tarfile

    def context() -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            dockerfile = f"FROM {image}\nCOPY train.py /floor/train.py\n".encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            tar.add(str(code), arcname="train.py")
        buf.seek(0)
        return buf

    def build() -> float:
        t0 = time.perf_counter()
        for chunk in client.api.build(fileobj=context(), custom_context=True, tag=FLOOR_TAG, rm=True,
                                      forcerm=True, decode=True):
            if "error" in chunk:
                sys.exit(f"floor build failed: {chunk['error']}")
        return time.perf_counter() - t0

    build()                                               # the layer as it is now: cached from here on
    code.write_text(code.read_text() + "\n# bench: floor change\n")
    return build()


FLOOR_TAG = "wmctl-bench/floor:latest"


def main() -> None:
    import docker

    from orchestrator.imagebuild import wheel
    from tests.docker.baseimage import ensure_base_image, host_wheelhouse

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    online = "--online" in sys.argv[1:]
    spec_src = Path(args[0]).resolve() if args else REPO / "examples" / "worldmodel" / "job.yaml"
    client = docker.from_env(timeout=900)
    base = ensure_base_image(client)
    tag = "wmctl-bench/build:latest"
    wheelhouse = None if online else host_wheelhouse()
    with tempfile.TemporaryDirectory(prefix="wmctl-bench-") as tmp:
        work = Path(tmp) / spec_src.parent.name
        shutil.copytree(spec_src.parent, work, ignore=shutil.ignore_patterns("__pycache__", ".wmctl"))
        spec = work / spec_src.name
        pinned = wheel.build_wheel(Path(tmp))  # same runtime wheel for both builds
        env = {**os.environ, "PYTHONPATH": str(REPO), wheel.ENV_WHEEL: str(pinned)}
        common = ["build-image", str(spec), "--tag", tag, "--set", f"image.base={base}", "-q"]
        if wheelhouse is not None:
            common += ["--wheelhouse", str(wheelhouse)]
        cold = run(common + ["--no-cache"], work, env)
        code = work / "train.py"
        if not code.is_file():
            code = next(work.glob("*.py"))
        code.write_text(code.read_text() + "\n# bench: code-only change\n")
        warm = run(common, work, env)
        size = client.images.get(tag).attrs["Size"]
        base_size = client.images.get(base).attrs["Size"]
        floor = engine_floor(client, tag, code)
        for repo in (tag.rsplit(":", 1)[0], FLOOR_TAG.rsplit(":", 1)[0]):  # the tags and content tags
            for image in client.images.list(name=repo):
                for t in image.tags:
                    client.images.remove(t, force=True)
    if wheelhouse is not None:
        wh_size = sum(p.stat().st_size for p in wheelhouse.rglob("*") if p.is_file())
        print(f"offline build, wheelhouse {wheelhouse} ({wh_size / 2**20:.1f} MiB)")
    else:
        print("online build (no wheelhouse)")
    print(f"cold build (--no-cache):   {cold:7.2f} s")
    print(f"code-only rebuild:         {warm:7.2f} s")
    print(f"ratio rebuild/cold:        {warm / cold:7.3f}   (target <= 0.15)")
    print(f"engine floor (FROM image + COPY train.py, one changed file): {floor:.2f} s; "
          f"code-only rebuild {warm / floor:.2f}x of it (goal <= 2.5x)")
    print(f"image size:                {size / 2**20:7.1f} MiB (base {base_size / 2**20:.1f} MiB, "
          f"job layers {(size - base_size) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
