"""A missing writable relative host_path on the real engine: created before the submit (with a
note), bind-mounted, written by the job, and the run succeeds. Without the creation the engine
refuses the container: "bind source path does not exist".

The run goes through the api as `wmctl submit --watch` does (dryrun, then schedule), with attempt
0's plan post-processed as tests/docker/test_backend_docker.py does (the bare base image has no
wmctl: the repository is bind-mounted read-only at /wmctl).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import api, runs
from orchestrator import labels as L
from orchestrator.watchview import EchoView

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
RUN = "dkh-mkdir"
RUN_USER = "dkh-user"       # the docker.user test's runs: their own name, never one being removed
LAUNCHER = ["python3", "-m", "orchestrator.runtime.affinity"]


def _swept(docker_client, *runs: str):
    """Remove these runs' containers and networks before and after a test, and no one else's:
    the module's tests may run at once on two xdist workers, and a sweep of the other's names
    removed a running container ("disappeared")."""
    def remove():
        for run in runs:
            label = {"label": [f"{L.RUN}={run}"]}
            for c in docker_client.containers.list(all=True, filters=label, ignore_removed=True):
                c.remove(force=True)
            for net in docker_client.networks.list(filters={"label": [f"{L.RUN}={run}"]}):
                net.remove()
    remove()
    yield
    remove()


@pytest.fixture
def sweep(docker_client):
    yield from _swept(docker_client, RUN)


@pytest.fixture
def sweep_user(docker_client):
    """The docker.user test's own runs only."""
    yield from _swept(docker_client, RUN_USER, RUN_USER + "2")


def test_missing_writable_relative_host_path_is_created_and_the_job_writes_there(
        docker_client, base_image, sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": RUN, "nodes": 1, "nproc_per_node": 1, "affinity": "none",
        "image": {"vendor": "cpu", "tag": base_image}, "resources": {"shm": "256Mi"},
        "volumes": [{"name": "out", "mount": "/workspace/out", "host_path": "out/fresh"}],
        "command": ["python3", "-c", "open('/workspace/out/ok.txt', 'w').write('written in the container')"],
        "rendezvous": {"join_timeout": "60s"},
    }))
    folder = tmp_path / "out" / "fresh"
    assert not folder.exists()

    request = api.dryrun(api.load_job(spec), "docker")
    assert not folder.exists()                          # a dry run creates nothing
    for res in request.plan.resources:
        if res["kind"] == "container":
            c = res["create"]
            c["mounts"] = c["mounts"] + [{"Target": "/wmctl", "Source": str(REPO), "Type": "bind", "ReadOnly": True}]
            c["environment"] = {**c["environment"], "PYTHONPATH": "/wmctl", "PYTHONDONTWRITEBYTECODE": "1"}
            c["command"] = [part for arg in c["command"] for part in (LAUNCHER if arg == "wmctl-bind" else [arg])]
    lines: list[str] = []
    code = api.schedule(request, watch=True, view=EchoView(lines.append))

    assert code == 0, "\n".join(lines)
    assert f"note: created the missing host folder {folder} (volumes[0].host_path, volume 'out', " \
           "mounted at /workspace/out)" in lines, lines
    assert (folder / "ok.txt").read_text() == "written in the container"
    record = runs.status(RUN).record
    assert record is not None and record.status == "succeeded"
    assert [a.attempt for a in record.attempts] == [0]      # submitted once, not retried


def _run_through_api(spec: Path) -> tuple[int, list[str]]:
    request = api.dryrun(api.load_job(spec), "docker")
    for res in request.plan.resources:
        if res["kind"] == "container":
            c = res["create"]
            c["mounts"] = c["mounts"] + [{"Target": "/wmctl", "Source": str(REPO), "Type": "bind", "ReadOnly": True}]
            c["environment"] = {**c["environment"], "PYTHONPATH": "/wmctl", "PYTHONDONTWRITEBYTECODE": "1"}
            c["command"] = [part for arg in c["command"] for part in (LAUNCHER if arg == "wmctl-bind" else [arg])]
    lines: list[str] = []
    return api.schedule(request, watch=True, view=EchoView(lines.append)), lines


def test_containers_write_host_folders_as_docker_user_and_refuse_one_it_cannot_write(
        docker_client, base_image, sweep_user, tmp_path, monkeypatch):
    """docker.user runs the containers as that uid:gid (auto: the submitting user; root here, so
    the test names one): the checkpoint the job writes into the host folder belongs to that user,
    who can delete it. A folder that user cannot write is said before the job runs, by path."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, 4321, 4321)
    spec = tmp_path / "job.yaml"
    data: dict[str, Any] = {
        "name": RUN_USER, "nodes": 1, "nproc_per_node": 1, "affinity": "none",
        "image": {"vendor": "cpu", "tag": base_image}, "resources": {"shm": "256Mi"},
        "docker": {"user": "4321:4321"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "host_path": str(mine)}],
        "checkpoint": {"dir": "/ckpt"},
        "command": ["python3", "-c", "import os; open(os.environ['WMCTL_CHECKPOINT_DIR'] + '/w.txt', 'w').write("
                                     "f'{os.getuid()}:{os.getgid()} {os.environ[\"HOME\"]}')"],
        "restart": {"max_attempts": 1}, "rendezvous": {"join_timeout": "60s"},
    }
    spec.write_text(yaml.safe_dump(data))
    code, lines = _run_through_api(spec)
    assert code == 0, "\n".join(lines)
    written = mine / RUN_USER / "w.txt"
    assert written.read_text().startswith("4321:4321 "), written.read_text()
    assert (written.stat().st_uid, written.stat().st_gid) == (4321, 4321)
    assert (written.parent.stat().st_uid, written.parent.stat().st_gid) == (4321, 4321)

    runs.delete(RUN_USER, echo=lines.append)
    theirs = tmp_path / "theirs"          # root's, 0755: uid 4321 may not write there
    theirs.mkdir()
    (theirs / (RUN_USER + "2")).mkdir()
    data["name"] = RUN_USER + "2"
    data["volumes"][0]["host_path"] = str(theirs)
    spec.write_text(yaml.safe_dump(data))
    code, lines = _run_through_api(spec)
    assert code != 0, "\n".join(lines)
    log = (tmp_path / "home" / "runs" / (RUN_USER + "2") / "attempt-0" / "node-0.log").read_text()
    assert f"the checkpoint folder /ckpt/{RUN_USER}2 is not writable by uid 4321 gid 4321" in log, log
    assert not (theirs / (RUN_USER + "2") / "w.txt").exists()
