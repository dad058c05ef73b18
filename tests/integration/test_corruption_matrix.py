"""The corruption matrix under real torchrun: a 2-node run of tests/integration/jobs/tiny.py (DDP
over gloo, CheckpointManager) commits steps 5 to 25; each case damages a copy of some of those
checkpoints the way disks, people and stale nodes do, then `wmctl submit --auto-resume` runs the
same run again to step 12. Each case ends on the newest intact checkpoint, with weights equal to
an uninterrupted run's (the job is deterministic: computed here, tiny_weights), or on a clear stop
(exit 7) naming why. Never a silent resume from a damaged checkpoint, never a silent start from
scratch."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.runtime.checkpoint import (ATTEMPT_FILE, COMMIT_MARKER, META_FILE, SHARED_FILE, rank_file_name,
                                             step_dir_name)

from . import harness as h

# Under xdist the whole module runs on one worker (--dist loadgroup): its module fixtures run
# real jobs, which every worker given one of its tests would otherwise run again.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("corruption-matrix")]
RUN = "matrix"


def spec_for(tmp: Path, ckpt_dir: Path, steps: int, sleep: float = 0.05, keep: int = 2) -> Path:
    spec = h.write_spec(tmp, RUN, nodes=2, steps=steps, every=5, sleep=sleep, job="tiny.py",
                        job_args=["--keep", str(keep)])
    data = yaml.safe_load(spec.read_text())
    data["checkpoint"]["dir"] = str(ckpt_dir)
    spec.write_text(yaml.safe_dump(data))
    return spec


def run(tmp: Path, ckpt_dir: Path, steps: int, keep: int = 2) -> tuple[int, str, Path]:
    """`wmctl submit --auto-resume` in a home of its own (the run name is reused per case)."""
    home = tmp / "home"
    w = h.Watch(spec_for(tmp, ckpt_dir, steps, keep=keep), home)
    code = w.wait(timeout=240)
    return code, w.output, home


def tiny_weights(steps: int) -> list[float]:
    """What jobs/tiny.py's rank 0 writes to final.json after ``steps`` uninterrupted steps, computed
    here: the same seed, model, data and SGD steps. Both ranks see the same batch, so DDP's mean of
    their gradients (each halved, then summed: exact in floating point) is the one-process gradient.
    A resume from any intact checkpoint must reach these weights; no reference run is needed."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = model(torch.full((8, 4), float(step + 1))).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [float(v) for v in torch.nn.utils.parameters_to_vector(model.parameters()).detach()]


STEPS = (5, 10, 15, 20, 25)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Steps 5 to 25 committed by one real run (keep 5), whose weights are checked against the
    computed ones too: the root every case copies its checkpoints from."""
    base = tmp_path_factory.mktemp("pristine")
    code, out, _ = run(base, base / "ckpt", steps=25, keep=5)
    assert code == 0, out
    root = base / "ckpt" / RUN
    assert all((root / step_dir_name(s) / COMMIT_MARKER).exists() for s in STEPS), \
        sorted(p.name for p in root.iterdir())
    assert json.loads((root / "final.json").read_text())["weights"] == tiny_weights(25)
    return root


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def edit_meta(ckpt: Path) -> None:
    meta = json.loads((ckpt / META_FILE).read_text())
    meta["step"] += 1
    (ckpt / META_FILE).write_text(json.dumps(meta))


def other_runs_marker(ckpt: Path) -> None:
    marker = json.loads((ckpt / COMMIT_MARKER).read_text())
    marker["run"] = "someone-else"
    (ckpt / COMMIT_MARKER).write_text(json.dumps(marker))


def copy_checkpoints(pristine: Path, tmp: Path, steps: tuple[int, ...] = (5, 10)) -> Path:
    """The pristine checkpoints of ``steps`` only (without the finished run's final.json), under
    ``tmp``/ckpt: the copy's root."""
    root = tmp / "ckpt" / RUN
    left_out = {"final.json"} | {step_dir_name(s) for s in STEPS if s not in steps}
    shutil.copytree(pristine, root, ignore=lambda d, names: [n for n in names if Path(d) == pristine and n in left_out])
    return root


def run_damaged(pristine: Path, tmp: Path, damage,
                steps: tuple[int, ...] = (5, 10)) -> tuple[Path, tuple[int, str, Path]]:
    """A copy of the pristine checkpoints of ``steps``, damaged, then the run resubmitted on it to
    step 12: the copy's root and what run() returned."""
    root = copy_checkpoints(pristine, tmp, steps)
    damage(root)
    return root, run(tmp, tmp / "ckpt", steps=12)


NEWEST = step_dir_name(10)


def damage_each_class(root: Path) -> None:
    """One damage class per checkpoint newer than step 5, each only detectable its own way."""
    flip_bit(root / step_dir_name(25) / rank_file_name(1))                          # a changed byte: its digest
    edit_meta(root / step_dir_name(20))                                             # meta.json says another step
    (root / step_dir_name(15) / COMMIT_MARKER).write_text("{not json")             # a marker that is not one
    (root / step_dir_name(10) / rank_file_name(0)).write_bytes(b"PK\x03\x04")      # truncated: its size


# case -> (the checkpoints copied, their damage, the damaged steps reported newest first, the step
# the run resumes from). One real run for every damage class (a changed byte, an edited meta, a
# commit marker that is not one, a truncated file), each on its own checkpoint, so the resume walks
# past all four, reporting each; one where only an older checkpoint is damaged. Two members of a
# class were folded into runs that already prove them: a bit flip in the shared weights
# (in-process, with the same fallback, report and weights: test_checkpoint_integrity.py::
# test_one_flipped_bit_in_shared_falls_back_to_the_older_checkpoint), and a missing marker, the
# torn checkpoint that attempt 1 of test_resume_exact.py's real SIGKILL chain leaves and resumes
# past, bit-exact (and test_checkpoint.py's latest_complete test).
FALLBACK = {
    "every-damage-class-on-the-newer-four": (STEPS, damage_each_class, [25, 20, 15, 10], 5),
    "damaged-older-checkpoint-only": ((5, 10), lambda root: flip_bit(root / step_dir_name(5) / SHARED_FILE), [], 10),
}


@pytest.mark.parametrize("case", sorted(FALLBACK))
def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(case, pristine, tmp_path):
    steps, damage, reported, expected = FALLBACK[case]
    root, (code, out, home) = run_damaged(pristine, tmp_path, damage, steps)
    assert code == 0, out
    events = h.progress(home, RUN, 0)
    resumed = [e for e in events if e["event"] == "resume"]
    assert resumed and resumed[0]["step"] == expected, (resumed, out)
    # loudly, each one: never resumed past without a word
    damaged = [e for e in events if e["event"] == "checkpoint_damaged"]
    assert [e["damaged_step"] for e in damaged] == reported, (damaged, out)
    assert all(e["reason"] for e in damaged), damaged
    said = [ln for ln in out.splitlines() if "damaged checkpoint" in ln]     # the watcher says it too
    assert len(said) == len(reported), said
    assert all(f"damaged checkpoint {root / step_dir_name(step)} skipped:" in ln
               for ln, step in zip(said, reported, strict=True)), said
    final = json.loads((root / "final.json").read_text())
    assert final["steps"] == 12 and final["weights"] == tiny_weights(12)
    # What `wmctl metrics` reads is every progress line the job printed, in order.
    kept = [json.loads(line) for line in (h.run_folder(home, RUN) / "metrics.jsonl").read_text().splitlines()]
    kept = [e for e in kept if e.get("by") != "watcher"]     # the watcher's own failure events
    assert [{k: v for k, v in e.items() if k != "seen"} for e in kept] == [{**e, "attempt": 0} for e in events]


def damage_every_checkpoint(root: Path) -> None:
    for step in ("step-00000005", NEWEST):
        flip_bit(root / step / SHARED_FILE)


STOPS = {
    # case -> (damage, what the final report must say)
    "every-checkpoint-damaged": (damage_every_checkpoint, "damaged"),
    "newest-marker-names-another-run": (lambda root: other_runs_marker(root / NEWEST), "someone-else"),
}


@pytest.mark.parametrize("case", sorted(STOPS))
def test_what_cannot_be_resumed_safely_stops_and_says_why(case, pristine, tmp_path):
    damage, says = STOPS[case]
    root, (code, out, home) = run_damaged(pristine, tmp_path, damage)
    assert code == 7, out
    assert says in out, out
    assert not (root / "final.json").exists(), "the job must not have trained from scratch"
    assert "Traceback (most recent call last)" not in out.split("run matrix")[-1]


def test_a_commit_from_an_attempt_a_newer_one_replaced_is_refused(pristine, tmp_path):
    """A node cut off from the supervisor keeps training: once a newer attempt has started on the
    root (its ATTEMPT file, written here while this attempt runs), this one may not commit."""
    root = copy_checkpoints(pristine, tmp_path)
    home = tmp_path / "home"
    w = h.Watch(spec_for(tmp_path, tmp_path / "ckpt", steps=16, sleep=0.5), home)
    h.wait_until(lambda: any(e["event"] == "resume" for e in h.progress(home, RUN, 0)), 120, "the resume")
    (root / ATTEMPT_FILE).write_text("7\n")     # what attempt 7 starting elsewhere leaves on the root
    code = w.wait(timeout=240)
    assert code == 7, w.output
    assert "refusing to commit checkpoint 15" in w.output and "attempt 7" in w.output, w.output
    assert not (root / "step-00000015").joinpath(COMMIT_MARKER).exists()
    assert not (root / "final.json").exists(), "the refused attempt trained on to the end"


def test_a_full_checkpoint_disk_stops_as_storage_full_with_the_path(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        (disk / RUN).mkdir()
        with open(disk / "filler", "wb") as fh:     # leave a few KiB: the first save cannot fit
            try:
                fh.write(b"\0" * (64 * 1024))
            except OSError:
                pass
        code, out, home = run(tmp_path, disk, steps=12)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert code == 7, out
    assert "storage_full" in out and str(disk / RUN) in out, out
    rec = h.record(home, RUN)
    assert len(rec["attempts"]) == 1, "a full disk is not retried"
