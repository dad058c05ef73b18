"""The sharded half of a checkpoint: model and optimizer of an FSDP job through
``torch.distributed.checkpoint`` (DCP), each rank writing only its own shards.

``CheckpointManager`` (checkpoint.py) owns everything else: the step folder, the rank files
(RNG, generators, sampler), ``shared.pt`` (scheduler, scaler), the commit marker and its
digests, fencing and the lock. For an FSDP model it hands model and optimizer to a
``ShardedState``, which writes them into the ``dcp/`` subfolder of the step folder::

    step-00000120/
        dcp/.metadata          DCP's index of every shard, written by rank 0
        dcp/__0_0.distcp       rank 0's shards of model and optimizer
        dcp/__1_0.distcp       rank 1's ...
        shared.pt              scheduler, scaler (no model, no optimizer)
        rank-00000.pt ...      as for any checkpoint
        COMMITTED              the same format-2 marker: it lists (and digests) the dcp/ files too

Each rank reports the DCP files it wrote, with their sizes and digests (ckpt_format.DIGEST_NAME), in its
``rank-N.done`` file like its other files; rank 0's commit then lists them in the marker, so a
shard that is missing, torn or changed makes the checkpoint not count exactly as a damaged
``shared.pt`` would.

Collectives: DCP plans a save and writes its index with collectives. They run on a process
group of their own (gloo), created in ``register``: an async save runs them from a background
thread, and on the training group they could interleave with the training loop's collectives.

Loading goes through DCP too, so a checkpoint written by 4 ranks loads into 2 (DCP reshards);
the manager reports such a resume as not exact.

Standard library and torch only; torch.distributed.checkpoint is imported when first needed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .ckpt_format import DCP_METADATA, LAYOUT, SHARDED_DIR, new_hasher
from .ckpt_tensors import host_copy, map_tensors, tensor_leaves

__all__ = ["DCP_METADATA", "LAYOUT", "SHARDED_DIR", "ShardedState", "is_sharded_model", "load_failures",
           "local_state", "local_tensor", "pinned_staging_available"]


def pinned_staging_available() -> bool:
    """Whether async saves can stage into pinned host memory: torch pins host memory only with
    CUDA (ROCm builds included); elsewhere the staging copy is plain host memory."""
    import torch

    return bool(torch.cuda.is_available())


def fsdp_classes() -> tuple[type, ...]:
    """FSDP1's wrapper and FSDP2's module class, where torch.distributed.fsdp is loaded (a
    model cannot be sharded without it: nothing to import for a job that does not shard)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return ()
    return tuple(c for c in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None))
                 if isinstance(c, type))


def load_failures() -> tuple[type[BaseException], ...]:
    """What a failed shard load raises: DCP reports any rank's failure on every rank as a
    CheckpointException, which derives from BaseException, not Exception; anything else a
    damaged shard causes (a bad pickle, a short read) is an Exception."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def is_sharded_model(model: Any) -> bool:
    """Whether any module of ``model`` is FSDP-sharded (FSDP1 wrapper or FSDP2 ``fully_shard``)."""
    classes = fsdp_classes()
    return bool(classes) and any(isinstance(m, classes) for m in model.modules())


def local_tensor(t: Any) -> Any:
    """A DTensor's local shard (FSDP2 parameters and gradients), or the tensor itself. Reading
    a DTensor whole would gather it across ranks."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def local_state(module: Any) -> list[tuple[str, Any]]:
    """What a checkpoint of ``module`` holds, as this rank's local tensors: parameters (their
    shards) and persistent buffers (a non-persistent one, such as a -inf attention mask, is
    not saved and not checked). Never a collective, unlike a full ``state_dict()`` of FSDP1."""
    out = [(name, local_tensor(p)) for name, p in module.named_parameters()]
    for prefix, mod in module.named_modules():
        skip: set[str] = getattr(mod, "_non_persistent_buffers_set", set())
        for name, buf in mod.named_buffers(recurse=False):
            if name not in skip and buf is not None:
                out.append((f"{prefix}.{name}" if prefix else name, local_tensor(buf)))
    return out


class ShardedState:
    """Model and optimizer of one FSDP job, saved and loaded through DCP.

    Every method except ``in_flight`` and ``close`` is collective: every rank calls it at the same point.
    """

    def __init__(self, model: Any, optimizer: Any = None, *, pinned: bool | None = None) -> None:
        import torch.distributed as tdist

        if not (tdist.is_available() and tdist.is_initialized()):
            raise RuntimeError("an FSDP model needs the process group initialised before CheckpointManager.register "
                               "(call orchestrator.runtime.dist.init_from_env() first)")
        self.model = model
        self.optimizer = optimizer
        # Its own gloo group: DCP's collectives of an async save run in a background thread.
        self.group = tdist.new_group(backend="gloo")
        if pinned is None:
            pinned = pinned_staging_available()
        self.pinned = pinned
        self._stager: Any = None
        self._future: Future[Any] | None = None
        self._writer: Any = None
        self._hash_pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------ state dicts

    def _state_dicts(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optimizer": osd}

    def _writer_for(self, folder: Path) -> Any:
        # sync_files: every shard fsynced before its rank says it is done. overwrite=False: a
        # step folder is always new (re-saves go to a fresh temp folder).
        writer = _RecordingWriter(str(folder), sync_files=True, overwrite=False)
        if isinstance(getattr(writer, "fs", None), _filesystem_class()):
            # Shards hashed on their way to the file (no re-read), overlapped with the write.
            if self._hash_pool is None:
                self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wmctl-digest")
            writer.fs = _DigestingFileSystem(self._hash_pool)
        return writer

    # ------------------------------------------------------------ save

    def save(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Write this rank's shards (collective, blocking); its files with sizes and digests,
        named relative to the step folder (``dcp/...``)."""
        import torch.distributed.checkpoint as dcp

        writer = self._writer_for(folder)
        dcp.save(self._state_dicts(), storage_writer=writer, process_group=self.group)
        return writer.written_files()

    def start_async_save(self, folder: Path) -> None:
        """Stage the state to host memory (the part the training loop waits for) and write it in
        DCP's background thread. At most one in flight: the caller waits for the last first."""
        import torch.distributed.checkpoint as dcp

        if self._future is not None:
            raise RuntimeError("a sharded async save is still in flight: wait_async() first")
        if self._stager is None:
            self._stager = _cached_stager(self.pinned)
        self._writer = self._writer_for(folder)
        result: Any = dcp.async_save(self._state_dicts(), storage_writer=self._writer, process_group=self.group,
                                     async_stager=self._stager)
        # A Future, or (with a stager that stages in the background) a response holding one.
        self._future = getattr(result, "upload_completion", result)

    def wait_async(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Block until the async save started by ``start_async_save`` is written (its DCP index
        too, on rank 0); this rank's files as ``save`` returns them. Raises its error."""
        future, writer = self._future, self._writer
        self._future, self._writer = None, None
        if future is None or writer is None:
            raise RuntimeError("no sharded async save in flight")
        future.result()
        return writer.written_files()

    def staged_pinned(self) -> bool | None:
        """Whether the host copies of the last async save are in pinned memory (None: no async
        save staged yet). For checks on a device (bench/gpu_check_sharded.py)."""
        cache = getattr(self._stager, "cache", None)
        if cache is None:
            return None
        tensors = [local_tensor(t) for t in _leaves(cache)]
        return all(t.is_pinned() for t in tensors if t.numel())

    def in_flight(self) -> bool:
        return self._future is not None

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._hash_pool is not None:
            self._hash_pool.shutdown(wait=True)
            self._hash_pool = None

    # ------------------------------------------------------------ load

    def load(self, folder: Path) -> dict[str, Any]:
        """Read the shards this rank needs (collective) into host copies of the state dicts,
        leaving model and optimizer untouched; ``apply`` puts them in. DCP reshards when the
        checkpoint was written by another number of ranks."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        target = host_copy(self._state_dicts())
        dcp.load(target, storage_reader=FileSystemReader(str(folder)), process_group=self.group)
        return target

    def apply(self, loaded: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, loaded["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"],
                           optim_state_dict=loaded["optimizer"])


def _leaves(obj: Any) -> list[Any]:
    """The tensors of a nested state dict."""
    return list(tensor_leaves(obj))


def _structure(obj: Any) -> Any:
    """What a staging cache must match: keys, and each tensor's type, shape and dtype (other
    values, such as a learning rate, may change between saves)."""
    return map_tensors(obj, lambda t: (type(t).__name__, tuple(t.shape), t.dtype, tuple(local_tensor(t).shape)),
                       lambda _: None)


def _cached_stager(pinned: bool) -> Any:
    """The async save's stager: one host copy of the state dict (model and optimizer, each
    DTensor as its local shard), made at the first save and filled again by every later one,
    with one copy per tensor. DCP's DefaultStager deep-copies every DTensor's sharding spec at
    each save: most of its staging time on CPU (bench_checkpoint). With CUDA the copy is in
    pinned memory and filled by non-blocking copies, synchronised once before stage() returns;
    staging is synchronous either way, so the training loop may change the weights as soon as
    save() returns. At most one save is in flight (ShardedState), so the copy is never refilled
    while DCP still writes it. The copy is rebuilt when the state dict's structure changes (the
    optimizer's state appears after its first step)."""
    import torch
    from torch.distributed._state_dict_utils import _copy_state_dict
    from torch.distributed.checkpoint.staging import AsyncStager

    class CachedStager(AsyncStager):
        _synchronize_after_execute = False

        def __init__(self) -> None:
            self.cache: dict[str, Any] | None = None
            self._structure: Any = None

        def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
            shape = _structure(state_dict)
            if self.cache is None or shape != self._structure:
                self.cache = _empty_host_copy(state_dict, pinned)
                self._structure = shape
            staged: dict[str, Any] = _copy_state_dict(state_dict, self.cache, non_blocking=pinned, type_check=False)
            if pinned:
                torch.cuda.synchronize()
            return staged

        def synchronize_staging(self) -> None:
            pass

        def close(self) -> None:
            self.cache = None

    return CachedStager()


def _empty_host_copy(obj: Any, pinned: bool) -> Any:
    """The staging cache's buffers: the state dict's structure with a new, unfilled host tensor
    (pinned if asked) for every tensor; a DTensor becomes a DTensor of the same sharding spec
    around its local shard's buffer. torch's _create_cpu_state_dict deep-copies every DTensor
    first, data and all (on a device: a whole device-to-host copy of the shard), only to swap
    its local tensor for an empty one: on the 2-core test machine 272 ms of a first async
    save's 438 ms for 304 MB a rank. Other leaves (plain tensors, ShardedTensor, Python
    values) are made by torch's function, as before."""
    import torch
    from torch.distributed._state_dict_utils import _create_cpu_state_dict
    from torch.distributed.tensor import DTensor

    def by_torch(leaf: Any) -> Any:
        return _create_cpu_state_dict({"leaf": leaf}, pin_memory=pinned)["leaf"]

    def tensor(t: Any) -> Any:
        if not (isinstance(t, DTensor) and t.dim() > 0):
            return by_torch(t)
        local = t._local_tensor
        if local.numel() == 0 or local.data_ptr() == 0:
            buf = torch.zeros_like(local, device="cpu")
        else:
            buf = torch.empty(tuple(local.size()), dtype=local.dtype, pin_memory=pinned)
        return DTensor(buf, t._spec, requires_grad=False)

    return map_tensors(obj, tensor, by_torch)       # tuples stay plain tuples, as torch's walk makes them


def _recording_writer_class() -> type:
    from torch.distributed.checkpoint import FileSystemWriter

    class RecordingWriter(FileSystemWriter):
        """DCP's file writer, remembering which files this rank's ``write_data`` wrote."""

        def write_data(self, plan: Any, planner: Any) -> Any:
            fut = super().write_data(plan, planner)
            self._wmctl_results = fut
            return fut

        def finish(self, metadata: Any, results: Any) -> None:
            super().finish(metadata, results)
            self._wmctl_wrote_metadata = True

        def written_files(self) -> dict[str, dict[str, Any]]:
            """This rank's files (shards; rank 0: the index too), with size and digest, named
            as the marker lists them (``dcp/NAME``: relative to the step folder). Read back
            once written and fsynced: the digest is of what is on disk."""
            base = Path(str(self.path))
            names: set[str] = set()
            fut = getattr(self, "_wmctl_results", None)
            for result in (fut.value() if fut is not None else []):
                names.add(result.storage_data.relative_path)
            if getattr(self, "_wmctl_wrote_metadata", False):
                names.add(DCP_METADATA)
            # Shards: digested while written (_DigestingFileSystem); the small index, which DCP
            # writes under a temp name and renames, is read back.
            seen: dict[str, Any] = getattr(self.fs, "wmctl_written", None) or {}
            return {f"{base.name}/{name}": seen.get(name) or _digest_file(base / name) for name in sorted(names)}

    return RecordingWriter


class _LazyWriter:
    cls: type | None = None


def _RecordingWriter(*args: Any, **kwargs: Any) -> Any:  # noqa: N802  (a class, built on first use)
    if _LazyWriter.cls is None:
        _LazyWriter.cls = _recording_writer_class()
    return _LazyWriter.cls(*args, **kwargs)


OVERLAP_MIN_BYTES = 1 << 20     # smaller writes are hashed inline: a thread hand-off costs more


class _DigestingStream:
    """The file DCP writes one shard file into. Every byte is hashed on its way, like the
    full checkpoint's files: no second read of what was just written. A large write (a tensor's
    bytes) is hashed on a helper thread while the write runs; both release the GIL, so the
    digest takes no extra time where a core is free or the write waits for the disk. Each
    write returns only once both are done: the buffer (a view of the tensor) is valid only
    for the call."""

    def __init__(self, fh: Any, pool: ThreadPoolExecutor) -> None:
        self._fh = fh
        self._pool = pool
        self._hash = new_hasher()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes >= OVERLAP_MIN_BYTES and view.c_contiguous:
            hashed = self._pool.submit(self._hash.update, view)
            try:
                n = self._fh.write(view)
            finally:
                hashed.result()
        else:
            self._hash.update(view)
            n = self._fh.write(view)
        self.size += n
        return int(n)

    def record(self) -> dict[str, Any]:
        return {"size": self.size, "digest": self._hash.hexdigest()}

    def __getattr__(self, name: str) -> Any:       # tell, flush, fileno (fsync), close, ...
        return getattr(self._fh, name)


class _LazyFileSystem:
    base: type | None = None
    cls: type | None = None


def _filesystem_class() -> type:
    """DCP's local file system class (what a FileSystemWriter writes through)."""
    if _LazyFileSystem.base is None:
        from torch.distributed.checkpoint.filesystem import FileSystem

        _LazyFileSystem.base = FileSystem
    return _LazyFileSystem.base


def _DigestingFileSystem(pool: ThreadPoolExecutor) -> Any:  # noqa: N802  (a class, built on first use)
    if _LazyFileSystem.cls is None:
        base = _filesystem_class()

        class DigestingFileSystem(base):  # type: ignore[misc, valid-type]
            """DCP's file system, its files written through ``_DigestingStream``: ``wmctl_written``
            maps each file name this writer wrote to its size and digest."""

            def __init__(self, pool: ThreadPoolExecutor) -> None:
                super().__init__()
                self.pool = pool
                self.wmctl_written: dict[str, dict[str, Any]] = {}
                self.lock = threading.Lock()     # DCP's writer may run several threads

            @contextmanager
            def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
                if "w" not in mode:
                    with super().create_stream(path, mode) as stream:
                        yield stream
                    return
                with open(path, mode) as fh:
                    stream = _DigestingStream(fh, self.pool)
                    yield stream
                with self.lock:
                    self.wmctl_written[Path(path).name] = stream.record()

        _LazyFileSystem.cls = DigestingFileSystem
    return _LazyFileSystem.cls(pool)


def _digest_file(path: Path) -> dict[str, Any]:
    h = new_hasher()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "digest": h.hexdigest()}
