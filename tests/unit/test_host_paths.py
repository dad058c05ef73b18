"""host_path volumes as folders of this machine: a missing read-only one is an error naming the
field before anything is submitted; a missing writable one is created with a note (Docker's
engine API refuses a bind source that does not exist, where `docker run -v` creates it)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from orchestrator.adaptors.docker import engine_is_local
from orchestrator.backends import host_paths
from orchestrator.backends.docker.engine import _create_bind_sources
from orchestrator.errors import SpecError
from orchestrator.layout import node_exit_file, run_dir

from .helpers import spec_from
from .test_cli import run_main

BASE = {"name": "hp", "command": ["python", "t.py"]}


def _volumes() -> list[dict]:
    return [{"name": "out", "mount": "/workspace/out", "host_path": "out/run1"},
            {"name": "data", "mount": "/data", "host_path": "data", "read_only": True}]


def test_a_missing_read_only_folder_is_a_problem_naming_the_field(tmp_path):
    spec = spec_from({**BASE, "volumes": _volumes()}, source_dir=tmp_path)
    problems = host_paths.missing_read_only(spec)
    assert [field for field, _ in problems] == ["volumes[1].host_path"]
    assert str(tmp_path / "data") in problems[0][1] and "read_only" in problems[0][1]
    (tmp_path / "data").mkdir()
    assert host_paths.missing_read_only(spec) == []


def test_missing_writable_folders_are_created_relative_to_the_spec_with_a_note(tmp_path):
    (tmp_path / "data").mkdir()
    spec = spec_from({**BASE, "volumes": _volumes()}, source_dir=tmp_path)
    notes = host_paths.create_missing(spec)
    assert (tmp_path / "out" / "run1").is_dir()
    assert len(notes) == 1 and str(tmp_path / "out" / "run1") in notes[0] and "volumes[0].host_path" in notes[0]
    assert host_paths.create_missing(spec) == []        # it exists now: nothing to say


def test_nothing_is_created_when_a_read_only_folder_is_missing(tmp_path):
    spec = spec_from({**BASE, "volumes": _volumes()}, source_dir=tmp_path)
    with pytest.raises(SpecError) as info:
        host_paths.create_missing(spec)
    assert dict(info.value.problems).keys() == {"volumes[1].host_path"}
    assert not (tmp_path / "out").exists()


def test_a_folder_that_cannot_be_created_names_the_field(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "out").write_text("a file where the folder's parent should be")
    spec = spec_from({**BASE, "volumes": _volumes()}, source_dir=tmp_path)
    with pytest.raises(SpecError) as info:
        host_paths.create_missing(spec)
    assert "cannot be created" in dict(info.value.problems)["volumes[0].host_path"]


@pytest.mark.parametrize("docker_host,local", [
    (None, True), ("unix:///var/run/docker.sock", True), ("tcp://127.0.0.1:2375", True),
    ("tcp://localhost:2376", True), ("tcp://10.1.2.3:2375", False), ("ssh://builder@gpu-box", False),
])
def test_engine_is_local(monkeypatch, docker_host, local):
    if docker_host is None:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
    else:
        monkeypatch.setenv("DOCKER_HOST", docker_host)
    assert engine_is_local() is local


def test_docker_submit_creates_writable_bind_sources_only(tmp_path, monkeypatch):
    """A later attempt (or a plan submitted without the api) still finds its writable folders."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    rw, ro = tmp_path / "rw" / "x", tmp_path / "ro"
    containers: list[dict[str, Any]] = [
        {"create": {"mounts": [{"Type": "bind", "Source": str(rw), "Target": "/a", "ReadOnly": False},
                               {"Type": "bind", "Source": str(ro), "Target": "/b", "ReadOnly": True},
                               {"Type": "tmpfs", "Target": "/dev/shm"}]}}]
    _create_bind_sources(containers)
    assert rw.is_dir() and not ro.exists()
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.1.2.3:2375")      # a remote engine's folders are its own
    rw2 = tmp_path / "rw2"
    containers[0]["create"]["mounts"][0]["Source"] = str(rw2)
    _create_bind_sources(containers)
    assert not rw2.exists()


def _docker_spec(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**BASE, "image": {"tag": "r/x:1"}, "volumes": _volumes()}))
    return str(path)


def test_docker_dry_run_and_submit_refuse_a_missing_read_only_folder_with_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    spec = _docker_spec(tmp_path)
    for argv in (["submit", spec, "-b", "docker", "--dry-run"], ["submit", spec, "-b", "docker"],
                 ["render", spec, "-b", "docker"]):
        code, _, err = run_main(argv, capsys)
        assert code == 2 and "volumes[1].host_path:" in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "out").exists()              # a dry run creates nothing; nor does a refusal
    assert not run_dir("hp").exists()                   # nothing recorded, nothing submitted


def test_a_remote_docker_engine_s_folders_are_not_checked_here(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.1.2.3:2375")
    code, _, err = run_main(["submit", _docker_spec(tmp_path), "-b", "docker", "--dry-run"], capsys)
    assert code == 0, err


def test_local_submit_notes_the_checkpoint_folder_it_creates(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "hp-local", "command": ["python", "-c", "print('ok')"],
        "volumes": [{"name": "ckpt", "mount": "/workspace/ckpt", "host_path": "ckpt/hp"}],
        "checkpoint": {"dir": "/workspace/ckpt"}}))
    code, out, err = run_main(["submit", str(path), "-b", "local"], capsys)
    assert code == 0, err
    assert (tmp_path / "ckpt" / "hp").is_dir()
    assert f"note: created the missing checkpoint folder {tmp_path / 'ckpt' / 'hp'}" in out
    deadline = time.monotonic() + 60                     # let the job end inside this test's home
    while time.monotonic() < deadline and not node_exit_file("hp-local", 0, 0).exists():
        time.sleep(0.1)
