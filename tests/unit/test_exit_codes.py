"""Every command's exit code follows the README's table ("## Exit codes"), one row per case.

Each case runs through ``orchestrator.cli.main`` (the path that maps a WmctlError to its exit
code and a one-line message) with its own ``WMCTL_HOME``. A case passes when the exit code is
the table's, stderr names what is wrong, and no traceback is printed: an exception escaping
``main`` (what a user would see as a traceback) fails the case.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from orchestrator.cli import main
from orchestrator.layout import node_exit_file
from orchestrator.state import LocalRunStore, RunRecord

from .helpers import DATA

TINY = str(DATA / "tiny.yaml")


def _spec(tmp: Path, text: str) -> str:
    path = tmp / "job.yaml"
    path.write_text("name: j\ncommand: [python, t.py]\n" + text, encoding="utf-8")
    return str(path)


def _damaged(tmp: Path) -> None:
    run_dir = tmp / "home" / "runs" / "broken"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run": "broken", "backend":', encoding="utf-8")


def _running(tmp: Path) -> LocalRunStore:
    """A recorded run named ``tiny`` that has not ended, its watcher lock held (so a status
    reconciled from the backend still finds it watched, that is running)."""
    store = LocalRunStore("tiny")
    store.save(RunRecord(run="tiny", backend="local", spec_path=TINY, overrides={}, spec_hash="x",
                         auto_resume=False))
    store.acquire_watcher()
    return store


def _ghost_attempt(tmp: Path) -> None:
    """Objects of a run named ``tiny`` on the local backend that no run record knows."""
    attempt = tmp / "home" / "runs" / "tiny" / "attempt-0"
    attempt.mkdir(parents=True)
    (attempt / "plan.json").write_text(json.dumps({"resources": [{"node": 0}]}), encoding="utf-8")


@dataclass
class Case:
    id: str
    argv: Callable[..., list[str]]              # of tmp_path (`...`: mypy infers a lambda with a bound default only so)
    code: int
    says: str                                   # a piece of stderr naming the problem
    setup: Callable[[Path], object] | None = None
    env: dict[str, str] | None = None


CASES = [
    # 2: invalid spec, profile or option
    Case("invalid-spec", lambda t: ["render", _spec(t, "nodes: 0\n"), "-b", "local"], 2, "nodes:"),
    Case("unknown-field", lambda t: ["render", _spec(t, "nodse: 2\n"), "-b", "local"], 2, "did you mean 'nodes'"),
    Case("bad-duration", lambda t: ["render", _spec(t, "restart: {backoff: 1x}\n"), "-b", "local"], 2,
         "restart.backoff:"),
    Case("spec-affinity-bad-cpulist", lambda t: ["render", _spec(t, "affinity: {0: bad}\n"), "-b", "local"], 2,
         "affinity.0:"),
    Case("affinity-cmd-bad-map", lambda t: ["affinity", "--nproc", "2", "--mode", '{"0": "bad"}'], 2, "--mode"),
    Case("affinity-cmd-bad-mode", lambda t: ["affinity", "--nproc", "2", "--mode", "weird"], 2, "--mode"),
    Case("affinity-cmd-unknown-vendor", lambda t: ["affinity", "--nproc", "1", "--vendor", "nope"], 2, "--vendor"),
    Case("doctor-bad-size", lambda t: ["doctor", "--vendor", "cpu", "--shm-min", "lots"], 2, "--shm-min"),
    Case("doctor-unknown-vendor", lambda t: ["doctor", "--vendor", "nope"], 2, "--vendor"),
    Case("missing-spec-file", lambda t: ["render", str(t / "nope.yaml")], 2, "does not exist"),
    Case("render-negative-attempt", lambda t: ["render", TINY, "--attempt", "-1"], 2, "--attempt"),
    Case("logs-negative-node", lambda t: ["logs", "nope", "--node", "-1"], 2, "--node"),
    # 3: the build refused its input (a real failed build needs an engine: tests/docker)
    Case("build-arg-not-key-value", lambda t: ["build-image", TINY, "--dry-run", "--build-arg", "NOEQUALS"], 3,
         "--build-arg"),
    # 4: the submit was refused: the run's name is taken
    Case("run-exists-not-ended", lambda t: ["submit", TINY, "-b", "local"], 4, "has not ended",
         setup=_running),
    Case("name-held-by-unknown-objects", lambda t: ["submit", TINY, "-b", "local"], 4, "no run record here knows",
         setup=_ghost_attempt),
    # 5: engine unreachable
    Case("docker-unreachable", lambda t: ["submit", TINY, "-b", "docker", "--image", "r/x:1"], 5,
         "cannot reach the Docker engine", env={"DOCKER_HOST": "tcp://127.0.0.1:1"}),
    # 6: run not found, or its record damaged
    Case("forgive-unknown-node", lambda t: ["nodes", "forgive", "node-z"], 6, "no remembered exclusion of node"),
    *[Case(f"{cmd}-unknown-run", lambda t, cmd=cmd: [cmd, "nope"], 6, "no run named 'nope'")
      for cmd in ("status", "logs", "cancel", "watch")],
    *[Case(f"{cmd}-damaged-record", lambda t, cmd=cmd: [cmd, "broken"], 6, "is damaged", setup=_damaged)
      for cmd in ("status", "logs", "cancel", "watch")],
    # 0: a damaged record is listed, not raised
    Case("list-with-damaged-record", lambda t: ["list"], 0, "", setup=_damaged),
    # 9: doctor's checks ran and found the machine unfit
    Case("doctor-finds-an-error", lambda t: ["doctor", "--vendor", "cpu", "--shm-min", "1000Ti"], 9,
         "doctor found 1 error"),
]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_exit_code(case: Case, home: Path, monkeypatch, capsys):
    for key, value in (case.env or {}).items():
        monkeypatch.setenv(key, value)
    held = case.setup(home) if case.setup else None
    try:
        code, _, err = _run(case.argv(home), capsys)
    finally:
        if isinstance(held, LocalRunStore):
            held.release_watcher()
    assert code == case.code, err
    assert case.says in err and "Traceback" not in err, err


def test_refused_submit_submits_nothing(home: Path, capsys):
    """The name-taken refusal (4) comes before anything reaches the backend."""
    store = _running(home)
    try:
        code, _, _ = _run(["submit", TINY, "-b", "local"], capsys)
    finally:
        store.release_watcher()
    assert code == 4
    assert not list((home / "home" / "runs" / "tiny").glob("attempt-*"))


def test_logs_of_a_real_run(home: Path, capsys):
    """A finished local run: node 0's log prints (0); a node or attempt it does not have is not
    found (6), naming what it does have; before, a missing node exited 4 (backend refused)."""
    code, _, err = _run(["submit", TINY, "-b", "local", "--set", "name=logs-run"], capsys)
    assert code == 0, err
    exit_file = node_exit_file("logs-run", 0, 0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not exit_file.exists():
        time.sleep(0.1)
    code, out, err = _run(["logs", "logs-run"], capsys)
    assert code == 0 and "hello" in out, err
    code, _, err = _run(["logs", "logs-run", "--node", "9"], capsys)
    assert code == 6 and "has no node 9" in err and "its only node is 0" in err and "Traceback" not in err
    code, _, err = _run(["logs", "logs-run", "--attempt", "5"], capsys)
    assert code == 6 and "no attempt 5" in err and "Traceback" not in err


def test_every_error_class_s_exit_code_is_in_the_readme_table():
    """A new error class with a new exit code must be documented in the one table."""
    import re

    from orchestrator import errors

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    documented = {int(n) for n in re.findall(r"^\| (\d+) \| \S", section, re.MULTILINE)}
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.WmctlError)]
    assert {c.exit_code for c in classes} <= documented, documented
    assert documented == set(range(11)), documented
