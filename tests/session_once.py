"""Things one test session builds once, also when pytest-xdist splits it over worker processes.

A session-scoped fixture runs once per *process*: under ``pytest -n N`` every worker would build
its own copy (a wheel, a reference training run) and, where the thing lives outside the process
(a file in a shared folder, an image tag), two workers would build it at the same moment.
``build_once`` runs ``build`` in the first worker that asks, under a file lock, and hands every
later asker (any worker) the same result; a build that raised leaves nothing behind, so the next
asker builds again and sees the same error itself.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this test session shares: under xdist each worker's basetemp
    is ``<session basetemp>/popen-gwN``, so its parent; without xdist, basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], dict[str, str]]) -> dict[str, str]:
    """Run ``build(folder)`` once per test session, whichever worker asks first; every asker gets
    the dict (of strings, kept as JSON) it returned. ``folder`` is empty and shared by all."""
    return build_once_in(session_root(tmp_path_factory) / "session-once", name, build)


def build_once_in(root: Path, name: str, build: Callable[[Path], dict[str, str]]) -> dict[str, str]:
    """build_once with the shared folder given: ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if done.is_file():
            return json.loads(done.read_text())
        folder = root / name
        if folder.exists():  # left by a build that raised in another worker
            shutil.rmtree(folder)
        folder.mkdir()
        result = build(folder)
        tmp = done.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, done)
    return result
