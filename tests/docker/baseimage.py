"""The local test base image, built with no registry: debootstrap -> docker import -> torch layer.

``ensure_base_image(client)`` returns the tag of an image with Debian bookworm (python 3.11,
pip, venv, util-linux, numactl, procps) and torch 2.13.0 CPU + numpy in a venv at /opt/venv on
PATH (a venv sidesteps bookworm's PEP 668 "externally managed" guard). Built once per engine,
cached by tag, and serialized with a file lock so concurrent test processes build it once.

Steps, each cached on its own so a failure late does not redo the early ones:
1. ``debootstrap --variant=minbase`` from the mirror apt uses on this host, tarred and imported
   as ``ROOTFS_TAG``;
2. a host wheelhouse (``pip download torch==2.13.0 numpy``; pip's config on this machine finds
   the torch CPU wheel on local disk);
3. ``docker run`` of the rootfs with the wheelhouse bind-mounted read-only and no network,
   ``pip install --no-index --find-links``, then ``docker commit`` as ``BASE_TAG``: the wheels
   never land in a layer (a COPY + rm would keep ~200 MB of them in the image).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TORCH_VERSION = "2.13.0"
SUITE = "bookworm"
ROOTFS_TAG = f"wmctl-test/rootfs:{SUITE}-minbase"
BASE_TAG = f"wmctl-test/base:{SUITE}-py311-torch{TORCH_VERSION}"
PACKAGES = ["python3", "python3-pip", "python3-venv", "util-linux", "numactl", "procps"]
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def cache_dir() -> Path:
    root = Path(os.environ.get("WMCTL_TEST_CACHE", Path.home() / ".cache" / "wmctl-test"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def file_lock(name: str) -> Iterator[None]:
    """An exclusive flock: other processes calling ensure_base_image wait here."""
    path = cache_dir() / f"{name}.lock"
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 .sources or one-line sources.list)."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"^\s*URIs:\s*(\S+)", text, re.M):
            uri = match.group(1)
            if uri.rstrip("/").endswith("/debian"):
                return uri
        for match in re.finditer(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            uri, suite = match.groups()
            if uri.rstrip("/").endswith("/debian") and suite == SUITE:
                return uri
    return DEFAULT_MIRROR


def _image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _log(msg: str) -> None:
    print(f"[base-image] {msg}", file=sys.stderr, flush=True)


def host_wheelhouse() -> Path:
    """torch + numpy (+ deps) wheels for cp311, downloaded once into the test cache."""
    target = cache_dir() / f"wheelhouse-torch{TORCH_VERSION}"
    done = target / ".complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
         "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
         f"torch=={TORCH_VERSION}", "numpy", "-d", str(target)],
        check=True, timeout=900,
    )
    done.write_text("ok\n")
    return target


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (deepest first), from /proc/self/mounts."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == str(root) or point.startswith(prefix):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def _debootstrap(root: Path, mirror: str) -> None:
    """debootstrap mounts /proc (and more) inside the root while it installs; killed (a timeout,
    Ctrl-C) it leaves them mounted, and removing the temp folder would then walk into the host's
    /proc. Whatever is still mounted there is unmounted (lazily) however it ended."""
    try:
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror],
            check=True, timeout=1200, stdout=subprocess.DEVNULL,
        )
    finally:
        unmount_under(root)


def unmount_under(root: Path) -> None:
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=True, timeout=60)


def _build_rootfs(client) -> None:
    mirror = apt_mirror()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wmctl-rootfs-") as tmp:
        root = Path(tmp) / "root"
        _log(f"debootstrap {SUITE} from {mirror}")
        _debootstrap(root, mirror)
        # Package caches and lists are dead weight in an image.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / sub).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar_path = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True, timeout=600)
        repo, tag = ROOTFS_TAG.rsplit(":", 1)
        client.api.import_image_from_file(
            str(tar_path), repository=repo, tag=tag, changes=['CMD ["/bin/bash"]'],
        )
    _log(f"imported {ROOTFS_TAG} in {time.monotonic() - t0:.0f}s")


def _build_torch_layer(client) -> None:
    wheelhouse = host_wheelhouse()
    t0 = time.monotonic()
    script = (
        "set -e; python3 -m venv /opt/venv; "
        "/opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index "
        f"--find-links /wh torch=={TORCH_VERSION} numpy; "
        "/opt/venv/bin/python -c 'import torch, numpy; print(torch.__version__, numpy.__version__)'"
    )
    container = client.containers.run(
        ROOTFS_TAG, ["/bin/sh", "-c", script], detach=True, network_mode="none",
        volumes={str(wheelhouse): {"bind": "/wh", "mode": "ro"}},
    )
    try:
        status = container.wait(timeout=1200)
        logs = container.logs().decode(errors="replace")
        if status.get("StatusCode") != 0:
            raise RuntimeError(f"installing torch into the base image failed:\n{logs[-3000:]}")
        repo, tag = BASE_TAG.rsplit(":", 1)
        container.commit(
            repository=repo, tag=tag,
            changes=[
                "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV VIRTUAL_ENV=/opt/venv",
                'CMD ["/bin/bash"]',
            ],
        )
    finally:
        container.remove(force=True)
    _log(f"committed {BASE_TAG} in {time.monotonic() - t0:.0f}s ({logs.strip().splitlines()[-1]})")


def ensure_base_image(client) -> str:
    """Return BASE_TAG, building it first if this engine does not have it."""
    if _image_exists(client, BASE_TAG):
        return BASE_TAG
    with file_lock("base-image"):
        if _image_exists(client, BASE_TAG):  # another process built it while we waited
            return BASE_TAG
        if shutil.which("debootstrap") is None:
            raise RuntimeError("debootstrap is not installed: run .ci/start-dockerd.sh (it installs it)")
        if not _image_exists(client, ROOTFS_TAG):
            _build_rootfs(client)
        _build_torch_layer(client)
    return BASE_TAG


# Built in the background: .ci/run starts ``python -m tests.docker.baseimage --status FILE`` while
# the gates and the first tests run, and exports WMCTL_BASE_IMAGE_STATUS=FILE to the tests. The
# file says "building PID" (written by .ci/run before the start), then "ok TAG" or "failed" and
# why, written whole by the builder when it ends.
ENV_STATUS = "WMCTL_BASE_IMAGE_STATUS"


class BackgroundBuildFailed(RuntimeError):
    """The background build of the base image failed or died: the tests that need it fail with
    this, they do not build it again (the same failure, minutes later) nor skip."""


def _write_status(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A finished child of ours that nobody reaped yet still answers kill(0): a zombie is dead.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_background_build(status: Path, limit: float = 3600.0, poll: float = 1.0) -> None:
    """Wait until the background build named by ``status`` has ended; raise
    BackgroundBuildFailed when it failed, died without saying how it ended, or is still going
    after ``limit`` seconds (its steps' own time limits add up to less: a hang guard)."""
    log = status.with_name("base-image.log")
    deadline = time.monotonic() + limit
    while True:
        try:
            text = status.read_text()
        except FileNotFoundError:
            raise BackgroundBuildFailed(f"{ENV_STATUS}={status} names no file: .ci/run writes it before "
                                        "it starts the build (unset it to build the image in the test)") from None
        if text.startswith("ok"):
            return
        if text.startswith("failed"):
            raise BackgroundBuildFailed(f"the background build of {BASE_TAG} failed ({status}, log {log}):\n"
                                        f"{text[-3000:]}")
        words = text.split()
        if words[:1] != ["building"] or len(words) != 2 or not words[1].isdigit():
            raise BackgroundBuildFailed(f"{status} holds {text[:200]!r}, not 'building PID', 'ok' or 'failed'")
        if not _alive(int(words[1])):
            text = status.read_text()  # it may have finished between the two reads
            if text.startswith(("ok", "failed")):
                continue
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"
            raise BackgroundBuildFailed(f"the background build of {BASE_TAG} (pid {words[1]}) died without "
                                        f"a result; log {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise BackgroundBuildFailed(f"the background build of {BASE_TAG} (pid {words[1]}) is still going "
                                        f"after {limit:.0f}s; log {log}")
        time.sleep(poll)


def main(argv: list[str]) -> int:
    """``python -m tests.docker.baseimage [--status FILE]``: build it (by hand, or .ci/run's
    background build, which reports its end in FILE)."""
    import argparse

    import docker
    import docker.errors

    ap = argparse.ArgumentParser(prog="python -m tests.docker.baseimage", description=main.__doc__)
    ap.add_argument("--status", type=Path, help="file to write 'ok TAG' or 'failed' and why into")
    args = ap.parse_args(argv)
    try:
        tag = ensure_base_image(docker.from_env())
    except (OSError, RuntimeError, subprocess.SubprocessError, docker.errors.DockerException) as exc:
        if args.status:
            _write_status(args.status, f"failed: {type(exc).__name__}: {exc}\n")
        print(f"[base-image] failed: {exc}", file=sys.stderr)
        return 1
    if args.status:
        _write_status(args.status, f"ok {tag}\n")
    print(tag)
    return 0


if __name__ == "__main__":  # build it by hand: python -m tests.docker.baseimage
    sys.exit(main(sys.argv[1:]))
