"""Exact, atomic checkpoints for torchrun jobs: the manager, and the public face of the rooms.

``CheckpointManager`` saves and restores everything a bit-exact resume needs. What a checkpoint
is on disk (names, the marker, digests, discovery) lives in ckpt_format.py; durable I/O (atomic
and hashed writes, ENOSPC, RNG capture, the root lock, retention) in ckpt_io.py; the choice of
the checkpoint a restore takes, and reading it, in ckpt_read.py; walks over nested tensors in ckpt_tensors.py;
an FSDP model's shards in checkpoint_sharded.py. Users import all of it from here.

An FSDP model (FSDP1 or FSDP2 ``fully_shard``) has no rank holding it whole: its model and
optimizer go to ``dcp/`` instead, each rank writing its own shards through
torch.distributed.checkpoint (checkpoint_sharded.py), and ``shared.pt`` keeps only scheduler
and scaler; meta.json says ``"layout": "dcp"``. Everything below applies to those files too:
each rank reports its shards in its done file, the marker lists and digests them, and a
torn or changed shard makes the checkpoint not count. DCP reshards on load, so a checkpoint of
4 ranks resumes on 2 (reported as not exact, like any change of world size).

Beside model, optimizer, scheduler, scaler and sampler, ``register(states={...})`` takes any
object with ``state_dict()`` and ``load_state_dict()`` (torch's Stateful protocol), as
torchtitan checkpoints one dict of them. Each rank saves its own in its rank file; a resume on
another world size gives every rank rank 0's.

Integrity: each file's digest is computed while the file is written (the stream torch.save
writes to is hashed on the way: no extra read); each rank's ``rank-N.done`` file carries them to
rank 0's commit. Restore verifies and loads every file before it touches the training objects,
falling back past damaged checkpoints (ckpt_read.py).

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

import functools
import json
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .checkpoint_sharded import ShardedState, is_sharded_model, local_state
from .loader import LoaderTracker
from .ckpt_format import (ATTEMPT_FILE, COMMIT_MARKER, DCP_METADATA, DIGEST_NAME, DIGESTS, FORMAT_VERSION, LAYOUT,
                          LEFTOVER_RE, LOCK_FILE, META_FILE, MIN_KEEP, SHARDED_DIR, SHARED_FILE, STEP_DIR_RE,
                          TMP_INFIX, CheckpointError, CheckpointInfo, Stateful, checkpoint_files, file_digest,
                          is_committed, latest_complete, list_checkpoints, marker_digest, new_hasher, rank_done_name,
                          rank_file_name, read_attempt, read_marker, step_dir_name, verify_checkpoint)
from .ckpt_io import (RootLock, apply_retention, capture_rng, delete_trees, disk_full, enospc_in, fsync_dir, fsync_file,
                      no_space_message, record_attempt, restore_rng, save_fsync, swap_in, without_zip_crc,
                      write_atomic, write_bytes_fsync)
from .ckpt_read import ReadSide
from .ckpt_tensors import host_copy, nonfinite_tensors, payload_bytes, unwrap
from .protocol import (ENV_ATTEMPT, ENV_FENCE_EPOCH, ENV_RESUME_FROM, ENV_RUN, ENV_SPEC_HASH,
                       ENV_TEST_SLEEP_BEFORE_COMMIT)

# The public API: every name users imported from here when all of it lived in this module, and
# register()'s Stateful.
__all__ = [
    "ATTEMPT_FILE", "COMMIT_MARKER", "DCP_METADATA", "DIGEST_NAME", "DIGESTS", "FORMAT_VERSION", "LAYOUT",
    "LEFTOVER_RE", "LOCK_FILE", "META_FILE", "MIN_KEEP", "SHARDED_DIR", "SHARED_FILE", "STEP_DIR_RE", "TMP_INFIX",
    "CheckpointError", "CheckpointInfo", "CheckpointManager", "ResumeState", "Stateful", "apply_retention",
    "capture_rng", "enospc_in", "file_digest", "fsync_dir", "fsync_file", "is_committed", "latest_complete",
    "list_checkpoints", "marker_digest", "new_hasher", "nonfinite_tensors", "rank_done_name", "rank_file_name",
    "read_attempt", "read_marker", "record_attempt", "restore_rng", "step_dir_name", "verify_checkpoint",
    "without_zip_crc", "write_atomic",
]

# Test hook (ENV_TEST_SLEEP_BEFORE_COMMIT): "STEP:SECONDS" makes rank 0 sleep after the barrier
# and before writing the commit marker of checkpoint STEP, so a test can kill the job mid-write.


def _attempt_tag(attempt: int | None) -> str:
    return "x" if attempt is None else str(attempt)


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


class CheckpointManager(ReadSide):
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
        # Fencing compares epochs: the attempt, or (spare nodes) the epoch of this round of it.
        raw_epoch = os.environ.get(ENV_FENCE_EPOCH, "").strip()
        self.fence = int(raw_epoch) if raw_epoch.isdigit() and attempt is not None else attempt
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
        self._states: dict[str, Stateful] = {}      # register(states=...): saved by every rank
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None   # retention's deletes (rank 0)
        self._error: BaseException | None = None
        self._lock: RootLock | None = None
        self._sharded: ShardedState | None = None     # set by register() for an FSDP model
        refusal = None
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                # One writer per root: rank 0 holds <root>/.lock for the manager's life.
                self._lock = RootLock.acquire(self.root, self.run, self.attempt)
                if self.attempt is not None:
                    # Fencing: the root remembers the newest attempt that started on it, so an
                    # older attempt still running somewhere can no longer commit (_check_fence).
                    record_attempt(self.root, self.fence if self.fence is not None else self.attempt)
            except CheckpointError as err:
                refusal = str(err)
            except OSError as exc:
                # Every rank must hear it (alone, rank 0 would leave the rest waiting below).
                full = enospc_in(exc)
                refusal = (no_space_message(Path(exc.filename or self.root), self.root, None, "") if full else
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
                 states: Mapping[str, Stateful] | None = None, loader: Any = None,
                 loaders: dict[str, Any] | None = None) -> None:
        """The objects every save holds and restore() puts back. ``states``: any more, by name,
        each with ``state_dict()`` and ``load_state_dict()`` (torch's Stateful), as torchtitan
        checkpoints one dict of them; each rank saves its own (a resume on another world size
        gives every rank rank 0's). ``loader`` / ``loaders`` (by name): DataLoaders whose
        iterators the checkpoint keeps, so that a resume continues their epoch exactly (loader.py)."""
        named = self._check_registered(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                       sampler=sampler, states=states)
        for name, dl in ((("loader", loader),) if loader is not None else ()) + tuple((loaders or {}).items()):
            self._loaders.register(name, dl)
        if model is not None and is_sharded_model(unwrap(model)):
            # FSDP (1 or 2): no rank holds the whole model, so model and optimizer go through
            # torch.distributed.checkpoint, every rank writing its own shards (checkpoint_sharded).
            if self._sharded is not None:
                raise CheckpointError("register() was already given an FSDP model: call it once per manager")
            try:
                self._sharded = ShardedState(unwrap(model), optimizer)
            except RuntimeError as err:
                raise CheckpointError(str(err)) from err
        for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                          ("scaler", scaler), ("sampler", sampler)):
            if obj is not None:
                self._objects[name] = obj
        self._generators.update(generators or {})
        self._states.update(named)

    @staticmethod
    def _check_registered(states: Mapping[str, Stateful] | None, **objects: Any) -> dict[str, Stateful]:
        """Refuse what register() could not save or restore, before any of it is taken; the states."""
        for name, obj in objects.items():
            if obj is not None:
                _require_stateful(f"register({name}=...)", obj)
        if states is None:
            return {}
        if not isinstance(states, Mapping):
            raise CheckpointError(f"register(states=...) takes a dict of name -> object, not a "
                                  f"{type(states).__name__}: register(states={{'train_state': train_state}})")
        for name, obj in states.items():
            if not isinstance(name, str) or not name:
                raise CheckpointError(f"register(states=...): the name {name!r} is not a non-empty string; name "
                                      "each object as it is saved in the checkpoint")
            _require_stateful(f"register(states={{{name!r}: ...}})", obj)
        return dict(states)

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
            rank_payload = host_copy(rank_payload)
            shared_payload = host_copy(shared_payload)
            shards = None
            if sharded is not None:
                # Staged to host memory here (the blocking part), written by DCP's own thread;
                # this save's writer thread waits for it before it reports its rank done.
                sharded.start_async_save(shards_dir)
                shards = functools.partial(sharded.wait_async, shards_dir)
            self._thread = threading.Thread(
                target=self._write_async, name=f"wmctl-ckpt-{step}",
                args=(target, final, step, rank_payload, shared_payload, meta, started, shards), daemon=True)
            self._finish_at_exit()
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
        if self.fence is not None and newest is not None and newest > self.fence:
            who, newer = ((f"attempt {self.attempt}", f"attempt {newest}") if self.fence == self.attempt else
                          (f"fencing epoch {self.fence} of attempt {self.attempt}", f"epoch {newest} (a spare "
                           "node's in-place recovery, or a later attempt)"))
            raise CheckpointError(
                f"refusing to commit checkpoint {step}: this is {who}, but {newer} "
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

    def _finish_at_exit(self) -> None:
        """A job that ends without close() still finishes its last async save and that save's
        retention: the writer is a daemon thread, and a sweeper it started once the interpreter
        was shutting down was not joined (a `step-N.deleting-*` was left behind). threading's
        own exit hooks run before it joins threads (concurrent.futures uses the same); the hook
        holds the manager weakly, and is registered once."""
        if getattr(self, "_exit_hooked", False):
            return
        ref = weakref.ref(self)

        def finish() -> None:
            mgr = ref()
            for t in (mgr._thread, mgr._sweeper) if mgr is not None else ():
                if t is not None and t is not threading.current_thread():
                    t.join()
            if mgr is not None and mgr._sweeper is not None:
                mgr._sweeper.join()     # started by the writer while it was joined above
        try:
            threading._register_atexit(finish)  # type: ignore[attr-defined]
        except RuntimeError:                     # already shutting down: nothing more can be hooked
            return
        self._exit_hooked = True

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
        sweeper = threading.Thread(target=delete_trees, args=(paths,), name="wmctl-ckpt-sweep", daemon=False)
        try:
            sweeper.start()
        except RuntimeError:          # no thread to be had (limits, interpreter shutting down)
            delete_trees(paths)
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
        module = unwrap(model)
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
            "states": {name: obj.state_dict() for name, obj in self._states.items()},
            "rng": capture_rng(),
            "loaders": self._loaders.state_dict(),
        }

    def _load_states(self, rank_state: dict[str, Any] | None) -> list[str]:
        """Put the registered states back from a rank's saved state; a word for each not there."""
        saved = (rank_state or {}).get("states") or {}
        for name, obj in self._states.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        return [f"state {name!r} is not in this checkpoint (registered after it was written): left as it is"
                for name in self._states if name not in saved]

    def _shared_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # An FSDP job's model and optimizer are in its DCP shards, not here.
        names = ("scheduler", "scaler") if self._sharded is not None else ("model", "optimizer", "scheduler", "scaler")
        for name in names:
            obj = self._objects.get(name)
            if obj is not None:
                out[name] = (unwrap(obj) if name == "model" else obj).state_dict()
        return out

    def _write_files(self, folder: Path, rank_payload: dict[str, Any], shared_payload: dict[str, Any] | None,
                     meta: dict[str, Any], shards: Callable[[], dict[str, dict[str, Any]]] | None = None) -> None:
        """This rank's files, then its ``rank-N.done`` with their sizes and digests (rank 0's
        commit collects them; with async saves the done file also says this rank finished).
        ``shards``: for an FSDP model, writes (or waits for) this rank's DCP shards and returns
        them the same way; a collective when it writes."""
        try:
            written = shards() if shards is not None else {}
            written[rank_file_name(self.rank)] = save_fsync(rank_payload, folder / rank_file_name(self.rank))
            if self.rank == 0:
                assert shared_payload is not None
                written[SHARED_FILE] = save_fsync(shared_payload, folder / SHARED_FILE)
                written[META_FILE] = write_bytes_fsync(json.dumps(meta, sort_keys=True).encode(),
                                                        folder / META_FILE)
            write_atomic(folder / rank_done_name(self.rank), json.dumps(written, sort_keys=True).encode())
        except BaseException as exc:  # OSError from our writes; DCP's CheckpointException is a BaseException
            full = enospc_in(exc)
            if full is None:
                raise
            needed = payload_bytes(rank_payload) + payload_bytes(shared_payload)
            raise disk_full(folder, self.rank, full, needed) from exc

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
        files = checkpoint_files(target)
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
            swap_in(target, final)
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
        meta, shared, rank_state, rank0_state, shards = loaded
        if shards is not None and self._sharded is not None:
            self._sharded.apply(shards)     # model and optimizer first: the scheduler follows them
        for name in ("model", "optimizer", "scheduler", "scaler"):
            obj = self._objects.get(name)
            if obj is not None and name in shared:
                (unwrap(obj) if name == "model" else obj).load_state_dict(shared[name])

        exact, reason = True, ""
        saved_world = int(meta.get("world_size", self.world_size))
        sampler = self._objects.get("sampler")
        if rank_state is None:
            exact = False
            reason = f"world size changed from {saved_world} to {self.world_size}"
            how = " (resharded by torch.distributed.checkpoint)" if shards is not None else ""
            warnings.append(f"{reason}: resuming inexactly (weights, optimizer{how} and sample position are kept; "
                            "per-rank random state starts anew)")
            if sampler is not None and rank0_state is not None and rank0_state["sampler"] is not None:
                sampler.load_state_dict(rank0_state["sampler"], world_size=saved_world)
            warnings += self._load_states(rank0_state)
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
            warnings += self._load_states(rank_state)
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


def _require_stateful(what: str, obj: object) -> None:
    """Refuse, naming what it needs, an object register() could not save or restore."""
    if isinstance(obj, type):
        raise CheckpointError(f"{what}: {obj.__name__} is a class; register an instance of it")
    missing = [f"{m}()" for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
    if missing:
        raise CheckpointError(
            f"{what}: a {type(obj).__name__} has no {' and no '.join(missing)}. register() takes objects with "
            "both state_dict() and load_state_dict() (torch's Stateful protocol): give it one, or wrap the "
            "value in a small class that has them")

