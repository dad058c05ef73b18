"""The commit marker's identity (run, spec hash, world size, attempt): checkpoints scoped per run,
another run's refused unless taken on purpose, a changed spec warned about, old markers kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.runtime.checkpoint import COMMIT_MARKER, CheckpointError, read_marker
from tests.runtime.conftest import committed_step, restored
from tests.runtime.test_checkpoint import Toy, same


def saved(root: Path, step: int = 2, **ident) -> tuple[Toy, dict]:
    """A toy trained ``step`` steps and checkpointed by a manager of identity ``ident``; the
    fingerprint is the state (and the draws) a resume of it must reproduce."""
    toy = Toy()
    mgr = toy.manager(root, **ident)
    for _ in range(step):
        toy.step()
    mgr.save(step)
    return toy, toy.fingerprint()


def test_marker_records_run_spec_hash_world_size_and_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WMCTL_RUN", "wm")
    monkeypatch.setenv("WMCTL_SPEC_HASH", "abc123def456")
    monkeypatch.setenv("WMCTL_ATTEMPT", "3")
    saved(tmp_path)
    marker = read_marker(tmp_path / "step-00000002")
    assert marker is not None
    assert (marker["format"], marker["run"], marker["spec_hash"], marker["world_size"], marker["attempt"]) == \
        (2, "wm", "abc123def456", 1, 3)
    assert set(marker["files"]) == {"meta.json", "shared.pt", "rank-00000.pt"}


def test_another_runs_checkpoint_is_refused_naming_both_runs(tmp_path: Path) -> None:
    saved(tmp_path, run="alpha")
    with pytest.raises(CheckpointError) as err:
        Toy(seed=1).manager(tmp_path, run="beta").restore()
    msg = str(err.value)
    assert "'alpha'" in msg and "'beta'" in msg and "--resume-from" in msg and "WMCTL_RESUME_FROM" in msg


def test_resume_from_the_same_root_takes_another_runs_checkpoint_on_purpose(tmp_path: Path) -> None:
    _, expected = saved(tmp_path, run="alpha")
    other = Toy(seed=1)
    state = other.manager(tmp_path, run="beta", resume_from=tmp_path).restore()
    assert state is not None and state.step == 2 and state.exact
    assert any("'alpha'" in w and "on purpose" in w for w in state.warnings)
    assert same(other.fingerprint(), expected)


def test_a_changed_spec_resumes_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, expected = saved(tmp_path, run="wm", spec_hash="111111111111")
    other = Toy(seed=1)
    state = other.manager(tmp_path, run="wm", spec_hash="222222222222").restore()
    assert state is not None and state.exact and state.resumed_from is None
    assert len(state.warnings) == 1 and "111111111111 -> 222222222222" in state.warnings[0]
    assert "spec changed" in capsys.readouterr().err
    assert same(other.fingerprint(), expected)
    # Same spec: nothing to warn about.
    assert restored(Toy(seed=2).manager(tmp_path, run="wm", spec_hash="111111111111")).warnings == []


def test_format_1_markers_without_identity_still_restore(tmp_path: Path) -> None:
    _, expected = saved(tmp_path, run="alpha")
    d = tmp_path / "step-00000002"
    old = read_marker(d)
    assert old is not None
    (d / COMMIT_MARKER).write_text(json.dumps({"step": 2, "world_size": 1, "files": old["files"], "time": 0.0}))
    other = Toy(seed=1)
    state = other.manager(tmp_path, run="beta", spec_hash="ffffffffffff").restore()
    assert state is not None and state.step == 2 and state.warnings == []
    assert same(other.fingerprint(), expected)


def test_a_world_size_change_resumes_inexactly_with_a_note(tmp_path: Path) -> None:
    saved(tmp_path, run="wm")
    mgr = Toy(seed=1).manager(tmp_path, run="wm")
    mgr.world_size = 2     # as if relaunched on two ranks
    state = mgr.restore()
    assert state is not None and not state.exact
    assert state.reason == "world size changed from 1 to 2"
    assert any("world size changed from 1 to 2" in w for w in state.warnings)


def test_resume_from_another_root_when_the_run_has_none_of_its_own(tmp_path: Path) -> None:
    theirs, own = tmp_path / "alpha", tmp_path / "beta"
    _, expected = saved(theirs, step=3, run="alpha")
    other = Toy(seed=1)
    mgr = other.manager(own, run="beta", resume_from=theirs)
    state = mgr.restore()
    assert state is not None and state.step == 3 and state.resumed_from == theirs
    assert state.path == theirs / "step-00000003"
    assert any("resumed from elsewhere" in w for w in state.warnings)
    assert same(other.fingerprint(), expected)
    # Its own checkpoints go to its own root and win from then on.
    other.step()
    mgr.save(4)
    assert committed_step(own) == 4 and committed_step(theirs) == 3
    again = Toy(seed=2).manager(own, run="beta", resume_from=theirs).restore()
    assert again is not None and again.step == 4 and again.resumed_from is None


def test_resume_from_a_step_folder_and_from_nothing(tmp_path: Path) -> None:
    theirs = tmp_path / "alpha"
    toy = Toy()
    mgr = toy.manager(theirs, run="alpha")
    for s in (1, 2):
        toy.step()
        mgr.save(s)
    state = Toy(seed=1).manager(tmp_path / "beta", run="beta", resume_from=theirs / "step-00000001").restore()
    assert state is not None and state.step == 1
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        Toy().manager(tmp_path / "gamma", resume_from=tmp_path / "empty").restore()


def test_job_sees_run_scoped_checkpoint_dir_spec_hash_and_resume_from(tmp_path: Path) -> None:
    from orchestrator.launch import job_env
    from orchestrator.plan import AttemptContext
    from orchestrator.specload import from_dict
    from orchestrator.vendors import load_profile

    spec = from_dict({"name": "wm", "command": ["python", "train.py"],
                       "checkpoint": {"dir": "/workspace/ckpt"}}, source_dir=tmp_path)
    env = job_env(spec, load_profile("cpu"), AttemptContext(attempt=2, resume_from="/workspace/ckpt/other"),
                  checkpoint_dir="/workspace/ckpt")
    assert env["WMCTL_CHECKPOINT_DIR"] == "/workspace/ckpt/wm"
    assert env["WMCTL_SPEC_HASH"] == spec.spec_hash()
    assert env["WMCTL_RESUME_FROM"] == "/workspace/ckpt/other"
    assert "WMCTL_RESUME_FROM" not in job_env(spec, load_profile("cpu"), AttemptContext(), checkpoint_dir="/c")


def test_local_plan_notes_and_creates_the_folder_the_job_is_handed(tmp_path: Path) -> None:
    from orchestrator import backends
    from orchestrator.plan import AttemptContext, HostFacts
    from orchestrator.specload import from_dict
    from orchestrator.vendors import load_profile

    spec = from_dict({"name": "wm", "command": ["python", "train.py"], "checkpoint": {"dir": "ckpt"}},
                      source_dir=tmp_path)
    host = HostFacts(cpus=(0,), python="/usr/bin/python3", home=tmp_path / "home", port=29500)
    plan = backends.render_plan(spec, load_profile("cpu"), "local", AttemptContext(), host)
    handed = plan.resources[0]["env"]["WMCTL_CHECKPOINT_DIR"]
    assert handed == str(tmp_path / "ckpt" / "wm")
    assert f"checkpoints in {handed}" in plan.notes
    assert str(plan.request.checkpoint_dir) == handed   # what the engine creates before the start



def test_checkpoints_from_before_per_run_folders_are_pointed_at(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, expected = saved(tmp_path, step=3)             # written into the configured folder itself
    assert Toy(seed=1).manager(tmp_path / "wm", run="wm").restore() is None
    err = capsys.readouterr().err
    assert "step-00000003 is one in the folder above" in err and f"--resume-from {tmp_path}" in err
    other = Toy(seed=1)
    state = other.manager(tmp_path / "wm", run="wm", resume_from=tmp_path).restore()
    assert state is not None and state.step == 3 and state.resumed_from == tmp_path
    assert same(other.fingerprint(), expected)
