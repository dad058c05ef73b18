"""The wmctl wheel shipped into images: built from the source tree, and repacked from an install."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.imagebuild import wheel
from orchestrator.errors import BuildError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return wheel.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.timeout(600)
def test_source_wheel_has_runtime_data_and_launcher(built):
    assert built.name == f"wmctl-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"wmctl-{__version__}.dist-info/entry_points.txt").decode()
    assert "orchestrator/runtime/protocol.py" in names
    assert "orchestrator/_data/templates/Dockerfile.j2" in names
    assert "orchestrator/_data/images/cpu.yaml" in names
    assert "wmctl-bind = orchestrator.runtime.affinity:launcher_main" in entry_points
    assert not any("__pycache__" in n for n in names)


@pytest.mark.timeout(600)
def test_installed_wmctl_repacks_the_same_files(built, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(target), str(built)], check=True, timeout=300)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = ("import sys; from orchestrator.imagebuild import wheel; s = wheel.locate(); "
            "print(s.kind); print(wheel.build_wheel(sys.argv[1]))")
    env = {k: v for k, v in os.environ.items() if k != wheel.ENV_WHEEL}
    env.update(PYTHONPATH=str(target), WMCTL_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", code, str(out_dir)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    kind, path = result.stdout.split()
    assert kind == "installed"
    with zipfile.ZipFile(built) as a, zipfile.ZipFile(path) as b:
        skip = {f"wmctl-{__version__}.dist-info/RECORD"}
        names_a = sorted(n for n in a.namelist() if n not in skip)
        names_b = sorted(n for n in b.namelist() if n not in skip)
        assert names_a == names_b
        for n in names_a:
            assert a.read(n) == b.read(n), n
        record = b.read(f"wmctl-{__version__}.dist-info/RECORD").decode()
    assert "orchestrator/__init__.py,sha256=" in record


def test_pinned_wheel_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv(wheel.ENV_WHEEL, str(tmp_path / "missing.whl"))
    with pytest.raises(BuildError, match="no such file"):
        wheel.build_wheel()
    wrong = tmp_path / "wmctl-9.9.9-py3-none-any.whl"
    wrong.write_bytes(b"x")
    monkeypatch.setenv(wheel.ENV_WHEEL, str(wrong))
    with pytest.raises(BuildError, match="expected wmctl-"):
        wheel.fingerprint()
