""".ci/run builds the Docker tests' base image in the background; the tests wait for that build
(tests/docker/baseimage.py, wait_for_background_build) and a failed or dead build is a clear
failure naming its log, never a second build and never a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.baseimage import BASE_TAG, BackgroundBuildFailed, wait_for_background_build

REPO = Path(__file__).resolve().parents[2]


def test_a_finished_build_is_waited_for_until_it_says_ok(tmp_path):
    status = tmp_path / "base-image.status"
    # A builder still running: it says "building PID" and writes "ok" once the test lets it go,
    # replacing the file whole as the real one does (_write_status): a waiter never reads it half-written.
    builder = subprocess.Popen([sys.executable, "-c",
                                "import os, sys, pathlib\n"
                                "sys.stdin.readline()\n"
                                "tmp = pathlib.Path(sys.argv[1] + '.tmp')\n"
                                "tmp.write_text('ok wmctl-test/base:x\\n')\n"
                                "os.replace(tmp, sys.argv[1])\n", str(status)],
                               stdin=subprocess.PIPE, text=True)
    status.write_text(f"building {builder.pid}\n")
    assert builder.stdin is not None
    builder.stdin.write("go\n")
    builder.stdin.close()
    wait_for_background_build(status, poll=0.05)
    assert status.read_text().startswith("ok")
    assert builder.wait(timeout=60) == 0


def test_a_build_that_died_without_a_result_fails_naming_its_log(tmp_path):
    status = tmp_path / "base-image.status"
    (tmp_path / "base-image.log").write_text("E: Failed getting release file\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    status.write_text(f"building {dead.pid}\n")
    with pytest.raises(BackgroundBuildFailed) as info:
        wait_for_background_build(status, poll=0.05)
    message = str(info.value)
    assert "died without a result" in message and str(dead.pid) in message
    assert str(tmp_path / "base-image.log") in message and "Failed getting release file" in message


def test_a_status_file_that_is_missing_or_garbled_is_named(tmp_path):
    with pytest.raises(BackgroundBuildFailed, match="WMCTL_BASE_IMAGE_STATUS=.*names no file"):
        wait_for_background_build(tmp_path / "nothing")
    garbled = tmp_path / "garbled"
    garbled.write_text("maybe\n")
    with pytest.raises(BackgroundBuildFailed, match="not 'building PID'"):
        wait_for_background_build(garbled)


def test_the_builder_reports_its_failure_in_the_status_file(tmp_path):
    """The real builder, as .ci/run starts it, against an engine that is not there: it exits 1 and
    says why in the status file; the waiting test then fails with that reason."""
    status = tmp_path / "base-image.status"
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-m", "tests.docker.baseimage", "--status", str(status)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert status.read_text().startswith("failed: DockerException")
    with pytest.raises(BackgroundBuildFailed) as info:
        wait_for_background_build(status)
    assert f"the background build of {BASE_TAG} failed" in str(info.value)
    assert "Error while fetching server API version" in str(info.value)   # the reason, carried along


def test_what_a_killed_debootstrap_left_mounted_is_unmounted_before_the_folder_goes(tmp_path):
    """debootstrap mounts /proc inside its root; killed, it leaves it mounted, and removing the
    temp folder then walks into the host's /proc (seen: "Cannot call rmtree on a symbolic link"
    at root/proc/fs/xfs/stat). Mounts nested below the root go too, deepest first."""
    from tests.docker.baseimage import _mounts_under, unmount_under

    root = tmp_path / "with space" / "root"
    (root / "proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root / "proc")], check=True)
    (root / "proc" / "sys").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root / "proc" / "sys")], check=True)
    assert _mounts_under(root) == [str(root / "proc" / "sys"), str(root / "proc")]
    assert _mounts_under(tmp_path / "with") == []                  # a sibling prefix is not below
    unmount_under(root)
    assert _mounts_under(root) == []
