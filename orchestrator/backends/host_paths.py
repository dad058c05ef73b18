"""``host_path`` volumes as folders of this machine: where each one is, which are missing, and
creating the missing writable ones.

Shared by the backends whose host_path volumes are folders of the machine wmctl runs on (the
local backend's checkpoint folder, Docker bind mounts on a local engine). Docker refuses a bind
source that does not exist (``bind source path does not exist``), where ``docker run -v`` and the
local backend create it: a writable folder that is missing is created before the first submit,
with a note; a read-only one is an error naming the field, since creating an empty folder for
data the job only reads hides a typo until the job fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import SpecError
from ..validate import Problems


@dataclass(frozen=True)
class HostFolder:
    field: str          # volumes[i].host_path
    volume: str         # the volume's name
    mount: str          # where the job sees it
    path: Path          # absolute; a relative host_path is relative to the spec's folder
    read_only: bool


def host_path_source(spec: Any, host_path: str) -> Path:
    """The folder a host_path names: absolute as written, relative to the spec's folder otherwise."""
    path = Path(host_path)
    return path if path.is_absolute() else (Path(spec.source_dir) / path).resolve()


def host_folders(spec: Any) -> list[HostFolder]:
    return [HostFolder(f"volumes[{i}].host_path", vol.name, vol.mount, host_path_source(spec, vol.host_path),
                       vol.read_only)
            for i, vol in enumerate(spec.volumes) if vol.source == "host_path" and vol.host_path is not None]


def on_host(spec: Any, container_path: str) -> Path | None:
    """Where a path inside the containers lies on this machine: under a host_path volume's folder,
    or None (a named volume, a path in the image)."""
    inside = PurePosixPath(container_path)
    for f in host_folders(spec):
        mount = PurePosixPath(f.mount)
        if inside == mount or mount in inside.parents:
            return f.path / inside.relative_to(mount)
    return None


def missing_read_only(spec: Any) -> Problems:
    """A read-only host_path that does not exist: never created, so an error before submitting."""
    return [(f.field, f"{f.path} does not exist on this machine, and volume {f.volume!r} is read_only, so "
                      "wmctl does not create it: create the folder (with the data the job reads) or fix the path")
            for f in host_folders(spec) if f.read_only and not f.path.exists()]


def create_missing(spec: Any) -> list[str]:
    """Create every writable host_path folder that does not exist; one note per folder created.
    A folder that cannot be created is a SpecError naming the field (nothing is submitted)."""
    problems = missing_read_only(spec)
    if problems:
        raise SpecError(problems)
    notes: list[str] = []
    for f in host_folders(spec):
        if f.read_only or f.path.exists():
            continue
        try:
            f.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError([(f.field, f"{f.path} does not exist and cannot be created: {exc.strerror or exc}; "
                                       "create it, or point host_path at a folder you can write")]) from None
        notes.append(f"created the missing host folder {f.path} ({f.field}, volume {f.volume!r}, "
                     f"mounted at {f.mount})")
    return notes
