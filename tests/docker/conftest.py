"""Fixtures for tests that need a real Docker engine.

- ``docker_client``: a client from the environment (DOCKER_HOST honoured). With
  WMCTL_REQUIRE_DOCKER=1 or CI=true (both set by .ci/run) a missing engine FAILS the test; otherwise it skips.
- ``base_image``: the local base image (bookworm + python 3.11 + torch 2.13.0 CPU), built once
  per engine without any registry; see tests/docker/baseimage.py (``ensure_base_image``). When
  .ci/run builds it in the background (WMCTL_BASE_IMAGE_STATUS), waits for that build and fails,
  naming its log, when it failed.
- ``registry``: Debian's ``docker-registry`` on 127.0.0.1:<free port> with storage in a temp
  folder, started and stopped by the fixture; yields "127.0.0.1:PORT" (dockerd treats
  127.0.0.0/8 as an insecure registry, so plain HTTP works without configuration).

Every test in this folder is marked ``docker``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

from orchestrator import labels as L
from tests.integration import harness as h
from tests.session_once import build_once

from .baseimage import ENV_STATUS, BackgroundBuildFailed, ensure_base_image, wait_for_background_build

REQUIRE_DOCKER = os.environ.get("WMCTL_REQUIRE_DOCKER") == "1" or os.environ.get("CI", "").lower() == "true"
REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.docker)


def unavailable(reason: str) -> NoReturn:
    """Fail under WMCTL_REQUIRE_DOCKER=1 or CI=true (CI promised an engine), skip otherwise."""
    if REQUIRE_DOCKER:
        pytest.fail(f"WMCTL_REQUIRE_DOCKER=1 or CI=true, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker
        import docker.errors
    except ImportError:
        unavailable("the docker Python package is not installed")
    try:
        client = docker.from_env(timeout=900)
        client.ping()
    except docker.errors.DockerException as exc:
        unavailable(f"no Docker engine reachable ({exc}); start one with .ci/start-dockerd.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    # Building it (minutes) or waiting for it is the session's time, not that of the test that
    # happens to ask first (under xdist any Docker test can be first on its worker, and its timeout
    # may be 240 s): pytest-timeout's alarm is held meanwhile. Every step of the build has its own
    # time limit, and so has the wait.
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        status = os.environ.get(ENV_STATUS)
        if status:  # .ci/run builds it in the background: wait for that build, never start a second
            try:
                wait_for_background_build(Path(status))
            except BackgroundBuildFailed as exc:
                pytest.fail(str(exc), pytrace=False)
        return ensure_base_image(docker_client)
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until the registry ``proc`` answers ``url``. Only its answer counts: a registry says
    ``Docker-Distribution-Api-Version`` (on 200, and on 401 when it demands credentials), so
    another server that holds the port is never taken for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                headers = resp.headers
        except urllib.error.HTTPError as err:
            headers = err.headers
        except OSError:
            time.sleep(0.2)
            continue
        if headers.get("Docker-Distribution-Api-Version", "").startswith("registry/2"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"docker-registry did not answer {url} within {timeout:.0f}s")


def start_registry(tmp: Path, auth: str | None = None, ports=free_port):
    """Start docker-registry; returns (address, Popen, log path). ``auth="htpasswd"`` demands credentials.
    A port found free can be taken before the registry binds it (the registry cannot be asked
    for port 0 and say which it got): then it exits with "address already in use", and the next
    port from ``ports`` is tried."""
    binary = shutil.which("docker-registry")
    if binary is None:
        unavailable("docker-registry is not installed (apt-get install docker-registry; .ci/start-dockerd.sh does)")
    storage = tmp / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    lines = [
        "version: 0.1",
        "log: {level: warn}",
        f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}",
    ]
    if auth == "htpasswd":
        # Any well-formed bcrypt line: the tests push without credentials and expect a refusal.
        htpasswd = tmp / "htpasswd"
        htpasswd.write_text("wmctl:$2y$05$0123456789abcdefghijkuGxmqgBEbDwDEJ8JgElqjDjxq7J6P.Fm\n")
        lines.append(f"auth: {{htpasswd: {{realm: wmctl-test, path: {htpasswd}}}}}")
    config, log = tmp / "config.yml", tmp / "registry.log"
    for _ in range(5):
        port = ports()
        config.write_text("\n".join([*lines, f"http: {{addr: '127.0.0.1:{port}'}}"]) + "\n")
        fh = open(log, "wb")
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=fh, stderr=subprocess.STDOUT)
        fh.close()
        try:
            _wait_http(f"http://127.0.0.1:{port}/v2/", proc)
        except RuntimeError as exc:
            proc.kill()
            proc.wait()
            text = log.read_text(errors="replace")
            if "address already in use" in text:
                continue
            raise RuntimeError(f"{exc}; log:\n{text[-2000:]}") from None
        return f"127.0.0.1:{port}", proc, log
    raise RuntimeError("docker-registry found every port it tried taken")


def stop_registry(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pause(container) -> None:
    """`docker pause`, the test's frozen node. The cgroup freezer can fail to freeze a container
    whose processes are forking at that moment (runc: "unable to freeze", seen in CI right after
    the keepers started torchrun on a loaded host); the pause is tried again, as a person at the
    command line would, until it holds (30 s at most)."""
    import docker.errors

    deadline = time.monotonic() + 30
    while True:
        try:
            container.pause()
            return
        except docker.errors.APIError as exc:
            if "unable to freeze" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def registry(tmp_path):
    address, proc, _log = start_registry(tmp_path / "registry")
    yield address
    stop_registry(proc)


@pytest.fixture(scope="session", autouse=True)
def pinned_runtime_wheel(tmp_path_factory):
    """Build the wmctl wheel once and pin it (WMCTL_RUNTIME_WHEEL) for every build in this run
    (every xdist worker of it):
    the wheel then stays byte-identical even while the source tree is being edited, so cache and
    up-to-date assertions test wmctl, not the timing of someone's edit."""
    from orchestrator.imagebuild import wheel

    # Once for the whole session: under xdist every worker pins the very same file.
    path = Path(build_once(tmp_path_factory, "runtime-wheel",
                           lambda folder: {"path": str(wheel.build_wheel(folder))})["path"])
    old = os.environ.get(wheel.ENV_WHEEL)
    os.environ[wheel.ENV_WHEEL] = str(path)
    yield path
    if old is None:
        os.environ.pop(wheel.ENV_WHEEL, None)
    else:
        os.environ[wheel.ENV_WHEEL] = old


def run_wmctl(*args: str, cwd: Path, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (stdout is a pipe: plain progress lines)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


# Tests that make wheels images (offline builds) and the one that prunes them (`build-image
# --prune-wheels` removes every wheels image wmctl labelled but the build's own) share one worker.
WHEELS_IMAGES = "docker-wheels-images"

# The modules that use _no_stale_runs (faults, lifecycle, logs, pasted run line; each names it in
# its pytestmark's usefixtures) each sweep only their own runs (the module's RUN_PREFIX: dkf-,
# dkl-, dkg-, dkp-), so under pytest-xdist each is a group of its own and they run side by side;
# one group held the four, one module after another, the suite's longest pole (~10 minutes).
SWEPT_RUNS = "docker-swept-runs"      # the prefix of each module's own group name

# One engine can serve several checkouts at once (sessions side by side): each may name its own tag.
FAULTS_TAG = os.environ.get("WMCTL_TEST_FAULTS_TAG", "wmctl-test/faults:counter")


@pytest.fixture(scope="module")
def image(docker_client, base_image, tmp_path_factory) -> str:
    """The counter job's image, built by `wmctl build-image` FROM the offline base image."""
    ctx = tmp_path_factory.mktemp("faults-image")
    for job in ("counter.py", "tiny.py", "plain.py"):     # tests/docker/test_docker_lifecycle.py runs all three
        shutil.copy(h.JOBS / job, ctx / job)
    spec = ctx / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "faults",
                                    "image": {"vendor": "cpu", "base": base_image, "tag": FAULTS_TAG},
                                    "command": ["python", "counter.py"]}))
    # the modules using it run side by side on xdist workers: one builds, the others then find
    # every layer cached (a lock, not a race between two builds tagging the same name)
    with open(Path(tempfile.gettempdir()) / "wmctl-test-faults-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run_wmctl("build-image", str(spec), cwd=ctx)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return FAULTS_TAG


@pytest.fixture(scope="module")
def _no_stale_runs(docker_client, request):
    """Runs of an earlier, interrupted session on this engine would be refused as someone else's
    (an unwatched run that succeeded keeps its containers until a watcher or `wmctl delete`).
    Sweeps the module's own runs (names starting with its RUN_PREFIX) at its start and end, never
    another module's: those may be running on another worker."""
    prefix = request.module.RUN_PREFIX
    assert isinstance(prefix, str) and prefix.startswith("dk") and prefix.endswith("-"), prefix

    def sweep():
        for c in docker_client.containers.list(all=True, filters={"label": [L.RUN]}, ignore_removed=True):
            if c.labels.get(L.RUN, "").startswith(prefix):
                c.remove(force=True)
        for net in docker_client.networks.list(filters={"label": [L.RUN]}):
            if (net.attrs.get("Labels") or {}).get(L.RUN, "").startswith(prefix):
                net.remove()
    sweep()
    yield
    sweep()


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wmctl-home-docker")
