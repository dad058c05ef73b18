"""Durable checkpoint I/O: files written whole or not at all, hashed on their way to disk,
torch.save without its redundant zip CRC, a full disk said in plain words, RNG state, the
fencing record and the root's one-writer lock, and retention.

The filesystem-only part imports the standard library alone; torch is imported when first needed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]

from .ckpt_format import (ATTEMPT_FILE, DCP_METADATA, LEFTOVER_RE, LOCK_FILE, META_FILE, MIN_KEEP, SHARDED_DIR,
                          SHARED_FILE, CheckpointError, list_checkpoints, new_hasher, rank_done_name,
                          rank_file_name, read_attempt)


def _torch() -> Any:
    import torch

    return torch


# ---------------------------------------------------------------- filesystem only


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


def write_bytes_fsync(data: bytes, path: Path) -> dict[str, Any]:
    """``data`` written and fsynced to ``path``; its size and digest."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    h = new_hasher()
    h.update(data)
    return {"size": len(data), "digest": h.hexdigest()}


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


def swap_in(new: Path, final: Path) -> None:
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


def _retire(path: Path) -> Path | None:
    """Rename a checkpoint folder out of the way (atomic), so that an interrupted delete never
    leaves a folder that still looks like step-N; the new name, or None if it was gone."""
    doomed = path.with_name(f"{path.name}.deleting-{time.time_ns()}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return None
    return doomed


def delete_trees(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def apply_retention(root: str | Path, keep: int,
                    delete: Callable[[list[Path]], None] = delete_trees) -> list[Path]:
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


# ---------------------------------------------------------------- a full disk


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


def no_space_message(path: Path, where: Path, needed: int | None, who: str, done: str = "") -> str:
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


# ---------------------------------------------------------------- torch files


class HashingWriter:
    """The file object torch.save writes to: every byte is hashed on its way to the file."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.hash = new_hasher()
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


def disk_full(folder: Path, rank: int, exc: OSError, needed: int) -> CheckpointError:
    """ENOSPC while rank ``rank`` wrote checkpoint ``folder``: remove what it wrote into the torn
    folder (a half-written checkpoint is never resumed, but it would hold the space and fail every
    later save too), and say where, how much this rank needed and how much is free."""
    names = [rank_file_name(rank), rank_done_name(rank),
             *((SHARED_FILE, META_FILE, f"{SHARDED_DIR}/{DCP_METADATA}") if rank == 0 else ())]
    # DCP's file writer names this rank's shard files __<rank>_<n>.distcp.
    names += [f"{SHARDED_DIR}/{p.name}" for p in (folder / SHARDED_DIR).glob(f"__{rank}_*.distcp")]
    for name in names:
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
    if rank == 0:
        try:
            folder.rmdir()            # empty once every rank has cleaned up; otherwise the next save's
        except OSError:               # retention removes it with the other torn folders
            pass
    return CheckpointError(no_space_message(Path(exc.filename or folder), folder, needed, f"rank {rank} ",
                                            "the partial files were removed and the newest committed "
                                            "checkpoint stays the resume point. "))


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


def save_fsync(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save + fsync; the file's size and digest, as written."""
    torch = _torch()
    with open(path, "wb") as fh:
        w = HashingWriter(fh)
        try:
            torch.save(obj, w)
        except RuntimeError as exc:
            if w.error is not None:      # the file's own error (ENOSPC, EIO), not torch's rewording
                raise w.error from exc
            raise
        fh.flush()
        os.fsync(fh.fileno())
    return {"size": w.size, "digest": w.hash.hexdigest()}


def load_file(path: Path) -> Any:
    # weights_only=False: these files hold RNG tuples and numpy state, and the job wrote them
    # itself into its own checkpoint folder.
    return _torch().load(path, map_location="cpu", weights_only=False)


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


# ---------------------------------------------------------------- one writer per root


class RootLock:
    """An exclusive flock on ``<root>/.lock``, naming its holder (pid@host, run, attempt) in the
    file. Shared by the managers of one process (tests, a job that rebuilds its manager): one
    job is one writer; only another process is refused."""

    _held: dict[str, list[Any]] = {}     # resolved root -> [lock, number of managers holding it]
    _guard = threading.Lock()

    def __init__(self, key: str, fd: int) -> None:
        self.key, self.fd = key, fd

    @classmethod
    def acquire(cls, root: Path, run: str, attempt: int | None) -> RootLock | None:
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
