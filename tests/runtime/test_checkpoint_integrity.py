"""Integrity: the marker's digests (taken while writing) are verified on restore; a damaged
checkpoint is reported loudly and the next older one restored; never a silent resume from it."""

from __future__ import annotations

import hashlib
import io
import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.runtime.checkpoint import (COMMIT_MARKER, CheckpointError, ResumeState, file_digest, read_marker,
                                             step_dir_name, verify_checkpoint)
from orchestrator.runtime.progress import Progress
from orchestrator.runtime.protocol import parse_progress
from tests.runtime.conftest import committed_step, restored, run_gloo_ranks
from tests.runtime.test_checkpoint import Toy, same


def two_checkpoints(root: Path) -> tuple[Toy, dict]:
    """Steps 2 and 4 committed; the fingerprint is what a resume from step 2 must give."""
    toy = Toy()
    mgr = toy.manager(root, keep=3)
    for _ in range(2):
        toy.step()
    mgr.save(2)
    at_two = toy.fingerprint()
    # fingerprint() drew random numbers: rebuild the step-2 state from the checkpoint first.
    toy.manager(root).restore()
    for _ in range(2):
        toy.step()
    mgr.save(4)
    return toy, at_two


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def drop_digests(ckpt: Path) -> None:
    """Turn the marker into today's format 1 (sizes only): damage then shows only at load time."""
    marker = read_marker(ckpt)
    assert marker is not None
    (ckpt / COMMIT_MARKER).write_text(json.dumps({"step": marker["step"], "world_size": marker["world_size"],
                                                  "files": marker["files"]}))


def restore_with_events(root: Path) -> tuple[Toy, ResumeState | None, list[dict]]:
    out = io.StringIO()
    toy = Toy(seed=7)
    state = toy.manager(root, progress=Progress(stream=out, enabled=True)).restore()
    return toy, state, [e for e in (parse_progress(line) for line in out.getvalue().splitlines()) if e]


def test_digests_are_of_the_bytes_on_disk(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    ckpt = tmp_path / step_dir_name(4)
    marker = read_marker(ckpt)
    assert marker is not None and marker["digest"] == "sha256"
    assert set(marker["digests"]) == set(marker["files"]) == {"shared.pt", "meta.json", "rank-00000.pt"}
    assert all(marker["digests"][n] == hashlib.sha256((ckpt / n).read_bytes()).hexdigest() for n in marker["files"])
    assert all(marker["digests"][n] == file_digest(ckpt / n) for n in marker["files"])
    assert verify_checkpoint(ckpt) is None


def as_written_before_sha256(ckpt: Path) -> None:
    """Rewrite the marker as a runtime of before 2026-12-05 wrote it: blake2b-256 digests."""
    marker = read_marker(ckpt)
    assert marker is not None
    marker["digest"] = "blake2b-256"
    marker["digests"] = {n: hashlib.blake2b((ckpt / n).read_bytes(), digest_size=32).hexdigest()
                         for n in marker["digests"]}
    (ckpt / COMMIT_MARKER).write_text(json.dumps(marker))


def test_a_checkpoint_digested_with_blake2b_still_verifies_and_restores(tmp_path: Path) -> None:
    """Checkpoints of before the switch to sha256 are verified with the digest their marker
    names: a resume after upgrading the image still finds them sound, and still sees damage."""
    two_checkpoints(tmp_path)
    ckpt = tmp_path / step_dir_name(4)
    as_written_before_sha256(ckpt)
    assert verify_checkpoint(ckpt) is None
    toy, state, _ = restore_with_events(tmp_path)
    assert state is not None and state.step == 4
    flip_bit(ckpt / "shared.pt", (ckpt / "shared.pt").stat().st_size // 2)
    assert "shared.pt content changed since it was written (blake2b-256" in (verify_checkpoint(ckpt) or "")


def test_a_digest_this_runtime_does_not_know_is_named_not_guessed(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    ckpt = tmp_path / step_dir_name(4)
    marker = read_marker(ckpt)
    assert marker is not None
    marker["digest"] = "blake3"
    (ckpt / COMMIT_MARKER).write_text(json.dumps(marker))
    why = verify_checkpoint(ckpt) or ""
    assert "'blake3', which this runtime does not know" in why and "older than the one that wrote it" in why
    _, state, events = restore_with_events(tmp_path)
    assert state is not None and state.step == 2          # not trusted: the older one is restored
    assert any(e["event"] == "checkpoint_damaged" and "blake3" in e["reason"] for e in events)


def test_one_flipped_bit_in_shared_falls_back_to_the_older_checkpoint(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _, at_two = two_checkpoints(tmp_path)
    shared = tmp_path / step_dir_name(4) / "shared.pt"
    flip_bit(shared, shared.stat().st_size // 2)
    toy, state, events = restore_with_events(tmp_path)
    assert state is not None and state.step == 2
    assert same(toy.fingerprint(), at_two)
    damaged = [e for e in events if e["event"] == "checkpoint_damaged"]
    assert len(damaged) == 1 and damaged[0]["damaged_step"] == 4 and "step" not in damaged[0]
    assert damaged[0]["path"] == str(tmp_path / step_dir_name(4))
    assert "shared.pt content changed" in damaged[0]["reason"]
    assert any("was damaged: fell back" in w for w in state.warnings)
    assert "is damaged (shared.pt content changed" in capsys.readouterr().err


def test_an_edited_meta_step_is_detected(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    meta = tmp_path / step_dir_name(4) / "meta.json"
    text = meta.read_text()
    assert '"step": 4' in text
    meta.write_text(text.replace('"step": 4', '"step": 9'))    # same size: only the digest tells
    _, state, events = restore_with_events(tmp_path)
    assert state is not None and state.step == 2
    assert [e["damaged_step"] for e in events if e["event"] == "checkpoint_damaged"] == [4]


def test_a_damaged_zip_header_fails_the_load_and_falls_back(tmp_path: Path) -> None:
    _, at_two = two_checkpoints(tmp_path)
    ckpt = tmp_path / step_dir_name(4)
    drop_digests(ckpt)                 # a format-1 marker: sizes match, so only the load can tell
    flip_bit(ckpt / "rank-00000.pt", 0)   # "PK\x03\x04" no more
    assert verify_checkpoint(ckpt) is None
    toy, state, events = restore_with_events(tmp_path)
    assert state is not None and state.step == 2
    assert same(toy.fingerprint(), at_two)
    damaged = [e for e in events if e["event"] == "checkpoint_damaged"]
    assert [e["damaged_step"] for e in damaged] == [4] and "Error" in damaged[0]["reason"]


def test_a_missing_file_is_reported_not_skipped_silently(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    (tmp_path / step_dir_name(4) / "rank-00000.pt").unlink()
    _, state, events = restore_with_events(tmp_path)
    assert state is not None and state.step == 2
    assert [e["reason"] for e in events if e["event"] == "checkpoint_damaged"] == ["rank-00000.pt is missing"]


def test_every_checkpoint_damaged_raises_instead_of_training_from_scratch(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    for step in (2, 4):
        flip_bit(tmp_path / step_dir_name(step) / "shared.pt", 100)
    with pytest.raises(CheckpointError, match="every committed checkpoint under .* is damaged") as err:
        Toy().manager(tmp_path).restore()
    assert "step-00000002" in str(err.value) and "step-00000004" in str(err.value)
    assert "--resume-from" in str(err.value)


def test_an_explicit_damaged_path_is_refused(tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    ckpt = tmp_path / step_dir_name(4)
    flip_bit(ckpt / "shared.pt", 100)
    with pytest.raises(CheckpointError, match="is damaged .*shared.pt content changed"):
        Toy().manager(tmp_path).restore(ckpt)


# Two gloo ranks: step 4's rank-1 file is damaged (format-1 marker: only rank 1's load sees it).
# Both ranks must agree to fall back to step 2, not have rank 0 go on with step 4 alone.
RANKS = textwrap.dedent("""
    import json, sys
    import torch
    from orchestrator.runtime import dist
    from orchestrator.runtime.checkpoint import CheckpointManager, COMMIT_MARKER, read_marker
    dist.init_from_env()
    root = sys.argv[1]
    model = torch.nn.Linear(2, 2)
    m = CheckpointManager(root)
    m.register(model=model)
    for step in (2, 4):
        with torch.no_grad():
            model.weight.fill_(float(step))
        m.save(step)
    dist.barrier()
    if dist.rank() == 0:
        ckpt = f"{root}/step-00000004"
        marker = read_marker(ckpt)
        with open(f"{ckpt}/{COMMIT_MARKER}", "w") as fh:
            json.dump({"step": 4, "world_size": 2, "files": marker["files"]}, fh)
        with open(f"{ckpt}/rank-00001.pt", "r+b") as fh:
            fh.write(b"XX")
    dist.barrier()
    fresh = torch.nn.Linear(2, 2)
    m2 = CheckpointManager(root)
    m2.register(model=fresh)
    state = m2.restore()
    print(json.dumps({"rank": dist.rank(), "step": state.step, "weight": fresh.weight[0, 0].item()}), flush=True)
    dist.barrier()
    dist.destroy()
""")


@pytest.mark.timeout(180)
def test_a_load_failure_on_one_rank_makes_every_rank_fall_back(tmp_path: Path) -> None:
    done = run_gloo_ranks(RANKS, tmp_path, str(tmp_path / "ckpt"))
    assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
    results = [json.loads(p.stdout.splitlines()[-1]) for p in done]
    errs = [p.stderr for p in done]
    assert sorted((r["rank"], r["step"], r["weight"]) for r in results) == [(0, 2, 2.0), (1, 2, 2.0)]
    assert "rank 1 cannot load it" in errs[1]
    assert "step-00000004 is damaged (another rank could not load its files)" in errs[0]


# ---- re-saving a committed step


def test_a_failed_resave_of_a_committed_step_leaves_the_old_one_intact(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from orchestrator.runtime.checkpoint import list_checkpoints

    toy = Toy()
    mgr = toy.manager(tmp_path)
    for _ in range(3):
        toy.step()
    mgr.save(3)
    at_three = toy.fingerprint()
    good = (tmp_path / step_dir_name(3) / "shared.pt").read_bytes()

    # A later attempt resumed from elsewhere reaches step 3 again and dies while writing it.
    again = Toy(seed=4)
    real = torch.save

    def dying(obj, f, *a, **kw):
        real(obj, f, *a, **kw)
        raise OSError("node lost mid-write")
    monkeypatch.setattr(torch, "save", dying)
    with pytest.raises(OSError, match="node lost"):
        again.manager(tmp_path).save(3)
    monkeypatch.setattr(torch, "save", real)

    assert committed_step(tmp_path) == 3
    assert (tmp_path / step_dir_name(3) / "shared.pt").read_bytes() == good
    assert verify_checkpoint(tmp_path / step_dir_name(3)) is None
    assert [c.step for c in list_checkpoints(tmp_path)] == [3]      # the half-written copy is no checkpoint
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("step-00000003.tmp-")]) == 1
    fresh = Toy(seed=9)
    assert restored(fresh.manager(tmp_path)).step == 3
    assert same(fresh.fingerprint(), at_three)


def test_a_successful_resave_swaps_in_the_new_one_and_cleans_up(tmp_path: Path) -> None:
    import torch


    first = Toy()
    first.step()
    first.manager(tmp_path).save(1)
    second = Toy(seed=5)
    second.step()
    mgr = second.manager(tmp_path)
    (tmp_path / "step-00000001.tmp-0-123").mkdir()     # a dead attempt's unfinished re-save
    mgr.save(1)
    assert committed_step(tmp_path) == 1
    mgr.wait()         # retention's deletes run on a sweeper thread
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step-00000001"]
    saved = torch.load(tmp_path / "step-00000001" / "shared.pt", weights_only=False)["model"]
    assert all(torch.equal(saved[k], v) for k, v in second.model.state_dict().items())
