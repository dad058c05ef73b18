"""Session-wide: no test writes into the user's ~/.wmctl (run folders, archived logs)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _wmctl_home(tmp_path_factory):
    old = os.environ.get("WMCTL_HOME")
    os.environ["WMCTL_HOME"] = str(tmp_path_factory.mktemp("wmctl-home-session"))
    yield
    if old is None:
        os.environ.pop("WMCTL_HOME", None)
    else:
        os.environ["WMCTL_HOME"] = old
