"""The cpu profile's torch index end to end with the real engine: `wmctl wheelhouse` fills a
wheelhouse through a local PEP 503 index (the stand-in for download.pytorch.org/whl/cpu), and
`wmctl build-image --wheelhouse` installs that CPU torch with no network.

FROM the shared test rootfs (bookworm + python3 + pip, the first layer of the shared base image,
which has no torch): the torch step really installs the wheelhouse's torch instead of finding the
base's. The torch wheel is a small stand-in named and versioned like the real one (2.13.0+cpu).
"""

from __future__ import annotations

import json
import uuid

import pytest

from ..unit.simpleindex import CPU_TORCH, CUDA_TORCH, cpu_and_default_indexes
from .baseimage import ROOTFS_TAG
from .conftest import WHEELS_IMAGES, run_wmctl
from .test_build import run_in_image

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@pytest.fixture
def tag(docker_client):
    repo = f"wmctl-test/cpuindex-{uuid.uuid4().hex[:8]}"
    yield f"{repo}:v1"
    for image in docker_client.images.list(name=repo):
        for t in image.tags:
            docker_client.images.remove(t, force=True, noprune=True)   # as test_build's tag fixture


@pytest.mark.xdist_group(WHEELS_IMAGES)
def test_offline_build_installs_the_cpu_torch_the_index_served(docker_client, base_image, tmp_path, tag,
                                                               monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    (job / "requirements.txt").write_text("six\n")
    (job / "train.py").write_text("print('train')\n")
    spec = job / "job.yaml"
    spec.write_text(f"name: tiny\nimage: {{vendor: cpu, base: '{ROOTFS_TAG}', requirements: requirements.txt}}\n"
                    "command: [python3, train.py]\n")
    wh = tmp_path / "wheelhouse"
    with cpu_and_default_indexes(tmp_path, monkeypatch) as (pypi, cpu_index):
        filled = run_wmctl("wheelhouse", str(spec), "--dir", str(wh), "--python-version", "3.11", cwd=tmp_path)
        assert filled.returncode == 0, filled.stdout + filled.stderr
        assert cpu_index.served(CPU_TORCH) and not pypi.served(CUDA_TORCH)
    assert CPU_TORCH in {p.name for p in wh.iterdir()}

    built = run_wmctl("build-image", str(spec), "--wheelhouse", str(wh), "--tag", tag, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    out = run_in_image(docker_client, tag, (
        "python3 -c 'import json, torch, six, importlib.metadata as m; "
        "print(json.dumps([torch.__version__, m.version(\"torch\"), m.version(\"filelock\"), m.version(\"six\")]))'"))
    assert json.loads(out.strip().splitlines()[-1]) == ["2.13.0+cpu", "2.13.0+cpu", "3.0", "1.16.0"]
