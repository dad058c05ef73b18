"""docker.user: containers write host folders as the submitting user (issue 22, item 8).

Render is pure: the submitting user comes in through HostFacts, which the Docker backend fills
only for a non-root user of a local engine that does not remap uids (rootless Docker,
userns-remap). The end-to-end check (a real engine, files owned by that uid, a folder the user
cannot write refused by path) is tests/docker/test_host_path_docker.py."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.adaptors import docker as sdk
from orchestrator.backends.docker.engine import DockerBackend
from orchestrator.backends.docker.render import render_docker
from orchestrator.backends.host_paths import on_host
from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext, HostFacts
from orchestrator.vendors import load_profile

from .helpers import spec_from

BASE = {"name": "du", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "img:1"},
        "volumes": [{"name": "c", "mount": "/ckpt", "host_path": "/data/ckpt"}], "checkpoint": {"dir": "/ckpt/x"}}


def containers(user: str | None, host_user: tuple[int, int] | None) -> list[dict]:
    spec = spec_from({**BASE, **({"docker": {"user": user}} if user else {})})
    host = HostFacts(cpus=tuple(range(4)), python="python3", home=__import__("pathlib").Path("/h"), user=host_user)
    plan = render_docker(spec, load_profile("cpu"), AttemptContext(), host)
    return [r for r in plan.resources if r["kind"] == "container"]


def test_auto_runs_as_the_submitting_user_with_a_writable_home():
    for c in containers(None, (1000, 1001)):
        assert c["create"]["user"] == "1000:1001"
        assert c["create"]["environment"]["HOME"] == "/tmp"
        assert " --user 1000:1001 " in c["docker_run"]


def test_auto_without_a_host_user_and_image_keep_the_image_s_user():
    for user, host_user in ((None, None), ("image", (1000, 1000))):
        for c in containers(user, host_user):
            assert "user" not in c["create"] and "--user" not in c["docker_run"]
            assert "HOME" not in c["create"]["environment"]


def test_an_explicit_user_is_used_as_given_and_a_bad_one_names_the_field():
    assert {c["create"]["user"] for c in containers("4321:4321", (1000, 1000))} == {"4321:4321"}
    assert {c["create"]["user"] for c in containers("trainer", None)} == {"trainer"}
    for bad in ("0:0;rm -rf /", "a b", "", "1:2:3"):
        with pytest.raises(SpecError) as err:
            spec_from({**BASE, "docker": {"user": bad}})
        assert "docker.user" in str(err.value)


def test_host_facts_name_the_user_only_where_a_container_uid_is_theirs(monkeypatch, tmp_path):
    spec = spec_from(BASE)
    backend = DockerBackend(client=object())
    monkeypatch.setattr(sdk, "engine_is_local", lambda: True)
    monkeypatch.setattr(sdk, "engine_remaps_users", lambda: False)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1002)
    assert backend.host_facts(spec).user == (1000, 1002)
    assert backend.host_facts(spec_from({**BASE, "docker": {"user": "image"}})).user is None
    monkeypatch.setattr(sdk, "engine_remaps_users", lambda: True)
    assert backend.host_facts(spec).user is None
    monkeypatch.setattr(sdk, "engine_remaps_users", lambda: False)
    monkeypatch.setattr(sdk, "engine_is_local", lambda: False)
    assert backend.host_facts(spec).user is None
    monkeypatch.setattr(sdk, "engine_is_local", lambda: True)
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert backend.host_facts(spec).user is None


def test_an_engine_that_remaps_uids_is_seen_from_its_socket_or_daemon_json(monkeypatch, tmp_path):
    sock = tmp_path / "docker.sock"
    sock.write_text("")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    daemon = tmp_path / "daemon.json"
    os.chown(sock, 0, 0)
    assert not sdk.engine_remaps_users(str(daemon))               # root's socket, no daemon.json
    daemon.write_text(json.dumps({"userns-remap": "default"}))
    assert sdk.engine_remaps_users(str(daemon))                   # userns-remap
    daemon.write_text("{not json")
    assert not sdk.engine_remaps_users(str(daemon))
    os.chown(sock, 1000, 1000)
    assert sdk.engine_remaps_users(str(daemon))                   # rootless: the socket is a user's


def test_a_container_path_is_named_by_the_host_folder_behind_it():
    spec = spec_from(BASE)
    assert str(on_host(spec, "/ckpt/x")) == "/data/ckpt/x"
    assert str(on_host(spec, "/ckpt")) == "/data/ckpt"
    assert on_host(spec, "/ckptx/y") is None and on_host(spec, "/workspace") is None


def test_delete_names_a_docker_run_s_checkpoints_by_their_host_folder():
    from types import SimpleNamespace

    from orchestrator.commands.delete import _on_this_machine

    spec = spec_from(BASE)
    record = SimpleNamespace(backend="docker", spec=spec.to_dict(), source_dir="/")
    assert _on_this_machine(record, "/ckpt/x") == "/data/ckpt/x (the containers' /ckpt/x)"
    record.backend = "kubernetes"          # a node's host_path is that node's, not this machine's
    assert _on_this_machine(record, "/ckpt/x") == "/ckpt/x"
