"""Exact, atomic checkpoints for torchrun jobs, and their discovery from outside the job.

Layout under the checkpoint root (one run's: the launcher scopes it to ``<checkpoint.dir>/<run>``)::

    ATTEMPT                   the newest attempt started on this root; older ones may not commit
    step-00000120/            a checkpoint is complete only when COMMITTED exists in it
        shared.pt             model / optimizer / scheduler / scaler, written once by rank 0
        rank-00000.pt         per-rank RNG, private generators, sampler position
        rank-00001.pt
        meta.json             step, epoch, samples, world size, caller's extra (JSON)
        COMMITTED             written last: temp file + fsync + rename, then fsync of the folder

An FSDP model (FSDP1 or FSDP2 ``fully_shard``) has no rank holding it whole: its model and
optimizer go to ``dcp/`` instead, each rank writing its own shards through
torch.distributed.checkpoint (checkpoint_sharded.py), and ``shared.pt`` keeps only scheduler
and scaler; meta.json says ``"layout": "dcp"``. Everything below applies to those files too:
each rank reports its shards in its done file, the marker lists and digests them, and a
torn or changed shard makes the checkpoint not count. DCP reshards on load, so a checkpoint of
4 ranks resumes on 2 (reported as not exact, like any change of world size).

The marker (format 2) is JSON: ``step``, ``world_size``, ``files`` (name -> size), and the
identity of the writer: ``run`` (WMCTL_RUN), ``spec_hash`` (WMCTL_SPEC_HASH) and ``attempt``
(WMCTL_ATTEMPT). Restore refuses another run's checkpoint unless it was asked for on purpose
(``--resume-from`` / WMCTL_RESUME_FROM), and warns when the spec changed. Markers of format 1
(no identity) still restore.

Integrity: the marker also holds ``digests`` (name -> hex digest; ``digest`` names the
algorithm: sha256, or blake2b-256 in checkpoints written before 2026-12-05) of every file it lists,
meta.json included, each computed while the file is written (the stream torch.save writes to
is hashed on the way: no extra read). Restore verifies size and digest and loads every file
before it touches the training objects; a checkpoint that fails any of that is reported loudly
(stderr and a ``checkpoint_damaged`` progress event) and the next older one is tried. If every
committed checkpoint is damaged, restore raises rather than training from scratch silently.
Each rank's ``rank-N.done`` file carries the digest of its rank file to rank 0's commit.

Re-saving a step that is already committed (a later attempt that resumed from an older one)
writes ``step-N.tmp-<attempt>-<ns>`` beside it and swaps it in only once committed.

Commit protocol: every rank writes and fsyncs its files, all ranks meet at a barrier, then
rank 0 writes the marker (a commit rank 0 cannot make fails every rank). The marker lists every
file with its size, so a checkpoint whose files were later half-deleted is not taken for complete.
Async saves cannot use a barrier (a collective from a background thread would interleave with
the training loop's collectives), so each rank's writer thread drops a ``rank-N.done`` file
and rank 0's thread waits for all of them; that needs a checkpoint folder every rank can see,
which a resumable multi-node job needs anyway.

Fencing: rank 0 records its attempt (WMCTL_ATTEMPT) in ``ATTEMPT`` when the manager starts and
refuses to commit once a newer attempt has recorded itself there, so an attempt the supervisor
gave up on but that is still running cannot commit over its successor's checkpoints.

The filesystem-only part (``latest_complete``, ``list_checkpoints``, ``apply_retention``,
``verify_checkpoint``, ``read_marker``, ``read_attempt``) imports only the standard library:
the orchestrator calls it from outside the job. torch is imported lazily by the parts that need it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import random
import re
import shutil
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]

from .loader import LoaderTracker
from .checkpoint_sharded import (DCP_METADATA, LAYOUT, SHARDED_DIR, ShardedState, is_sharded_model, load_failures,
                                 local_state)
from .protocol import ENV_ATTEMPT, ENV_RESUME_FROM, ENV_RUN, ENV_SPEC_HASH, ENV_TEST_SLEEP_BEFORE_COMMIT

STEP_DIR_RE = re.compile(r"^step-(\d{8})$")
TMP_INFIX = ".tmp-"      # step-N.tmp-<attempt>-<ns>: a re-save of a committed step, until it commits
LEFTOVER_RE = re.compile(r"^step-\d{8}\.(tmp|stale|deleting)-")
COMMIT_MARKER = "COMMITTED"
META_FILE = "meta.json"
SHARED_FILE = "shared.pt"
ATTEMPT_FILE = "ATTEMPT"   # in the root: the newest attempt started on it (fencing)
FORMAT_VERSION = 2   # 1: step, world_size, files; 2: + run, spec_hash, attempt
MIN_KEEP = 2
# The integrity digest of new checkpoints. sha256 runs in hardware on the CPUs that drive
# accelerators (x86 SHA-NI, the Armv8 SHA2 instructions): 1.8 GB/s on one core of the 2-core
# test machine, where blake2b-256, the digest before, does 0.9; on a save the digest competes
# with the write for CPU (bench/bench_checkpoint.py). The marker names its digest (``digest``)
# and a checkpoint is verified with the one it names, so older checkpoints still verify.
DIGEST_NAME = "sha256"
DIGESTS: dict[str, Callable[[], Any]] = {
    "sha256": hashlib.sha256,
    "blake2b-256": lambda: hashlib.blake2b(digest_size=32),
}

# Test hook (ENV_TEST_SLEEP_BEFORE_COMMIT): "STEP:SECONDS" makes rank 0 sleep after the barrier
# and before writing the commit marker of checkpoint STEP, so a test can kill the job mid-write.


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def rank_done_name(rank: int) -> str:
    return f"rank-{rank:05d}.done"


# ---------------------------------------------------------------- filesystem-only helpers


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    # A rename or a new file is durable only once its directory entry is: fsync the folder.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` holds either nothing/the old content or all of ``data``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _hasher(name: str = DIGEST_NAME) -> Any:
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
    h = _hasher(name)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return str(h.hexdigest())


def verify_checkpoint(ckpt_dir: str | Path, shard_digests: bool = True) -> str | None:
    """Why a checkpoint with a marker is not sound, or None when it is: every file the marker
    lists present with its size and, for format 2 markers, its digest. Reads every file, except
    with ``shard_digests=False`` the DCP shards (``dcp/...``: sizes only), which a restoring
    job's ranks verify between them (``CheckpointManager._verify_shards``)."""
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
        try:
            got = file_digest(ckpt_dir / name, algo or DIGEST_NAME)
        except OSError as err:
            return f"{name} cannot be read ({err})"
        if got != want:
            return (f"{name} content changed since it was written ({algo} {got[:12]}..., "
                    f"expected {str(want)[:12]}...)")
    return None


def read_attempt(root: str | Path) -> int | None:
    """The newest attempt recorded as started on this checkpoint root (``ATTEMPT``), if any."""
    try:
        text = (Path(root) / ATTEMPT_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def record_attempt(root: str | Path, attempt: int) -> int:
    """Record that ``attempt`` started on root and return what the file holds afterwards.

    Within one submission of a run the number only moves forward (max of the file and
    ``attempt``). Attempt 0 always claims it: every ``wmctl submit`` of a run name starts again
    at attempt 0 and resumes from the same checkpoints, and it must not be fenced off by the
    previous submission's last attempt. (The price: an attempt 0 that reaches this point only
    after its successor did takes the fence back; the successor's commit is then refused with
    a clear error and the next attempt claims it again.) Serialised by a lock on
    ``.attempt.lock`` so two attempts starting at once cannot lose the newer number."""
    root = Path(root)
    with open(root / ".attempt.lock", "a+b") as lock:
        if fcntl is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        current = read_attempt(root)
        if attempt > 0 and current is not None and current >= attempt:
            return current
        write_atomic(root / ATTEMPT_FILE, f"{attempt}\n".encode())
        return attempt


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


def _retire(path: Path) -> Path | None:
    """Rename a checkpoint folder out of the way (atomic), so that an interrupted delete never
    leaves a folder that still looks like step-N; the new name, or None if it was gone."""
    doomed = path.with_name(f"{path.name}.deleting-{time.time_ns()}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return None
    return doomed


def _delete_trees(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def apply_retention(root: str | Path, keep: int,
                    delete: Callable[[list[Path]], None] = _delete_trees) -> list[Path]:
    """Keep the newest max(keep, 2) committed checkpoints; retire older ones and torn leftovers.

    Call only right after a commit. Torn folders newer than the newest commit are left alone: an
    attempt still in flight may own them, and the next save of that step replaces them. The
    retired folders are renamed (``.deleting-``) before this returns; ``delete`` removes them
    and earlier leftovers (default: here and now; a manager hands them to its sweeper thread).
    """
    root = Path(root)
    keep = max(int(keep), MIN_KEEP)
    ckpts = list_checkpoints(root)
    committed = [c for c in ckpts if c.committed]
    if not committed:
        return []
    newest = committed[-1].step
    doomed = [c.path for c in committed[:-keep]] if len(committed) > keep else []
    doomed += [c.path for c in ckpts if not c.committed and c.step < newest]
    # Leftovers of interrupted deletes and of replaced torn folders go too.
    leftovers = [Path(entry.path) for entry in os.scandir(root)
                 if entry.is_dir(follow_symlinks=False) and LEFTOVER_RE.match(entry.name)]
    retired = [r for r in map(_retire, doomed) if r is not None]
    delete(retired + leftovers)
    return doomed + leftovers


# ---------------------------------------------------------------- torch parts (lazy imports)


def _torch() -> Any:
    import torch

    return torch


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: python, numpy (if importable), torch CPU, every vendor device."""
    from orchestrator.runtime.dist import device_module, torch_module_name

    torch = _torch()
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np: Any
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        state["numpy"] = np.random.get_state()
    mod = device_module()
    if mod is not None and hasattr(mod, "get_rng_state_all"):
        state["device_module"] = torch_module_name()
        state["device"] = list(mod.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    from orchestrator.runtime.dist import device_module, torch_module_name

    torch = _torch()
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        np: Any
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None:
            np.random.set_state(state["numpy"])
    mod = device_module()
    if "device" in state and mod is not None and state.get("device_module") == torch_module_name():
        mod.set_rng_state_all(state["device"])


def _unwrap(model: Any) -> Any:
    """The module whose state_dict has the model's own names: through DDP and DataParallel
    (``.module``) and torch.compile (``._orig_mod``) only. A user module that merely has an
    attribute called ``module`` is saved whole."""
    torch = _torch()
    wrappers: tuple[Any, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    # A compiled model implies torch._dynamo is loaded; importing it here would cost seconds.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    compiled = getattr(eval_frame, "OptimizedModule", None)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif compiled is not None and isinstance(model, compiled):
            model = model._orig_mod
        else:
            return model


def _to_cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor cloned to CPU: the snapshot an async writer may own."""
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu_copy(v) for v in obj)
    return obj


class _HashingWriter:
    """The file object torch.save writes to: every byte is hashed on its way to the file."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.hash = _hasher()
        self.size = 0
        self.error: OSError | None = None   # torch.save hides it behind "[enforce fail ...] unexpected pos"

    def write(self, data: Any) -> int:
        self.hash.update(data)
        try:
            n = self._fh.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.size += n
        return int(n)

    def flush(self) -> None:
        self._fh.flush()


class _ZipCrc:
    lock = threading.Lock()
    depth = 0
    before = True


@contextmanager
def without_zip_crc() -> Iterator[None]:
    """torch.save without its zip records' CRC32, for the files a sync save writes. Every byte
    of a checkpoint file is digested on its way to disk (DIGEST_NAME, verified on resume), so
    the CRC is a second pass over the same bytes that nothing reads: torch.load does not check
    it (torch.serialization.set_crc32_options). On the 2-core test machine it is half the time
    of a torch.save into memory (0.19 s of 0.37 s for 300 MB), CPU a blocking save takes from
    its own write and digest. torch keeps the option process-wide, so it is off only while a
    sync save blocks the training loop (an async save's writer runs beside the user's code and
    keeps it), and set back to what it was when the last such save ends."""
    torch = _torch()
    with _ZipCrc.lock:
        if _ZipCrc.depth == 0:
            _ZipCrc.before = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        _ZipCrc.depth += 1
    try:
        yield
    finally:
        with _ZipCrc.lock:
            _ZipCrc.depth -= 1
            if _ZipCrc.depth == 0:
                torch.serialization.set_crc32_options(_ZipCrc.before)


def _save_fsync(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save + fsync; the file's size and digest, as written."""
    torch = _torch()
    with open(path, "wb") as fh:
        w = _HashingWriter(fh)
        try:
            torch.save(obj, w)
        except RuntimeError as exc:
            if w.error is not None:      # the file's own error (ENOSPC, EIO), not torch's rewording
                raise w.error from exc
            raise
        fh.flush()
        os.fsync(fh.fileno())
    return {"size": w.size, "digest": w.hash.hexdigest()}


def nonfinite_tensors(items: Any) -> list[str]:
    """The names of the floating-point tensors in ``items`` (name, tensor) that hold a NaN or an
    infinity. In the blocking part of every save, so cheap: one sum per tensor (a NaN or an
    infinity anywhere makes the sum NaN or infinite; ``isfinite().all()`` costs about ten times
    as much, see bench/bench_checkpoint.py) and one device->host read per device. A sum can
    also overflow on finite values; those tensors alone are checked element by element, so
    the answer is exact."""
    torch = _torch()
    by_device: dict[Any, list[tuple[str, Any, Any]]] = {}
    for name, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            t = t.detach()
            # Half-precision sums accumulate in float32 anyway; returning float32 keeps their
            # result from overflowing float16's 65504.
            acc = torch.float32 if t.element_size() < 4 else None
            by_device.setdefault(t.device, []).append((name, t, t.sum(dtype=acc)))
    bad: list[str] = []
    for flags in by_device.values():
        ok = torch.isfinite(torch.stack([s.double() for _, _, s in flags])).tolist()
        bad += [name for (name, t, _), good in zip(flags, ok, strict=True)
                if not good and not bool(torch.isfinite(t).all())]
    return bad


def _payload_bytes(obj: Any) -> int:
    """About how many bytes ``obj`` takes on disk: its tensors' storage (the rest is small)."""
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return int(obj.nelement() * obj.element_size())
    if isinstance(obj, dict):
        return sum(_payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v) for v in obj)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def enospc_in(exc: BaseException) -> OSError | None:
    """The ENOSPC behind ``exc``, if any: itself, its cause or context, or one of the per-rank
    failures a DCP ``CheckpointException`` carries (it words them as its own)."""
    stack: list[Any] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):   # a full disk or quota
            return e
        if isinstance(e, BaseException):
            stack += [e.__cause__, e.__context__]
            failures = getattr(e, "failures", None)
            if isinstance(failures, dict):
                stack += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None


def _no_space_message(path: Path, where: Path, needed: int | None, who: str, done: str = "") -> str:
    """ENOSPC in the words the supervisor's storage_full reads: the path right after the errno
    text, then how much was needed and how much is free, and the fix."""
    try:
        free = _mib(shutil.disk_usage(where).free)
    except OSError:
        free = "unknown"
    need = f"{who}needed about {_mib(needed)}, " if needed is not None else ""
    return (f"checkpoint not saved: [Errno 28] No space left on device: {path} ({need}{free} free there); "
            f"{done}Free space (older checkpoints, a lower checkpoint.keep) or point checkpoint.dir at a "
            "larger volume")


def _write_bytes_fsync(data: bytes, path: Path) -> dict[str, Any]:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    h = _hasher()
    h.update(data)
    return {"size": len(data), "digest": h.hexdigest()}


def _load(path: Path) -> Any:
    # weights_only=False: these files hold RNG tuples and numpy state, and the job wrote them
    # itself into its own checkpoint folder.
    return _torch().load(path, map_location="cpu", weights_only=False)


LOCK_FILE = ".lock"


class _RootLock:
    """An exclusive flock on ``<root>/.lock``, naming its holder (pid@host, run, attempt) in the
    file. Shared by the managers of one process (tests, a job that rebuilds its manager): one
    job is one writer; only another process is refused."""

    _held: dict[str, list[Any]] = {}     # resolved root -> [lock, number of managers holding it]
    _guard = threading.Lock()

    def __init__(self, key: str, fd: int) -> None:
        self.key, self.fd = key, fd

    @classmethod
    def acquire(cls, root: Path, run: str, attempt: int | None) -> _RootLock | None:
        if fcntl is None:
            return None
        key = str(root.resolve())
        with cls._guard:
            if key in cls._held:
                cls._held[key][1] += 1
                return cls._held[key][0]
            fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(fd)
                os.close(fd)
                theirs = holder.get("attempt")
                if (attempt is not None and isinstance(theirs, int) and theirs < attempt
                        and holder.get("run", run) == run):
                    # An older attempt of this run, still alive: the supervisor replaced it, and
                    # the fence (ATTEMPT) keeps it from committing. Go on without the lock.
                    print(f"wmctl: checkpoint folder {root} is still locked by attempt {theirs} "
                          f"({holder.get('pid')}@{holder.get('host')}); attempt {attempt} takes over and "
                          "that attempt can no longer commit", file=sys.stderr, flush=True)
                    return None
                who = f"{holder.get('pid', '?')}@{holder.get('host', '?')}"
                what = f" (run {holder.get('run')!r}, attempt {theirs})" if holder else ""
                raise CheckpointError(
                    f"checkpoint folder {root} is in use by another job: process {who}{what} holds "
                    f"{root / LOCK_FILE}. Two jobs writing one checkpoint folder would overwrite and prune "
                    "each other's checkpoints: stop that job, or give this one its own checkpoint folder") from None
            payload = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run": run,
                                  "attempt": attempt}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, payload, 0)
            lock = cls(key, fd)
            cls._held[key] = [lock, 1]
            return lock

    def release(self) -> None:
        with self._guard:
            entry = self._held.get(self.key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._held[self.key]
                os.close(self.fd)     # closing the descriptor drops the flock


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _attempt_tag(attempt: int | None) -> str:
    return "x" if attempt is None else str(attempt)


def _swap_in(new: Path, final: Path) -> None:
    """Put the committed folder ``new`` in place of the committed ``final``; the old copy is
    deleted only once the new one is in place. A crash between the two renames leaves neither
    under the step's name (both still on disk, under names discovery ignores): resume then
    takes the previous checkpoint, never a half-replaced one."""
    aside = final.with_name(f"{final.name}.stale-{time.time_ns()}")
    try:
        os.rename(final, aside)
        moved = True
    except FileNotFoundError:
        moved = False
    os.rename(new, final)
    fsync_dir(final.parent)
    if moved:
        shutil.rmtree(aside, ignore_errors=True)


def _checkpoint_files(target: Path) -> dict[str, int]:
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


def _test_sleep_before_commit(step: int) -> None:
    raw = os.environ.get(ENV_TEST_SLEEP_BEFORE_COMMIT, "")
    if ":" in raw:
        want, seconds = raw.split(":", 1)
        if want.strip() == str(step):
            time.sleep(float(seconds))


@dataclass
class ResumeState:
    step: int
    epoch: int
    samples: int
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    exact: bool = True
    reason: str = ""                  # why the resume is not exact ("" when it is)
    # Everything worth a look that did not stop the resume: a changed spec, a checkpoint taken
    # from elsewhere on purpose, a world-size change. Printed to stderr by rank 0 as well.
    warnings: list[str] = field(default_factory=list)
    resumed_from: Path | None = None  # the other root it came from (WMCTL_RESUME_FROM); None: own root


class CheckpointError(RuntimeError):
    pass


class CheckpointManager:
    """Save and restore everything a bit-exact resume needs (model, optimizer, scheduler, scaler,
    RNG and sampler state).

    Call ``register`` once with the training objects, ``save(step, ...)`` at optimizer-step
    boundaries (``should_save`` tells when), ``restore()`` once after building everything, and
    ``close()`` at exit. Every rank calls every method at the same point of the loop.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        every_steps: int = 0,
        async_save: bool = False,
        progress: Any | None = None,
        commit_timeout_s: float = 600.0,
        check_finite: bool = True,
        run: str | None = None,
        spec_hash: str | None = None,
        attempt: int | None = None,
        resume_from: str | Path | None = None,
    ) -> None:
        from orchestrator.runtime import dist

        self.root = Path(directory)
        # Who writes: recorded in every marker, checked on restore. Defaults: what the launcher
        # set for the job (empty / None outside wmctl: nothing to check against).
        self.run = os.environ.get(ENV_RUN, "") if run is None else run
        self.spec_hash = os.environ.get(ENV_SPEC_HASH, "") if spec_hash is None else spec_hash
        if attempt is None:
            raw = os.environ.get(ENV_ATTEMPT, "").strip()
            attempt = int(raw) if raw.isdigit() else None
        self.attempt = attempt
        if resume_from is None:
            resume_from = os.environ.get(ENV_RESUME_FROM) or None
        self.resume_from = Path(resume_from) if resume_from else None
        self.keep = max(int(keep), MIN_KEEP)
        self.every_steps = int(every_steps)
        self.async_save = async_save
        self.progress = progress
        self.commit_timeout_s = commit_timeout_s
        # Refuse to commit NaN/inf weights: resume would pick the poisoned checkpoint over the
        # last good one, and every retry of the attempt would start from it.
        self.check_finite = check_finite
        self.rank = dist.rank()
        self.world_size = dist.world_size()
        self.last_blocking_s = 0.0   # how long the last save() held the training loop
        self.last_saved_step: int | None = None
        self._objects: dict[str, Any] = {}
        self._generators: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None   # retention's deletes (rank 0)
        self._error: BaseException | None = None
        self._lock: _RootLock | None = None
        self._sharded: ShardedState | None = None     # set by register() for an FSDP model
        refusal = None
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                # One writer per root: rank 0 holds <root>/.lock for the manager's life.
                self._lock = _RootLock.acquire(self.root, self.run, self.attempt)
                if self.attempt is not None:
                    # Fencing: the root remembers the newest attempt that started on it, so an
                    # older attempt still running somewhere can no longer commit (_check_fence).
                    record_attempt(self.root, self.attempt)
            except CheckpointError as err:
                refusal = str(err)
            except OSError as exc:
                # Every rank must hear it (alone, rank 0 would leave the rest waiting below).
                full = enospc_in(exc)
                refusal = (_no_space_message(Path(exc.filename or self.root), self.root, None, "") if full else
                           f"checkpoint folder {self.root} cannot be used: {exc.strerror or exc}"
                           f"{f' ({exc.filename})' if exc.filename else ''}; point checkpoint.dir at a "
                           "folder every rank can write")
            if refusal is not None and self._lock is not None:
                self._lock.release()      # a retry in this process must not find its own lock
                self._lock = None
        # Every rank fails with rank 0's refusal (alone, rank 0 would leave the rest waiting).
        refusal = dist.broadcast_object(refusal)
        if refusal:
            raise CheckpointError(refusal)
        # DataLoaders: registered ones resume mid-epoch exactly, others make a resume not exact (loader.py).
        self._loaders = LoaderTracker(lambda: self._generators, self.rank)
        self._loaders.on_late = self._not_exact_after_all
        self._resumed_at: tuple[int, str] | None = None

    def register(self, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 scaler: Any = None, sampler: Any = None, generators: dict[str, Any] | None = None,
                 loader: Any = None, loaders: dict[str, Any] | None = None) -> None:
        """``loader`` / ``loaders`` (by name): DataLoaders whose iterators the checkpoint keeps,
        so that a resume continues their epoch exactly (loader.py)."""
        for name, dl in ((("loader", loader),) if loader is not None else ()) + tuple((loaders or {}).items()):
            self._loaders.register(name, dl)
        if model is not None and is_sharded_model(_unwrap(model)):
            # FSDP (1 or 2): no rank holds the whole model, so model and optimizer go through
            # torch.distributed.checkpoint, every rank writing its own shards (checkpoint_sharded).
            if self._sharded is not None:
                raise CheckpointError("register() was already given an FSDP model: call it once per manager")
            try:
                self._sharded = ShardedState(_unwrap(model), optimizer)
            except RuntimeError as err:
                raise CheckpointError(str(err)) from err
        for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                          ("scaler", scaler), ("sampler", sampler)):
            if obj is not None:
                self._objects[name] = obj
        self._generators.update(generators or {})

    def should_save(self, step: int) -> bool:
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    # ------------------------------------------------------------ save

    def save(self, step: int, epoch: int = 0, samples: int = 0, extra: dict[str, Any] | None = None,
             sync: bool | None = None) -> Path:
        """Checkpoint the registered state as of optimizer step ``step`` (all ranks call it)."""
        from orchestrator.runtime import dist

        started = time.perf_counter()
        self.wait()
        final = self.root / step_dir_name(step)
        if self.last_saved_step == step:
            # Preemption right after a periodic save: the state on disk is this state. If that
            # save was async, wait() above joined only this rank's writer; rank 0's may still be
            # committing, and no rank may move on (and maybe exit) before it has.
            dist.barrier()
            self.last_blocking_s = time.perf_counter() - started
            return final
        if self.check_finite:
            bad = self._nonfinite_parameters()
            # Every rank takes the same decision (FSDP shards, or a replica that diverged).
            if dist.all_reduce_max(1 if bad else 0):
                raise CheckpointError(
                    f"refusing to checkpoint step {step}: the model has non-finite (NaN/inf) values"
                    + (f" in {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}" if bad else " on another rank")
                    + "; the newest good checkpoint stays the resume point. Check for NaN/inf before "
                    "optimizer.step() (orchestrator.runtime.dtype_guard.agree_step_finite)")
        prepared: dict[str, Any] | None = None
        if self.rank == 0:
            try:
                prepared = {"target": str(self._prepare_folder(final, step))}
            except CheckpointError as err:
                prepared = {"error": str(err)}
        # Every rank writes where rank 0 prepared (also the point after which every rank sees
        # that folder), or every rank raises rank 0's refusal.
        prepared = dist.broadcast_object(prepared)
        if prepared.get("error"):
            raise CheckpointError(prepared["error"])
        target = Path(prepared["target"])

        rank_payload = self._rank_payload()
        shared_payload = self._shared_payload() if self.rank == 0 else None
        meta = {
            "format": FORMAT_VERSION, "step": step, "epoch": epoch, "samples": samples,
            "world_size": self.world_size, "extra": extra or {}, "time": time.time(),
        }
        sharded = self._sharded
        if sharded is not None:
            meta["layout"] = LAYOUT
        shards_dir = target / SHARDED_DIR
        run_async = self.async_save if sync is None else not sync
        if run_async:
            rank_payload = _to_cpu_copy(rank_payload)
            shared_payload = _to_cpu_copy(shared_payload)
            shards = None
            if sharded is not None:
                # Staged to host memory here (the blocking part), written by DCP's own thread;
                # this save's writer thread waits for it before it reports its rank done.
                sharded.start_async_save(shards_dir)
                shards = functools.partial(sharded.wait_async, shards_dir)
            self._thread = threading.Thread(
                target=self._write_async, name=f"wmctl-ckpt-{step}",
                args=(target, final, step, rank_payload, shared_payload, meta, started, shards), daemon=True)
            self._thread.start()
        else:
            self._save_sync(target, final, step, started, rank_payload, shared_payload, meta,
                            functools.partial(sharded.save, shards_dir) if sharded is not None else None)
        self.last_saved_step = step
        self.last_blocking_s = time.perf_counter() - started
        return final

    def _save_sync(self, target: Path, final: Path, step: int, started: float, rank_payload: dict[str, Any],
                   shared_payload: dict[str, Any] | None, meta: dict[str, Any],
                   shards: Callable[[], dict[str, dict[str, Any]]] | None) -> None:
        """Every rank writes its part, then rank 0 commits; a failure anywhere fails every rank."""
        from orchestrator.runtime import dist

        wrote: BaseException | None = None
        try:
            with without_zip_crc():
                self._write_files(target, rank_payload, shared_payload, meta, shards)
        except Exception as err:  # re-raised below, after every rank has heard of it
            wrote = err
        # A rank that could not write its part (a full disk) fails every rank here; alone it
        # would leave the others waiting in the barrier until the process group's timeout.
        if dist.all_reduce_max(1 if wrote else 0):
            if wrote is not None:
                raise wrote
            raise CheckpointError(f"checkpoint {final} not saved: another rank could not write its part "
                                  "(see its error)")
        dist.barrier()
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                self._commit(target, final, step, started)
            except Exception as err:  # re-raised below, after every rank has heard of it
                failure = err
        # Nobody moves on (and maybe exits) before the checkpoint is committed, and a commit
        # rank 0 could not make (refused, disk full) fails every rank, not only rank 0.
        if dist.all_reduce_max(1 if failure else 0):
            if failure is not None:
                raise failure
            raise CheckpointError(f"checkpoint {final} not committed: rank 0 failed to commit it (see its error)")

    def _prepare_folder(self, final: Path, step: int) -> Path:
        """Rank 0: the folder this save writes (``final``, or beside a committed ``final``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._check_fence(step)
        target = final
        if is_committed(final):
            # A committed checkpoint of this step (an earlier attempt's): never delete it before
            # its replacement is committed. Write beside it under a name discovery ignores, and
            # swap it in after the commit.
            target = final.with_name(f"{final.name}{TMP_INFIX}{_attempt_tag(self.attempt)}-{time.time_ns()}")
        elif final.exists():
            # A torn folder of this step from an earlier attempt: move it out of the way so no
            # stale rank file can end up in the new checkpoint.
            os.rename(final, final.with_name(f"{final.name}.stale-{time.time_ns()}"))
        target.mkdir()
        fsync_dir(self.root)
        return target

    def _check_fence(self, step: int) -> None:
        """Refuse to write once a newer attempt of the run has started on this root: the
        supervisor gave up on this attempt (a partition, a hung node) and its successor owns the
        checkpoints; a late commit from here would compete with that attempt's own."""
        newest = read_attempt(self.root)
        if self.attempt is not None and newest is not None and newest > self.attempt:
            raise CheckpointError(
                f"refusing to commit checkpoint {step}: this is attempt {self.attempt}, but attempt {newest} "
                f"has started on {self.root} (its {ATTEMPT_FILE} file). This attempt is stale; the newer one "
                "owns the checkpoints now, so stop this one (wmctl cancel, or let the supervisor finish it)")

    def wait(self) -> None:
        """Block until this rank's in-flight async save is done (on rank 0: committed) and the
        checkpoints the last commit retired are deleted; raise the save's error, including a
        commit that timed out. Other ranks learn that rank 0 committed only through a
        collective: save() of the same step, or the caller's own barrier."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._sweeper is not None:
            self._sweeper.join()
            self._sweeper = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"async checkpoint failed: {err}") from err

    def _delete_later(self, paths: list[Path]) -> None:
        """Retention's deletes, off the training loop: they are already renamed out of the way,
        and freeing a retired checkpoint's pages takes a tenth of a sync save (0.14 s of about
        1.2 s for 607 MB on the 2-core test machine, bench/bench_checkpoint.py). Joined by
        wait(), so by the next save before it writes (one sweep at a time, the space is back
        before it is needed) and by close(); not a daemon, so an exit after the last save
        finishes it too (said outright: a thread started by the async writer, a daemon, would
        inherit that). The checkpoint is committed by now, so a thread that cannot start does
        not fail it: the deletes run here instead."""
        if not paths:
            return
        sweeper = threading.Thread(target=_delete_trees, args=(paths,), name="wmctl-ckpt-sweep", daemon=False)
        try:
            sweeper.start()
        except RuntimeError:          # no thread to be had (limits, interpreter shutting down)
            _delete_trees(paths)
            return
        self._sweeper = sweeper

    def close(self) -> None:
        """Finish: wait() for an async save and raise its error, then let go of the root's lock.
        Local, no collective: call a barrier after it before a rank exits if every rank must
        know the last save committed."""
        try:
            self.wait()
        finally:
            self._loaders.close()
            if self._sharded is not None:
                self._sharded.close()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _not_exact_after_all(self, reason: str) -> None:
        """A DataLoader the manager does not know was iterated after the resume was reported
        exact: say so (stderr, and the resume event again, now not exact)."""
        if self._resumed_at is None or self.rank != 0:
            return
        step, path = self._resumed_at
        print(f"wmctl: the resume from step {step} is not exact: {reason} (iterated after restore(); register "
              "it with register(loader=...) before restore())", file=sys.stderr, flush=True)
        if self.progress is not None and hasattr(self.progress, "resume"):
            self.progress.resume(step=step, path=path, exact=False, reason=reason, amended=True)

    def _nonfinite_parameters(self) -> list[str]:
        model = self._objects.get("model")
        if model is None:
            return []
        module = _unwrap(model)
        # Sharded: each rank checks its own shards (a whole state_dict would gather them).
        items = module.state_dict().items() if self._sharded is None else local_state(module)
        return nonfinite_tensors(items)

    def _rank_payload(self) -> dict[str, Any]:
        sampler = self._objects.get("sampler")
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "sampler": sampler.state_dict() if sampler is not None else None,
            "generators": {name: g.get_state() for name, g in self._generators.items()},
            "rng": capture_rng(),
            "loaders": self._loaders.state_dict(),
        }

    def _shared_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # An FSDP job's model and optimizer are in its DCP shards, not here.
        names = ("scheduler", "scaler") if self._sharded is not None else ("model", "optimizer", "scheduler", "scaler")
        for name in names:
            obj = self._objects.get(name)
            if obj is not None:
                out[name] = (_unwrap(obj) if name == "model" else obj).state_dict()
        return out

    def _write_files(self, folder: Path, rank_payload: dict[str, Any], shared_payload: dict[str, Any] | None,
                     meta: dict[str, Any], shards: Callable[[], dict[str, dict[str, Any]]] | None = None) -> None:
        """This rank's files, then its ``rank-N.done`` with their sizes and digests (rank 0's
        commit collects them; with async saves the done file also says this rank finished).
        ``shards``: for an FSDP model, writes (or waits for) this rank's DCP shards and returns
        them the same way; a collective when it writes."""
        try:
            written = shards() if shards is not None else {}
            written[rank_file_name(self.rank)] = _save_fsync(rank_payload, folder / rank_file_name(self.rank))
            if self.rank == 0:
                assert shared_payload is not None
                written[SHARED_FILE] = _save_fsync(shared_payload, folder / SHARED_FILE)
                written[META_FILE] = _write_bytes_fsync(json.dumps(meta, sort_keys=True).encode(),
                                                        folder / META_FILE)
            write_atomic(folder / rank_done_name(self.rank), json.dumps(written, sort_keys=True).encode())
        except BaseException as exc:  # OSError from our writes; DCP's CheckpointException is a BaseException
            full = enospc_in(exc)
            if full is None:
                raise
            raise self._disk_full(folder, full, _payload_bytes(rank_payload) + _payload_bytes(shared_payload)) from exc

    def _disk_full(self, folder: Path, exc: OSError, needed: int) -> CheckpointError:
        """ENOSPC while writing: remove what this rank wrote into the torn folder (a half-written
        checkpoint is never resumed, but it would hold the space and fail every later save too),
        and say where, how much this rank needed and how much is free."""
        names = [rank_file_name(self.rank), rank_done_name(self.rank),
                 *((SHARED_FILE, META_FILE, f"{SHARDED_DIR}/{DCP_METADATA}") if self.rank == 0 else ())]
        # DCP's file writer names this rank's shard files __<rank>_<n>.distcp.
        names += [f"{SHARDED_DIR}/{p.name}" for p in (folder / SHARDED_DIR).glob(f"__{self.rank}_*.distcp")]
        for name in names:
            try:
                (folder / name).unlink()
            except FileNotFoundError:
                pass
        if self.rank == 0:
            try:
                folder.rmdir()            # empty once every rank has cleaned up; otherwise the next save's
            except OSError:               # retention removes it with the other torn folders
                pass
        return CheckpointError(_no_space_message(Path(exc.filename or folder), folder, needed,
                                                 f"rank {self.rank} ",
                                                 "the partial files were removed and the newest committed "
                                                 "checkpoint stays the resume point. "))

    def _write_async(self, target: Path, final: Path, step: int, rank_payload: dict[str, Any],
                     shared_payload: dict[str, Any] | None, meta: dict[str, Any], started: float,
                     shards: Callable[[], dict[str, dict[str, Any]]] | None = None) -> None:
        try:
            self._write_files(target, rank_payload, shared_payload, meta, shards)
            if self.rank != 0:
                return
            deadline = time.monotonic() + self.commit_timeout_s
            missing = [r for r in range(self.world_size) if not (target / rank_done_name(r)).exists()]
            while missing:
                if time.monotonic() > deadline:
                    # Left torn on purpose: resume falls back to the previous checkpoint. An error
                    # too, raised by the next save()/wait()/close(): a job that believes it has a
                    # checkpoint it does not have would lose that work on the next failure.
                    msg = (f"checkpoint {target} not committed: ranks {missing} did not finish within "
                           f"{self.commit_timeout_s:.0f} s (is the checkpoint folder shared by every rank?)")
                    print(f"wmctl: {msg}", file=sys.stderr, flush=True)
                    self._error = CheckpointError(msg)
                    return
                time.sleep(0.01)
                missing = [r for r in missing if not (target / rank_done_name(r)).exists()]
            self._commit(target, final, step, started)
        except BaseException as err:  # handed to the training thread by wait(); not swallowed
            self._error = err

    def _commit(self, target: Path, final: Path, step: int, started: float) -> None:
        """Rank 0: write the marker in ``target`` (the folder the ranks wrote), then, when that
        is beside an older committed copy of the step, swap it in as ``final``."""
        _test_sleep_before_commit(step)
        fsync_dir(target)
        if (target / SHARDED_DIR).is_dir():
            fsync_dir(target / SHARDED_DIR)
        # What each rank wrote, by its own account (the done files), checked against the folder.
        written: dict[str, dict[str, Any]] = {}
        for r in range(self.world_size):
            try:
                written.update(json.loads((target / rank_done_name(r)).read_text(encoding="utf-8")))
            except (OSError, ValueError):
                pass
        files = _checkpoint_files(target)
        missing = [rank_file_name(r) for r in range(self.world_size)
                   if rank_file_name(r) not in files or rank_file_name(r) not in written]
        required = [SHARED_FILE, META_FILE] + ([f"{SHARDED_DIR}/{DCP_METADATA}"] if self._sharded is not None else [])
        missing += [name for name in required if name not in files]
        if missing:
            raise CheckpointError(f"checkpoint {target} is missing {missing}; is the checkpoint folder shared by "
                                  "every rank?")
        unknown = sorted(set(files) - set(written))
        changed = sorted(n for n in files if n in written and written[n]["size"] != files[n])
        if unknown or changed:
            raise CheckpointError(f"checkpoint {target}: {unknown or changed} are not what this save's ranks wrote "
                                  f"({'unknown files' if unknown else 'sizes changed after writing'}); is another "
                                  "job writing to the same checkpoint folder?")
        marker = {"format": FORMAT_VERSION, "step": step, "world_size": self.world_size, "files": files,
                  "digest": DIGEST_NAME, "digests": {n: written[n]["digest"] for n in files},
                  "time": time.time(), "run": self.run, "spec_hash": self.spec_hash, "attempt": self.attempt}
        # Last look before the marker makes it count: a newer attempt may have started meanwhile.
        self._check_fence(step)
        write_atomic(target / COMMIT_MARKER, json.dumps(marker, sort_keys=True).encode())
        if target != final:
            _swap_in(target, final)
        fsync_dir(self.root)
        seconds = time.perf_counter() - started
        apply_retention(self.root, self.keep, delete=self._delete_later)
        if self.progress is not None:
            self.progress.checkpoint(step=step, path=str(final), seconds=seconds)

    # ------------------------------------------------------------ restore

    def restore(self, path: str | Path | None = None) -> ResumeState | None:
        """Load the newest sound checkpoint (or ``path``) into the registered objects.

        Returns None when there is nothing to resume from. The run's own root comes first; only
        when it holds no sound checkpoint is ``resume_from`` (WMCTL_RESUME_FROM) used. Another
        run's checkpoint is refused unless it was asked for (``path`` or ``resume_from``). A
        damaged checkpoint (a file missing, resized, changed, or failing to load on any rank)
        is reported and the next older one tried; an explicit ``path`` that is damaged, or a
        root whose every committed checkpoint is, raises CheckpointError. Every file is loaded
        before any object is touched, and RNG state is put back last, so nothing that draws
        random numbers runs after it.
        """
        found = self._agree_on_checkpoint(path)
        if found is None:
            return None
        ckpt, decision, loaded, skipped = found
        warnings: list[str] = list(decision.get("warnings") or [])
        warnings += [f"{s} was damaged: fell back to an older checkpoint" for s in skipped]
        meta, shared, rank_state, rank0_sampler, shards = loaded
        if shards is not None and self._sharded is not None:
            self._sharded.apply(shards)     # model and optimizer first: the scheduler follows them
        for name in ("model", "optimizer", "scheduler", "scaler"):
            obj = self._objects.get(name)
            if obj is not None and name in shared:
                (_unwrap(obj) if name == "model" else obj).load_state_dict(shared[name])

        exact, reason = True, ""
        saved_world = int(meta.get("world_size", self.world_size))
        sampler = self._objects.get("sampler")
        if rank_state is None:
            exact = False
            reason = f"world size changed from {saved_world} to {self.world_size}"
            how = " (resharded by torch.distributed.checkpoint)" if shards is not None else ""
            warnings.append(f"{reason}: resuming inexactly (weights, optimizer{how} and sample position are kept; "
                            "per-rank random state starts anew)")
            if sampler is not None and rank0_sampler is not None:
                sampler.load_state_dict(rank0_sampler, world_size=saved_world)
        else:
            if sampler is not None and rank_state["sampler"] is not None:
                sampler.load_state_dict(rank_state["sampler"])
            # Loader iterators are rebuilt before any RNG is put back: rebuilding draws from it.
            why = self._loaders.restore(rank_state.get("loaders"), positioned=sampler)
            if why:
                exact, reason = False, "; ".join(why)
                warnings.append(f"not exact: {reason} (register every DataLoader with register(loader=...) "
                                "before restore(); see docs/recovery-exactness.md)")
            for name, gen in self._generators.items():
                if name in rank_state["generators"]:
                    gen.set_state(rank_state["generators"][name])
            restore_rng(rank_state["rng"])   # last: see the docstring
        if self.rank == 0:
            for w in warnings:
                print(f"wmctl: checkpoint {ckpt}: {w}", file=sys.stderr, flush=True)
        self.last_saved_step = int(meta["step"])
        self._resumed_at = (int(meta["step"]), str(ckpt))
        elsewhere = decision.get("resumed_from")
        return ResumeState(step=int(meta["step"]), epoch=int(meta.get("epoch", 0)),
                           samples=int(meta.get("samples", 0)), path=ckpt,
                           extra=dict(meta.get("extra") or {}), exact=exact, reason=reason,
                           warnings=warnings, resumed_from=Path(elsewhere) if elsewhere else None)

    def _agree_on_checkpoint(self, path: str | Path | None) -> tuple[Path, dict[str, Any], Any, list[str]] | None:
        """All ranks: the checkpoint every rank could load (rank 0 chooses, all load, all agree),
        falling back past damaged ones; None when there is none to resume from."""
        from orchestrator.runtime import dist

        skip: list[str] = []          # rank 0: candidates found damaged so far
        while True:
            decision = self._choose(path, skip) if self.rank == 0 else None
            # Every rank must load the same checkpoint even if its view of the folder lags, and
            # every rank must raise the same refusal (a lone raise on rank 0 would hang the rest).
            decision = dist.broadcast_object(decision)
            if decision.get("error"):
                raise CheckpointError(decision["error"])
            if decision.get("path") is None:
                if self.rank == 0:
                    for w in decision.get("warnings") or []:
                        print(f"wmctl: checkpoint folder {self.root}: {w}", file=sys.stderr, flush=True)
                return None
            ckpt = Path(decision["path"])
            err = self._verify_shards(ckpt)
            loaded = None
            if err is None:
                loaded, err = self._load_files(ckpt)
            failed = dist.all_reduce_max(1 if err else 0)
            if not failed and loaded is not None:
                # Every rank read the same meta.json: the same verdict everywhere.
                self._check_layout(ckpt, loaded[0])
                if self._sharded is not None:
                    shards, err = self._load_shards(ckpt)     # collective: every rank gets here
                    failed = dist.all_reduce_max(1 if err else 0)
                    loaded = (*loaded[:4], shards)
            if not failed:
                return ckpt, decision, loaded, list(decision.get("skipped") or [])
            reason = err or "another rank could not load its files"
            if err:
                print(f"wmctl: checkpoint {ckpt}: rank {self.rank} cannot load it: {err}", file=sys.stderr, flush=True)
            if path is not None:
                raise CheckpointError(f"checkpoint {ckpt} is damaged ({reason}); name another one, or none to "
                                      "take the newest sound checkpoint")
            if self.rank == 0:
                self._report_damaged(ckpt, reason)
                skip.append(str(ckpt))

    def _load_files(self, ckpt: Path) -> tuple[tuple[dict[str, Any], dict[str, Any], Any, Any, Any] | None, str | None]:
        """Everything this rank needs from ``ckpt``'s own files, loaded into memory, or why it
        cannot be: (meta, shared, own rank state or None after a world-size change, rank 0's
        sampler, None: the DCP shards, loaded next by ``_load_shards``)."""
        try:
            meta = json.loads((ckpt / META_FILE).read_text(encoding="utf-8"))
            shared = _load(ckpt / SHARED_FILE)
            saved_world = int(meta.get("world_size", self.world_size))
            rank_path = ckpt / rank_file_name(self.rank)
            rank_state = _load(rank_path) if saved_world == self.world_size and rank_path.exists() else None
            rank0_sampler = None
            if rank_state is None and self._objects.get("sampler") is not None:
                rank0_sampler = _load(ckpt / rank_file_name(0))["sampler"]
            return (meta, shared, rank_state, rank0_sampler, None), None
        except Exception as err:  # a damaged zip, a bad pickle, a missing key: any of it means damaged
            return None, _why(err)

    def _verify_shards(self, ckpt: Path) -> str | None:
        """This rank's share of the digests of ``ckpt``'s DCP shards (every world-th file), or
        why one does not match. Rank 0 checked every size and the other files' digests; the
        shards, the bulk of a sharded checkpoint, are read by all ranks at once."""
        marker = read_marker(ckpt) or {}
        digests = marker.get("digests")
        if not isinstance(digests, dict):
            return None
        algo, unknown = marker_digest(marker)
        if algo is None:
            return unknown
        names = sorted(n for n in digests if n.startswith(f"{SHARDED_DIR}/"))
        for name in names[self.rank::self.world_size]:
            try:
                got = file_digest(ckpt / name, algo)
            except OSError as err:
                return f"{name} cannot be read ({err})"
            if got != digests[name]:
                return (f"{name} content changed since it was written ({algo} {got[:12]}..., expected "
                        f"{str(digests[name])[:12]}...)")
        return None

    def _load_shards(self, ckpt: Path) -> tuple[Any, str | None]:
        """All ranks: this rank's part of model and optimizer from ``ckpt``'s DCP shards, in
        host memory (nothing applied yet), or why not. DCP reshards across world sizes."""
        assert self._sharded is not None
        try:
            return self._sharded.load(ckpt / SHARDED_DIR), None
        except load_failures() as err:  # DCP raises the failure of any rank on every rank
            return None, _why(err)

    def _check_layout(self, ckpt: Path, meta: dict[str, Any]) -> None:
        """Refuse (every rank alike) a checkpoint whose layout does not fit the model: FSDP
        shards for an unsharded model, or a full model for an FSDP one."""
        sharded_ckpt = meta.get("layout") == LAYOUT
        if sharded_ckpt and self._sharded is None and "model" in self._objects:
            raise CheckpointError(
                f"checkpoint {ckpt} holds FSDP shards (meta.json layout {LAYOUT!r}) but the model given to "
                "register() is not sharded: wrap it with fully_shard (or FSDP) as when it was saved, or "
                "convert the checkpoint with torch.distributed.checkpoint.format_utils.dcp_to_torch_save")
        if not sharded_ckpt and self._sharded is not None:
            raise CheckpointError(
                f"checkpoint {ckpt} holds a full model (saved without FSDP) but the model given to register() "
                "is FSDP-sharded: resume it without FSDP, or start this run from another checkpoint "
                f"(--resume-from / {ENV_RESUME_FROM}) or from scratch in a new checkpoint folder")

    def _report_damaged(self, ckpt: Path, reason: str) -> None:
        """Loudly: never resume past a damaged checkpoint without a word."""
        print(f"wmctl: checkpoint {ckpt} is damaged ({reason}): skipping it, trying the next older one",
              file=sys.stderr, flush=True)
        m = STEP_DIR_RE.match(ckpt.name)
        # Not ``step``: the supervisor reads a step field as the job's progress.
        fields = {"path": str(ckpt), "reason": reason, "damaged_step": int(m.group(1)) if m else None}
        if self.progress is not None and hasattr(self.progress, "checkpoint_damaged"):
            self.progress.checkpoint_damaged(**fields)
        elif self.progress is not None and hasattr(self.progress, "emit"):
            self.progress.emit("checkpoint_damaged", **fields)

    def _newest_sound(self, root: Path, skip: list[str]) -> tuple[Path | None, bool]:
        """Rank 0: the newest checkpoint under root whose files match its marker, reporting (and
        adding to ``skip``) every damaged one on the way; and whether root had any committed."""
        candidates = [c.path for c in reversed(list_checkpoints(root)) if (c.path / COMMIT_MARKER).exists()]
        for cand in candidates:
            if str(cand) in skip:
                continue
            reason = verify_checkpoint(cand, shard_digests=False)
            if reason is None:
                return cand, True
            self._report_damaged(cand, reason)
            skip.append(str(cand))
        return None, bool(candidates)

    def _choose(self, path: str | Path | None, skip: list[str]) -> dict[str, Any]:
        """Rank 0: which checkpoint to load, what to warn about, or why to refuse (plain data,
        broadcast to every rank)."""
        try:
            if path is not None:
                if not is_committed(path):
                    raise CheckpointError(f"{path} is not a committed checkpoint (no valid {COMMIT_MARKER})")
                bad = verify_checkpoint(path, shard_digests=False)
                if bad is not None:
                    raise CheckpointError(f"checkpoint {path} is damaged ({bad}); name another one, or none to "
                                          "take the newest sound checkpoint")
                # Named explicitly: taken on purpose, whoever wrote it.
                return {"path": str(path), "warnings": self._identity_warnings(Path(path), on_purpose=True)}
            own, had_any = self._newest_sound(self.root, skip)
            if own is not None:
                # WMCTL_RESUME_FROM naming this very root says its checkpoints are wanted as they are.
                on_purpose = self.resume_from is not None and _same_place(self.resume_from, self.root)
                return {"path": str(own), "warnings": self._identity_warnings(own, on_purpose), "skipped": list(skip)}
            if self.resume_from is None or _same_place(self.resume_from, self.root):
                if had_any:
                    raise CheckpointError(
                        f"every committed checkpoint under {self.root} is damaged ({', '.join(skip)}; see the "
                        "lines above): refusing to train from scratch silently. Move the damaged step folders "
                        f"aside to start fresh, or start from a good checkpoint with --resume-from / {ENV_RESUME_FROM}")
                return {"path": None, "warnings": self._unscoped_warnings()}
            src = self._resume_from_checkpoint(self.resume_from, skip)
            warnings = [f"resumed from elsewhere on purpose ({ENV_RESUME_FROM}={self.resume_from}): "
                        f"this run's own folder {self.root} had no sound checkpoint"]
            warnings += self._identity_warnings(src, on_purpose=True)
            return {"path": str(src), "warnings": warnings, "resumed_from": str(self.resume_from),
                    "skipped": list(skip)}
        except CheckpointError as err:
            return {"error": str(err)}

    def _unscoped_warnings(self) -> list[str]:
        """Checkpoints written before they were scoped per run sit right in the configured
        folder, the parent of this run's root: starting fresh beside them deserves a word."""
        if not self.run or self.root.name != self.run:
            return []
        old = latest_complete(self.root.parent)
        if old is None:
            return []
        return [f"no checkpoint of run {self.run!r} here, but {old.path} is one in the folder above, where "
                "checkpoints were kept before each run got its own subfolder: starting from scratch. To "
                f"continue from it, pass --resume-from {self.root.parent} (or set {ENV_RESUME_FROM})"]

    def _resume_from_checkpoint(self, where: Path, skip: list[str]) -> Path:
        """A step folder itself, or the newest sound checkpoint under a checkpoint root."""
        if STEP_DIR_RE.match(where.name) or (where / COMMIT_MARKER).exists():
            if not is_committed(where) or str(where) in skip:
                raise CheckpointError(f"{ENV_RESUME_FROM}={where} is not a committed checkpoint (no valid "
                                      f"{COMMIT_MARKER}, or a file it lists is missing, changed size or fails to load)")
            bad = verify_checkpoint(where, shard_digests=False)
            if bad is not None:
                raise CheckpointError(f"{ENV_RESUME_FROM}={where} is damaged ({bad}); name a sound checkpoint")
            return where
        found, had_any = self._newest_sound(where, skip)
        if found is None:
            what = "only damaged checkpoints" if had_any else "no complete checkpoint"
            raise CheckpointError(f"{ENV_RESUME_FROM}={where} holds {what}: name a checkpoint root "
                                  "(the folder with step-NNNNNNNN folders) or one sound step folder")
        return found

    def _identity_warnings(self, ckpt: Path, on_purpose: bool) -> list[str]:
        """Check the marker's identity against this job's; refuse another run's checkpoint unless
        it is taken on purpose. Format 1 markers carry no identity: nothing to check."""
        marker = read_marker(ckpt) or {}
        theirs_run = str(marker.get("run") or "")
        if theirs_run and self.run and theirs_run != self.run and not on_purpose:
            raise CheckpointError(
                f"checkpoint {ckpt} belongs to run {theirs_run!r}, not to this run {self.run!r}: refusing to "
                f"resume from another run's checkpoint by accident. To start {self.run!r} from it on purpose, "
                f"pass --resume-from {ckpt} (or set {ENV_RESUME_FROM}={ckpt}); otherwise give this run a "
                "checkpoint folder of its own")
        warnings = []
        if theirs_run and self.run and theirs_run != self.run:
            warnings.append(f"written by run {theirs_run!r}, resumed by run {self.run!r} on purpose")
        theirs_hash = str(marker.get("spec_hash") or "")
        if theirs_hash and self.spec_hash and theirs_hash != self.spec_hash:
            warnings.append(f"the spec changed since this checkpoint was written (spec hash {theirs_hash} -> "
                            f"{self.spec_hash}): resuming anyway; check that model and optimizer settings still "
                            "match what it was trained with")
        return warnings


def _why(err: BaseException) -> str:
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
