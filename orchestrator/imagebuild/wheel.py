"""The wmctl wheel that goes into every image, so the image runs the same runtime as this CLI.

Two origins, chosen by where ``orchestrator`` was imported from:

- a source checkout (or an editable install): the package is built with its own build backend
  (hatchling) from a staged copy of the tree: hatchling in-process when importable, otherwise
  ``pip wheel --no-deps`` (build isolation fetches hatchling from the configured index);
- an installed wmctl (``pip install wmctl``, no source tree): the installed files are packed back
  into a wheel from the distribution's RECORD. No build backend and no network are needed, and
  the result is the very code that is running. (Shipping a prebuilt wheel inside the wheel was the
  alternative; it doubles the package size and can drift from the installed code.)

``WMCTL_RUNTIME_WHEEL=/path/wmctl-<version>-py3-none-any.whl`` ships a wheel built elsewhere
instead (a release artifact; tests pin one so concurrent edits of the tree cannot change it);
its version must be this CLI's.

Wheels are cached by a fingerprint of their inputs (``~/.cache/wmctl/wheels``), which keeps the
bytes identical from one build to the next, so Docker reuses the runtime layer.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import BuildError

if TYPE_CHECKING:
    import importlib.metadata

DIST_NAME = "wmctl"
_SOURCE_DIRS = ("orchestrator", "templates", "images", "manifests")
_SKIP_PARTS = {"__pycache__", "_data", ".pytest_cache"}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def wheel_name(version: str = __version__) -> str:
    return f"{DIST_NAME}-{version}-py3-none-any.whl"


def cache_dir() -> Path:
    root = os.environ.get("WMCTL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wmctl")
    return Path(root) / "wheels"


@dataclass(frozen=True)
class WheelSource:
    kind: str                     # "source" or "installed"
    root: Path                    # repository root, or the site-packages folder
    dist: importlib.metadata.Distribution | None = None


def locate() -> WheelSource:
    import orchestrator

    pkg_dir = Path(orchestrator.__file__).resolve().parent
    root = pkg_dir.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and f'name = "{DIST_NAME}"' in pyproject.read_text(encoding="utf-8"):
        return WheelSource("source", root)
    import importlib.metadata   # some 30 modules (email, csv, ...): only an installed wmctl needs it

    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None and dist.files:
        init = next((f for f in dist.files if str(f) == "orchestrator/__init__.py"), None)
        if init is not None and Path(str(dist.locate_file(init))).resolve() == pkg_dir / "__init__.py":
            return WheelSource("installed", Path(str(dist.locate_file(""))).resolve(), dist)
    raise BuildError(f"cannot find the wmctl sources or installed files for {pkg_dir}",
                     hint="install wmctl with pip (pip install wmctl) or run it from a source checkout")


def _source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml"]
    if (root / "README.md").is_file():
        files.append(root / "README.md")
    for name in _SOURCE_DIRS:
        base = root / name
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel_parts = path.relative_to(root).parts
            if path.is_file() and not _SKIP_PARTS.intersection(rel_parts) and path.suffix not in (".pyc", ".pyo"):
                files.append(path)
    return files


def _installed_files(source: WheelSource) -> list[tuple[str, Path]]:
    """(archive name, absolute path) for the package and its dist-info, as pip installed them."""
    assert source.dist is not None
    out = []
    for f in source.dist.files or []:
        name = str(f).replace(os.sep, "/")
        top = name.split("/", 1)[0]
        if name.startswith("..") or "__pycache__" in name or name.endswith((".pyc", ".pyo")):
            continue
        if top.endswith(".dist-info"):
            if name.rsplit("/", 1)[-1] in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
        elif top != "orchestrator":
            continue
        out.append((name, Path(str(source.dist.locate_file(f)))))
    return sorted(out)


ENV_WHEEL = "WMCTL_RUNTIME_WHEEL"


def pinned_wheel() -> Path | None:
    """The wheel named by WMCTL_RUNTIME_WHEEL, checked; None when the variable is unset."""
    value = os.environ.get(ENV_WHEEL)
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise BuildError(f"{ENV_WHEEL}={value}: no such file",
                         hint=f"unset {ENV_WHEEL} to build the wheel from wmctl itself")
    if path.name != wheel_name():
        raise BuildError(f"{ENV_WHEEL}={value}: expected {wheel_name()} (the CLI's version {__version__})")
    return path


def fingerprint(source: WheelSource | None = None) -> str:
    """sha256 of everything that goes into the wheel (cheap: no build)."""
    pinned = pinned_wheel()
    if pinned is not None:
        return hashlib.sha256(b"pinned\0" + pinned.read_bytes()).hexdigest()
    source = source or locate()
    h = hashlib.sha256(f"{source.kind}\0{__version__}\0".encode())
    if source.kind == "source":
        for path in _source_files(source.root):
            h.update(path.relative_to(source.root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    else:
        for name, path in _installed_files(source):
            h.update(name.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _stage_source(root: Path, stage: Path) -> None:
    for name in _SOURCE_DIRS:  # force-included folders must exist even when still empty
        if (root / name).is_dir():
            (stage / name).mkdir(parents=True, exist_ok=True)
    for path in _source_files(root):
        dest = stage / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    if not (stage / "README.md").exists():
        # pyproject names README.md as the long description; only the metadata needs it.
        (stage / "README.md").write_text("wmctl\n", encoding="utf-8")


def _build_from_source(root: Path, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="wmctl-wheel-") as tmp:
        stage = Path(tmp) / "src"
        stage.mkdir()
        _stage_source(root, stage)
        env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")}
        try:
            import hatchling  # noqa: F401  (only probing that the backend is importable)

            cmd = [sys.executable, "-c",
                   "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
                   str(out_dir)]
        except ImportError:
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out_dir), str(stage)]
        try:
            result = subprocess.run(cmd, cwd=stage, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise BuildError("building the wmctl wheel timed out after 600 s") from None
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise BuildError(f"building the wmctl wheel from {root} failed:\n{tail}",
                             hint="pip needs the hatchling build backend (pip install hatchling) or a package index")
    built = out_dir / wheel_name()
    if not built.is_file():
        found = ", ".join(p.name for p in out_dir.glob("*.whl")) or "nothing"
        raise BuildError(f"building the wmctl wheel produced {found}, expected {built.name}")
    return built


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _repack_installed(source: WheelSource, out_dir: Path) -> Path:
    import zipfile
    files = _installed_files(source)
    dist_info = next((n.split("/", 1)[0] for n, _ in files if n.split("/", 1)[0].endswith(".dist-info")), None)
    if dist_info is None:
        raise BuildError("the installed wmctl has no .dist-info metadata to repack")
    target = out_dir / wheel_name()
    records = []
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, path in files:
            data = path.read_bytes()
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = (0o644 << 16)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            records.append(_record_line(name, data))
        record_name = f"{dist_info}/RECORD"
        records.append(f"{record_name},,")
        info = zipfile.ZipInfo(record_name, date_time=_ZIP_TIME)
        info.external_attr = (0o644 << 16)
        zf.writestr(info, "\n".join(records) + "\n")
    return target


def build_wheel(dest_dir: Path | None = None) -> Path:
    """Return a path to ``wmctl-<version>-py3-none-any.whl`` (from the cache when unchanged)."""
    pinned = pinned_wheel()
    if pinned is not None:
        if dest_dir is None:
            return pinned
        dest = Path(dest_dir) / pinned.name
        shutil.copyfile(pinned, dest)
        return dest
    source = locate()
    key = fingerprint(source)
    cached = cache_dir() / key[:16] / wheel_name()
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="wmctl-wheel-out-", dir=cached.parent) as tmp:
            out = Path(tmp)
            built = _build_from_source(source.root, out) if source.kind == "source" else _repack_installed(source, out)
            os.replace(built, cached)  # atomic: a concurrent build sees the whole file or none
    if dest_dir is None:
        return cached
    dest = Path(dest_dir) / cached.name
    shutil.copyfile(cached, dest)
    return dest
