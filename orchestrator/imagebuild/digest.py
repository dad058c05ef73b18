"""The content digest behind the ``wmctl-<digest>`` tag: the Dockerfile, every context file, the
runtime wheel, build args, platform and the base image's id; and the wheels image's identity."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from .context import ContextScan



def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Facts about wheelhouse files (their sha256, a wheel's Requires-Dist) kept between builds, keyed
# by what changes when a file is written (git's index does the same): a code-only rebuild no
# longer reads a multi-GB wheelhouse, or the 16,000-entry zip index of a torch wheel, again. A
# file whose mtime or ctime is within RACY_S of now is read but not kept: a second write in the
# same timestamp tick would otherwise go unnoticed.
HASH_CACHE_FILE = "wheelhouse-hashes.json"
RACY_S = 2.0

T = TypeVar("T")


def cache_path(name: str) -> Path:
    """``name`` in wmctl's cache folder (WMCTL_CACHE_DIR, else $XDG_CACHE_HOME/wmctl or ~/.cache/wmctl)."""
    root = os.environ.get("WMCTL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wmctl")
    return Path(root) / name


def _load_cache(path: Path) -> dict[str, list[Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(path: Path, cache: dict[str, list[Any]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:      # a read-only or full cache folder: read the files again next time
        pass


def by_stamp(cache_file: str, paths: list[Path], compute: Callable[[Path], T],
             clock: Callable[[], float] = time.time) -> list[T]:
    """``compute(path)`` for each path (a JSON value), from the cache file when the file is
    unchanged since (same device, inode, size, mtime and ctime)."""
    cache_path_ = cache_path(cache_file)
    cache = _load_cache(cache_path_)
    out: list[T] = []
    changed = False
    now = clock()
    for path in paths:
        st = path.stat()
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        key = os.path.abspath(path)
        hit = cache.get(key)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == stamp:
            out.append(hit[1])
            continue
        value = compute(path)
        out.append(value)
        if now - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
            cache[key] = [stamp, value]
            changed = True
    if changed:
        _save_cache(cache_path_, cache)
    return out


def wheelhouse_hashes(wheelhouse: Path, wheelhouse_files: list[tuple[str, int]], *,
                      clock: Callable[[], float] = time.time) -> dict[str, str]:
    """sha256 of each wheelhouse file: the content digest and the wheels images' tags
    (``wheels_image_digest``) both come from these. A file unchanged since an earlier build is
    not read again (``by_stamp``)."""
    rels = [rel for rel, _size in wheelhouse_files]
    hashes = by_stamp(HASH_CACHE_FILE, [wheelhouse / rel for rel in rels], lambda p: _file_sha256(p), clock)
    return dict(zip(rels, hashes, strict=True))


def wheels_image_digest(folder: str, hashes: dict[str, str], dockerfile: str) -> str:
    """The identity of one wheels image: the Dockerfile that makes it, its folder and every
    wheel's name and content. Same wheels, same image, whatever job or folder they came from."""
    h = hashlib.sha256()
    h.update(f"{dockerfile}\0{folder}\0".encode("utf-8", "surrogateescape"))
    for rel in sorted(hashes):
        h.update(f"{rel}\0{hashes[rel]}\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def deps_digest(deps_dockerfile: str, requirements_files: list[tuple[str, Path]], wheel_hashes: dict[str, str],
                wheel_fingerprint: str, build_args: dict[str, str], platform: str | None,
                base_image_id: str | None = None) -> str:
    """sha256 of everything that decides the dependency image (the Dockerfile's lines above its
    split): its Dockerfile, the base image's id, the requirements files, the wheelhouse, the runtime
    wheel, build args and platform; not the job's own files."""
    h = hashlib.sha256()
    for part in ("deps-dockerfile", deps_dockerfile, "base-id", base_image_id or ""):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for rel, path in requirements_files:
        h.update(f"requirements\0{rel}\0{_file_sha256(path)}\0".encode("utf-8", "surrogateescape"))
    for name in sorted(wheel_hashes):
        h.update(f"wheelhouse\0{name}\0{wheel_hashes[name]}\0".encode("utf-8", "surrogateescape"))
    h.update(f"wheel\0{wheel_fingerprint}\0".encode())
    for key in sorted(build_args):
        h.update(f"arg\0{key}\0{build_args[key]}\0".encode("utf-8", "surrogateescape"))
    h.update(f"platform\0{platform or ''}\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def content_digest(dockerfile_canonical: str, scan: ContextScan, requirements_files: list[tuple[str, Path]],
                   wheel_hashes: dict[str, str], wheel_fingerprint: str,
                   build_args: dict[str, str], platform: str | None, base_image_id: str | None = None) -> str:
    """sha256 of everything that decides the image's content (not its build time or git rev).
    The Dockerfile names the base image; ``base_image_id`` (the engine's id for it) adds what the
    name means today, so a re-pulled or re-pointed base tag is a different image."""
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape"))
            h.update(b"\0")

    put("dockerfile", dockerfile_canonical)
    put("base-id", base_image_id or "")
    for e in scan.entries:
        if e.kind == "file":
            put("file", e.rel, oct(e.mode & 0o111), _file_sha256(scan.root / e.rel))
        elif e.kind == "symlink":
            put("link", e.rel, os.readlink(scan.root / e.rel))
        else:
            put("dir", e.rel)
    for rel, path in requirements_files:
        put("requirements", rel, _file_sha256(path))
    # Wheel contents (``wheelhouse_hashes``), not name and size: a rebuilt local wheel keeps both.
    # Hashing runs at about 1.7 GB/s here, so a few seconds for a multi-GB CUDA wheelhouse; being
    # wrong means an image with the old wheel in it.
    for name in sorted(wheel_hashes):
        put("wheelhouse", name, wheel_hashes[name])
    put("wheel", wheel_fingerprint)
    for key in sorted(build_args):
        put("arg", key, build_args[key])
    put("platform", platform or "")
    return h.hexdigest()
