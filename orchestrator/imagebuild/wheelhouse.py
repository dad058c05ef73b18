"""Offline builds: which wheels of image.wheelhouse the torch step needs (so adding a requirement
does not re-run the torch install)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..errors import BuildError
from .digest import by_stamp

REQUIRES_CACHE_FILE = "wheelhouse-requires.json"


def _dist_name(text: str) -> str | None:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._\-]*)", text)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def _wheel_requires(path: Path) -> list[str] | None:
    """Every Requires-Dist name of a wheel, markers and extras ignored (over-including is safe:
    it only moves a wheel into the torch layer). None when the file is not a readable wheel."""
    import zipfile   # a code-only rebuild reads these from the cache (by_stamp), not the wheels

    try:
        with zipfile.ZipFile(path) as zf:
            meta = next((n for n in zf.namelist()
                         if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            if meta is None:
                return None
            text = zf.read(meta).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile):
        return None
    names = []
    for line in text.split("\n\n", 1)[0].splitlines():
        if line.lower().startswith("requires-dist:"):
            name = _dist_name(line.split(":", 1)[1])
            if name:
                names.append(name)
    return names


def torch_wheel_set(wheelhouse: Path, files: list[tuple[str, int]], torch_packages: Sequence[str]) -> set[str]:
    """The wheelhouse files the torch step needs: the torch packages and what they require,
    transitively (from each wheel's METADATA). Files that are not readable wheels are counted in
    too, since the closure cannot be checked through them. The rest is copied only before the
    requirements step, so adding a requirement's wheel leaves the torch layer cached."""
    by_name: dict[str, list[str]] = {}
    unknown: set[str] = set()
    requires: dict[str, list[str]] = {}
    wheels = [rel for rel, _size in files if rel.endswith(".whl")]
    # A torch wheel's zip index has some 16,000 entries: read once, then kept (digest.by_stamp).
    read = by_stamp(REQUIRES_CACHE_FILE, [wheelhouse / rel for rel in wheels], _wheel_requires)
    found = dict(zip(wheels, read, strict=True))
    for rel, _size in files:
        base = rel.rsplit("/", 1)[-1]
        deps = found.get(rel)
        name = _dist_name(base.split("-", 1)[0]) if base.endswith(".whl") else None
        if deps is None or name is None:
            unknown.add(rel)
            continue
        by_name.setdefault(name, []).append(rel)
        requires.setdefault(name, []).extend(deps)
    wanted = [n for n in (_dist_name(p) for p in torch_packages) if n]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        wanted.extend(requires.get(name, []))
    return unknown | {rel for name in seen for rel in by_name.get(name, [])}


def wheelhouse_files(path: Path) -> list[tuple[str, int]]:
    if not path.is_dir():
        raise BuildError(f"image.wheelhouse / --wheelhouse: {path} is not a directory",
                         hint="fill it with `wmctl wheelhouse SPEC --dir DIR` on a machine with a package index")
    files = sorted((p.relative_to(path).as_posix(), p.stat().st_size) for p in path.rglob("*") if p.is_file())
    if not files:
        raise BuildError(f"image.wheelhouse / --wheelhouse: {path} is empty",
                         hint="fill it with `wmctl wheelhouse SPEC --dir DIR` on a machine with a package index")
    return files
