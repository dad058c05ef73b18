"""On CI a skipped test fails (tests/ci_no_skip.py): run a suite of one skipping test with and
without CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n"
        "def test_needs_an_engine():\n    pytest.skip('no engine here')\n\n"
        "@pytest.mark.xfail(reason='known', strict=True)\ndef test_known_bug():\n    assert False\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.ci_no_skip", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=120)


def test_a_skip_on_ci_is_a_failure_naming_its_reason(tmp_path):
    out = _run(tmp_path, "true")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed, 1 xfailed" in out.stdout and "CI=true: skipped tests fail here (Skipped: no engine here)" \
        in out.stdout, out.stdout


def test_off_ci_a_skip_stays_a_skip(tmp_path):
    out = _run(tmp_path, None)
    assert out.returncode == 0 and "1 skipped, 1 xfailed" in out.stdout, out.stdout + out.stderr
