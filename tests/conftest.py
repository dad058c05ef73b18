"""Session-wide: no test writes into the user's ~/.wmctl (run folders, archived logs)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

pytest_plugins = ["tests.ci_no_skip", "tests.xdist_groups"]

# A suite started as a background job of a non-interactive shell (`bash .ci/run &`, nohup, a CI
# runner's script) starts with SIGINT ignored (POSIX sh: an asynchronous list ignores SIGINT),
# and every process it starts inherits that across exec: the tests that play a user's Ctrl-C
# would play it on processes that cannot hear it. An interactive terminal gives its foreground
# job SIGINT's default; so does this, for the processes the tests start (a handler, unlike
# SIG_IGN, is reset to the default on exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Bytecode. A machine whose environment sets PYTHONDONTWRITEBYTECODE=1 (CI's image does) has every
# process the suite starts (watchers, agents, workers, `wmctl` calls: thousands) compile wmctl's
# modules from source again, and each xdist worker rewrite and compile every test module. The
# workers and every process the tests start inherit this environment: compiled once, then reused.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


def pytest_configure(config):
    """Under pytest-xdist only --dist loadgroup keeps a module that carries xdist_group on one
    worker (modules whose fixtures run real jobs, share a Docker volume, or sweep each other's
    containers): with another mode they would run on several workers at once."""
    workers = config.getoption("numprocesses", None)
    dist = config.getoption("dist", "no")
    if workers and dist != "loadgroup" and not os.environ.get("PYTEST_XDIST_WORKER"):
        raise pytest.UsageError(
            f"-n {workers} with --dist {dist}: modules marked xdist_group must each stay on one worker; "
            "add --dist loadgroup (the README's test command has it)")


@pytest.fixture(scope="session", autouse=True)
def _wmctl_home(tmp_path_factory):
    old = os.environ.get("WMCTL_HOME")
    os.environ["WMCTL_HOME"] = str(tmp_path_factory.mktemp("wmctl-home-session"))
    yield
    if old is None:
        os.environ.pop("WMCTL_HOME", None)
    else:
        os.environ["WMCTL_HOME"] = old


def _xdist_rank(item: pytest.Item) -> int:
    """0: real runs outside Docker (marked slow); 1: Docker; 2: the rest (fast, many)."""
    if item.get_closest_marker("docker") is not None:
        return 1
    return 0 if item.get_closest_marker("slow") is not None else 2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, hand out whole modules longest-first: the real torchrun runs, then the
    Docker tests (by then .ci/run's background build of their base image has had the slow runs'
    time to finish), then the many fast tests, which fill the workers' tails evenly. A module
    stays in one piece (its module fixtures are set up once) and keeps its order; a run without
    -n keeps the collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank: dict[str, int] = {}
    for item in items:
        rank[item.nodeid.split("::")[0]] = min(rank.get(item.nodeid.split("::")[0], 2), _xdist_rank(item))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])
