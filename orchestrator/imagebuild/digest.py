"""The content digest behind the ``wmctl-<digest>`` tag: the Dockerfile, every context file, the
runtime wheel, build args, platform and the base image's id; and the wheels image's identity."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from .context import ContextScan



def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheelhouse_hashes(wheelhouse: Path, wheelhouse_files: list[tuple[str, int]]) -> dict[str, str]:
    """sha256 of each wheelhouse file, read once per build: the content digest and the wheels
    image's tag (``wheels_image_digest``) both come from these."""
    return {rel: _file_sha256(wheelhouse / rel) for rel, _size in wheelhouse_files}


def wheels_image_digest(folder: str, hashes: dict[str, str]) -> str:
    """The identity of one wheels image: its folder and every wheel's name and content. Same
    wheels, same image, whatever job or folder they came from."""
    h = hashlib.sha256()
    h.update(f"{folder}\0".encode("utf-8", "surrogateescape"))
    for rel in sorted(hashes):
        h.update(f"{rel}\0{hashes[rel]}\0".encode("utf-8", "surrogateescape"))
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
