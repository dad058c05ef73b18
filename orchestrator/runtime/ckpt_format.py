"""What a checkpoint is on disk: its names, its marker and digests, and finding the sound ones.

Layout under the checkpoint root (one run's: the launcher scopes it to ``<checkpoint.dir>/<run>``)::

    ATTEMPT                   the newest attempt started on this root; older ones may not commit
    step-00000120/            a checkpoint is complete only when COMMITTED exists in it
        shared.pt             model / optimizer / scheduler / scaler, written once by rank 0
        rank-00000.pt         per-rank RNG, private generators, sampler position, registered states
        rank-00001.pt
        dcp/...               an FSDP job's model and optimizer shards (checkpoint_sharded.py)
        meta.json             step, epoch, samples, world size, caller's extra (JSON)
        COMMITTED             written last: temp file + fsync + rename, then fsync of the folder

The marker (format 2) is JSON: ``step``, ``world_size``, ``files`` (name -> size), and the
identity of the writer: ``run`` (WMCTL_RUN), ``spec_hash`` (WMCTL_SPEC_HASH) and ``attempt``
(WMCTL_ATTEMPT). Markers of format 1 (no identity) still restore.

Integrity: the marker also holds ``digests`` (name -> hex digest; ``digest`` names the
algorithm: sha256, or blake2b-256 in checkpoints written before 2026-12-05) of every file it
lists, meta.json and the DCP shards included.

Standard library only: the orchestrator reads checkpoints from outside the job with it
(``latest_complete``, ``list_checkpoints``, ``verify_checkpoint``, ``read_marker``, ``read_attempt``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

STEP_DIR_RE = re.compile(r"^step-(\d{8})$")
TMP_INFIX = ".tmp-"      # step-N.tmp-<attempt>-<ns>: a re-save of a committed step, until it commits
LEFTOVER_RE = re.compile(r"^step-\d{8}\.(tmp|stale|deleting)-")
COMMIT_MARKER = "COMMITTED"
META_FILE = "meta.json"
SHARED_FILE = "shared.pt"
ATTEMPT_FILE = "ATTEMPT"   # in the root: the newest attempt started on it (fencing)
LOCK_FILE = ".lock"        # in the root: held by the one job writing it (ckpt_io.RootLock)
FORMAT_VERSION = 2   # 1: step, world_size, files; 2: + run, spec_hash, attempt
MIN_KEEP = 2
SHARDED_DIR = "dcp"                 # the step folder's subfolder DCP writes
DCP_METADATA = ".metadata"          # DCP's index, written by the coordinating rank (0)
LAYOUT = "dcp"                      # meta.json "layout" of a sharded checkpoint
# The integrity digest of new checkpoints. sha256 runs in hardware on the CPUs that drive
# accelerators (x86 SHA-NI, the Armv8 SHA2 instructions): 1.8 GB/s on one core of the 2-core
# test machine, where blake2b-256, the digest before, does 0.9; on a save the digest competes
# with the write for CPU (bench/bench_checkpoint.py). The marker names its digest (``digest``)
# and a checkpoint is verified with the one it names, so older checkpoints still verify.
DIGEST_NAME = "sha256"


class Hasher(Protocol):
    """What hashlib's digests offer and the writers use."""

    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


DIGESTS: dict[str, Callable[[], Hasher]] = {
    "sha256": hashlib.sha256,
    "blake2b-256": lambda: hashlib.blake2b(digest_size=32),
}


class CheckpointError(RuntimeError):
    pass


@runtime_checkable
class Stateful(Protocol):
    """What a checkpoint holds the state of (``register(states=...)``): torch's Stateful
    (torch.distributed.checkpoint.stateful), without importing torch."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def rank_done_name(rank: int) -> str:
    return f"rank-{rank:05d}.done"


def new_hasher(name: str = DIGEST_NAME) -> Hasher:
    """A fresh digest of the kind ``name`` (default: the one new checkpoints are written with)."""
    return DIGESTS[name]()


def marker_digest(marker: dict[str, Any]) -> tuple[str | None, str | None]:
    """The digest a marker's ``digests`` were taken with, or (None, why not) for one this
    runtime does not know (a newer wmctl wrote it)."""
    name = marker.get("digest", "blake2b-256")
    if name in DIGESTS:
        return str(name), None
    return None, (f"its marker's digests are {name!r}, which this runtime does not know ({', '.join(DIGESTS)}): "
                  "the image's wmctl runtime is older than the one that wrote it")


def file_digest(path: str | Path, name: str = DIGEST_NAME) -> str:
    """The digest (``name``, default DIGEST_NAME) of a file's content, read in 1 MiB chunks."""
    h = new_hasher(name)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return str(h.hexdigest())


def _digest_mismatch(ckpt_dir: Path, name: str, want: Any, algo: str) -> str | None:
    try:
        got = file_digest(ckpt_dir / name, algo)
    except OSError as err:
        return f"{name} cannot be read ({err})"
    if got != want:
        return (f"{name} content changed since it was written ({algo} {got[:12]}..., "
                f"expected {str(want)[:12]}...)")
    return None


def verify_checkpoint(ckpt_dir: str | Path, shard_digests: bool = True) -> str | None:
    """Why a checkpoint with a marker is not sound, or None when it is: every file the marker
    lists present with its size and, for format 2 markers, its digest. Reads every file, except
    with ``shard_digests=False`` the DCP shards (``dcp/...``: sizes only), which a restoring
    job's ranks verify between them (``verify_shard_share``)."""
    ckpt_dir = Path(ckpt_dir)
    marker = read_marker(ckpt_dir)
    if marker is None or not isinstance(marker.get("files"), dict):
        return f"unreadable {COMMIT_MARKER} marker"
    digests = marker.get("digests")
    digests = digests if isinstance(digests, dict) else {}
    algo, unknown = marker_digest(marker)
    if digests and algo is None:
        return unknown
    for name, size in sorted(marker["files"].items()):
        try:
            actual = (ckpt_dir / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, the marker recorded {size}"
    for name, want in sorted(digests.items()):
        if not shard_digests and name.startswith(f"{SHARDED_DIR}/"):
            continue
        bad = _digest_mismatch(ckpt_dir, name, want, algo or DIGEST_NAME)
        if bad is not None:
            return bad
    return None


def verify_shard_share(ckpt_dir: Path, rank: int, world_size: int) -> str | None:
    """One rank's share of the digests of a checkpoint's DCP shards (every world-th file), or
    why one does not match. Rank 0 checked every size and the other files' digests; the shards,
    the bulk of a sharded checkpoint, are read by all ranks at once."""
    marker = read_marker(ckpt_dir) or {}
    digests = marker.get("digests")
    if not isinstance(digests, dict):
        return None
    algo, unknown = marker_digest(marker)
    if algo is None:
        return unknown
    names = sorted(n for n in digests if n.startswith(f"{SHARDED_DIR}/"))
    for name in names[rank::world_size]:
        bad = _digest_mismatch(ckpt_dir, name, digests[name], algo)
        if bad is not None:
            return bad
    return None


def read_attempt(root: str | Path) -> int | None:
    """The newest attempt recorded as started on this checkpoint root (``ATTEMPT``), if any."""
    try:
        text = (Path(root) / ATTEMPT_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    committed: bool

    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / META_FILE).read_text(encoding="utf-8"))


def read_marker(ckpt_dir: str | Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((Path(ckpt_dir) / COMMIT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_committed(ckpt_dir: str | Path) -> bool:
    """Marker present and every file it lists present with the recorded size."""
    ckpt_dir = Path(ckpt_dir)
    marker = read_marker(ckpt_dir)
    if marker is None:
        return False
    files = marker.get("files")
    if not isinstance(files, dict):
        return False
    for name, size in files.items():
        try:
            if (ckpt_dir / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def list_checkpoints(root: str | Path) -> list[CheckpointInfo]:
    """Every ``step-N`` folder under root, oldest first, committed or not."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        m = STEP_DIR_RE.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False):
            path = Path(entry.path)
            found.append(CheckpointInfo(int(m.group(1)), path, is_committed(path)))
    return sorted(found, key=lambda c: c.step)


def latest_complete(root: str | Path) -> CheckpointInfo | None:
    """The newest committed checkpoint under root; torn or damaged ones are skipped."""
    committed = [c for c in list_checkpoints(root) if c.committed]
    return committed[-1] if committed else None


def checkpoint_files(target: Path) -> dict[str, int]:
    """The files a checkpoint's marker lists, name -> size: the step folder's own (not the
    marker, ``.done`` reports or hidden temp files) and every file of its DCP shard folder
    (named ``dcp/...``; DCP's index is ``.metadata``, a dot file that counts)."""
    files = {e.name: e.stat().st_size for e in os.scandir(target)
             if e.is_file() and not e.name.startswith(".") and e.name != COMMIT_MARKER
             and not e.name.endswith(".done")}
    shards = target / SHARDED_DIR
    if shards.is_dir():
        files.update({f"{SHARDED_DIR}/{e.name}": e.stat().st_size for e in os.scandir(shards)
                      if e.is_file() and not e.name.endswith(".tmp")})
    return files
