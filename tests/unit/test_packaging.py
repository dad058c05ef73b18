"""A non-editable install finds its templates, vendor profiles and manifests from any directory.

The wheel is the one wmctl ships into images (``orchestrator.imagebuild.wheel.build_wheel``: hatchling from
this tree). It goes into a fresh venv with ``pip install --no-index --no-deps``; the venv sees the
test venv's site-packages only through a ``.pth`` line appended *after* its own site-packages, so
click, jinja2 and friends resolve without a download while ``orchestrator`` must come from the
fresh install (asserted: a silent fallback to this checkout would prove nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

from orchestrator import __version__
from orchestrator.imagebuild import wheel

REPO = Path(__file__).resolve().parents[2]


def _site_packages(venv: Path) -> Path:
    found = list(venv.glob("lib/python*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def test_installed_wheel_runs_from_another_directory_with_its_data(tmp_path):
    (tmp_path / "dist").mkdir()
    whl = wheel.build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--no-deps", str(whl)],
                   check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    (_site_packages(venv) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(REPO / "examples" / "worldmodel", elsewhere / "job",
                    ignore=shutil.ignore_patterns(".cache", "ckpt", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["WMCTL_HOME"] = str(tmp_path / "home")

    def wmctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "wmctl"), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=120)

    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import orchestrator, orchestrator.resources as r; print(orchestrator.__file__); "
         "print(r.templates_dir()); print(r.images_dir()); print(r.manifests_dir())"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    module_file, *data_dirs = probe.stdout.split()
    assert Path(module_file).is_relative_to(venv), f"orchestrator imported from {module_file}, not the install"
    for folder in data_dirs:
        assert Path(folder).is_relative_to(venv) and Path(folder).is_dir(), folder
    assert (Path(data_dirs[1]) / "musa.yaml").is_file()
    assert (Path(data_dirs[2]) / "rbac-watcher.yaml").is_file()

    version = wmctl("--version")
    assert version.returncode == 0 and __version__ in version.stdout

    # The example's checkpoint is a relative host_path (right locally, refused on Kubernetes).
    rendered = wmctl("render", "job/job.yaml", "--backend", "kubernetes", "--vendor", "musa",
                     "--image", "registry.example.com/wm:v1",
                     "--set", "volumes=[{name: ckpt, mount: /workspace/ckpt, pvc: wm-ckpt}]")
    assert rendered.returncode == 0, rendered.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert kinds == ["Service", "Job"], kinds
    assert "mthreads.com/gpu" in rendered.stdout

    dockerfile = wmctl("build-image", "job/job.yaml", "--dry-run")
    assert dockerfile.returncode == 0, dockerfile.stderr
    assert "FROM " in dockerfile.stdout and "wmctl" in dockerfile.stdout
