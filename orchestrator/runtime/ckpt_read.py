"""Finding and reading the checkpoint a restore takes: rank 0's choice of the newest sound one
and the checks of who wrote it (``ResumeChoice``, plain data broadcast to every rank), then every
rank loading it into memory, all agreeing, before any training object is touched (``ReadSide``,
the reading half of ``CheckpointManager``).

The run's own root comes first; only when it holds no sound checkpoint is ``resume_from``
(WMCTL_RESUME_FROM) used. Another run's checkpoint is refused unless it was asked for on purpose
(``--resume-from`` / WMCTL_RESUME_FROM), and a changed spec is warned about. A damaged checkpoint
(a file missing, resized, changed, or failing to load on any rank) is reported loudly (stderr
and a ``checkpoint_damaged`` progress event) and the next older one tried; a root whose every
committed checkpoint is damaged is refused rather than trained from scratch silently.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .checkpoint_sharded import ShardedState, load_failures
from .ckpt_format import (COMMIT_MARKER, LAYOUT, META_FILE, SHARDED_DIR, SHARED_FILE, STEP_DIR_RE, CheckpointError,
                          Stateful, is_committed, latest_complete, list_checkpoints, rank_file_name, read_marker,
                          verify_checkpoint, verify_shard_share)
from .ckpt_io import load_file
from .protocol import ENV_RESUME_FROM


def same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


@dataclass
class ResumeChoice:
    """Rank 0's view of where a restore may come from."""

    root: Path
    run: str
    spec_hash: str
    resume_from: Path | None
    report_damaged: Callable[[Path, str], None]

    def choose(self, path: str | Path | None, skip: list[str]) -> dict[str, Any]:
        """Which checkpoint to load, what to warn about, or why to refuse (plain data,
        broadcast to every rank): ``path`` (None: none to resume from), ``warnings``,
        ``skipped``, ``resumed_from``, or ``error``. ``skip``: candidates found damaged so far."""
        try:
            if path is not None:
                if not is_committed(path):
                    raise CheckpointError(f"{path} is not a committed checkpoint (no valid {COMMIT_MARKER})")
                bad = verify_checkpoint(path, shard_digests=False)
                if bad is not None:
                    raise CheckpointError(f"checkpoint {path} is damaged ({bad}); name another one, or none to "
                                          "take the newest sound checkpoint")
                # Named explicitly: taken on purpose, whoever wrote it.
                return {"path": str(path), "warnings": self.identity_warnings(Path(path), on_purpose=True)}
            own, had_any = self.newest_sound(self.root, skip)
            if own is not None:
                # WMCTL_RESUME_FROM naming this very root says its checkpoints are wanted as they are.
                on_purpose = self.resume_from is not None and same_place(self.resume_from, self.root)
                return {"path": str(own), "warnings": self.identity_warnings(own, on_purpose), "skipped": list(skip)}
            if self.resume_from is None or same_place(self.resume_from, self.root):
                if had_any:
                    raise CheckpointError(
                        f"every committed checkpoint under {self.root} is damaged ({', '.join(skip)}; see the "
                        "lines above): refusing to train from scratch silently. Move the damaged step folders "
                        f"aside to start fresh, or start from a good checkpoint with --resume-from / {ENV_RESUME_FROM}")
                return {"path": None, "warnings": self.unscoped_warnings()}
            src = self.from_elsewhere(self.resume_from, skip)
            warnings = [f"resumed from elsewhere on purpose ({ENV_RESUME_FROM}={self.resume_from}): "
                        f"this run's own folder {self.root} had no sound checkpoint"]
            warnings += self.identity_warnings(src, on_purpose=True)
            return {"path": str(src), "warnings": warnings, "resumed_from": str(self.resume_from),
                    "skipped": list(skip)}
        except CheckpointError as err:
            return {"error": str(err)}

    def newest_sound(self, root: Path, skip: list[str]) -> tuple[Path | None, bool]:
        """The newest checkpoint under root whose files match its marker, reporting (and adding
        to ``skip``) every damaged one on the way; and whether root had any committed."""
        candidates = [c.path for c in reversed(list_checkpoints(root)) if (c.path / COMMIT_MARKER).exists()]
        for cand in candidates:
            if str(cand) in skip:
                continue
            reason = verify_checkpoint(cand, shard_digests=False)
            if reason is None:
                return cand, True
            self.report_damaged(cand, reason)
            skip.append(str(cand))
        return None, bool(candidates)

    def unscoped_warnings(self) -> list[str]:
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

    def from_elsewhere(self, where: Path, skip: list[str]) -> Path:
        """A step folder itself, or the newest sound checkpoint under a checkpoint root."""
        if STEP_DIR_RE.match(where.name) or (where / COMMIT_MARKER).exists():
            if not is_committed(where) or str(where) in skip:
                raise CheckpointError(f"{ENV_RESUME_FROM}={where} is not a committed checkpoint (no valid "
                                      f"{COMMIT_MARKER}, or a file it lists is missing, changed size or fails to load)")
            bad = verify_checkpoint(where, shard_digests=False)
            if bad is not None:
                raise CheckpointError(f"{ENV_RESUME_FROM}={where} is damaged ({bad}); name a sound checkpoint")
            return where
        found, had_any = self.newest_sound(where, skip)
        if found is None:
            what = "only damaged checkpoints" if had_any else "no complete checkpoint"
            raise CheckpointError(f"{ENV_RESUME_FROM}={where} holds {what}: name a checkpoint root "
                                  "(the folder with step-NNNNNNNN folders) or one sound step folder")
        return found

    def identity_warnings(self, ckpt: Path, on_purpose: bool) -> list[str]:
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


class ReadSide:
    """The reading half of ``CheckpointManager``: which checkpoint every rank loads, and loading it.
    The manager sets these attributes; ``restore()`` (checkpoint.py) applies what is read."""

    root: Path
    run: str
    spec_hash: str
    resume_from: Path | None
    progress: Any | None
    rank: int
    world_size: int
    _objects: dict[str, Any]
    _states: dict[str, Stateful]
    _sharded: ShardedState | None

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
        rank state when that is needed instead, None: the DCP shards, loaded next by ``_load_shards``)."""
        try:
            meta = json.loads((ckpt / META_FILE).read_text(encoding="utf-8"))
            shared = load_file(ckpt / SHARED_FILE)
            saved_world = int(meta.get("world_size", self.world_size))
            rank_path = ckpt / rank_file_name(self.rank)
            rank_state = load_file(rank_path) if saved_world == self.world_size and rank_path.exists() else None
            rank0_state = None
            if rank_state is None and (self._objects.get("sampler") is not None or self._states):
                rank0_state = load_file(ckpt / rank_file_name(0))
            return (meta, shared, rank_state, rank0_state, None), None
        except Exception as err:  # a damaged zip, a bad pickle, a missing key: any of it means damaged
            return None, _why(err)

    def _verify_shards(self, ckpt: Path) -> str | None:
        """This rank's share of the digests of ``ckpt``'s DCP shards (ckpt_format.verify_shard_share)."""
        return verify_shard_share(ckpt, self.rank, self.world_size)

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

    def _choose(self, path: str | Path | None, skip: list[str]) -> dict[str, Any]:
        """Rank 0: which checkpoint to load, what to warn about, or why to refuse (ResumeChoice)."""
        return ResumeChoice(self.root, self.run, self.spec_hash, self.resume_from,
                            self._report_damaged).choose(path, skip)


def _why(err: BaseException) -> str:
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}"
