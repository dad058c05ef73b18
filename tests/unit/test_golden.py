"""Golden renders for every vendor profile x backend.

Regenerate after an intended change with:
    WMCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_golden.py
and review the diff of tests/golden/: that review is how a rendering change is checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands._common import plan_document
from orchestrator.plan import AttemptContext
from .helpers import render_plan
from orchestrator.vendors import available_profiles, load_profile

from .helpers import GOLDEN, full_spec

VENDORS = available_profiles()
REGEN = os.environ.get("WMCTL_REGEN_GOLDEN") == "1"
BACKENDS = ["kubernetes", "docker", "local", "slurm"]
SUFFIX = {"slurm": "sh"}             # the sbatch script; the others print YAML plans
# Slurm: the spec's slurm section filled in, and (for containers) host_path volumes only.
SLURM = {"slurm.partition": "gpu,gpu-long", "slurm.account": "proj42", "slurm.qos": "normal",
         "slurm.time_limit": "1-00:00:00", "slurm.constraint": "a100&ib",
         "slurm.extra_options": ["--mail-type=END", "--hint=nomultithread"]}
HOST_VOLUMES = [{"name": "data", "mount": "/workspace/data", "host_path": "/shared/data", "read_only": True},
                {"name": "ckpt", "mount": "/workspace/ckpt", "host_path": "/shared/ckpt"}]
# (golden name, vendor, container): the container paths, each rendered once beside every vendor's plain one
SLURM_CONTAINERS = [("pyxis-cuda", "cuda", "pyxis"), ("apptainer-cuda", "cuda", "apptainer"),
                    ("apptainer-ascend", "ascend", "apptainer")]
SPARES_GOLDEN = "spares-cuda"        # restart.spares: 1 on the cuda profile


def golden_path(backend: str, name: str) -> Path:
    return GOLDEN / backend / f"{name}.{SUFFIX.get(backend, 'yaml')}"


def render_golden(vendor: str, backend: str, container: str | None = None, spares: int = 0) -> str:
    overrides: dict = {}
    if backend == "slurm":
        overrides = dict(SLURM)
        if container:
            overrides.update({"slurm.container": container, "volumes": HOST_VOLUMES})
    if spares:
        overrides["restart.spares"] = spares
    spec = full_spec(vendor, **overrides)
    profile = load_profile(vendor)
    # A retry attempt: exercises resume, parent and node exclusion in every render.
    ctx = AttemptContext(attempt=1, excluded_nodes=("gpu-node-7",), resume=True, parent=0)
    kwargs: dict[str, Any] = {}
    if backend == "docker":
        kwargs["cpus"] = list(range(128))     # a fixed host, not this machine
    if backend in ("local", "slurm"):
        kwargs.update(cpus=list(range(128)), python="/usr/bin/python3", port=29500)
    plan = render_plan(spec, profile, backend, ctx, **kwargs)
    text = plan_document(plan, "yaml")
    # Paths of this checkout and of $HOME vary between machines; goldens must not.
    if backend == "slurm":      # a script: its placeholder must stay a path bash can read (bash -n)
        return text.replace(str(spec.source_dir), "/specdir")
    return text.replace(str(spec.source_dir), "<specdir>").replace(os.path.expanduser("~"), "<home>")


def test_every_vendor_has_a_profile_file():
    expected = {"cuda", "rocm", "musa", "ascend", "gaudi", "cambricon", "hygon", "metax", "iluvatar", "cpu"}
    assert expected <= set(VENDORS)


def _home(monkeypatch, backend: str) -> None:
    # Slurm's nodes need an absolute WMCTL_HOME: one of a shared filesystem, the same on every machine.
    monkeypatch.setenv("WMCTL_HOME", "/shared/wmctl" if backend == "slurm" else "<home>/.wmctl")


def _compare(text: str, path: Path) -> None:
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path}; regenerate with WMCTL_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"render {path.relative_to(GOLDEN)} changed; review and regenerate with WMCTL_REGEN_GOLDEN=1")


@pytest.mark.parametrize("name,vendor,container", SLURM_CONTAINERS)
def test_golden_slurm_container(name, vendor, container, monkeypatch):
    _home(monkeypatch, "slurm")
    _compare(render_golden(vendor, "slurm", container), golden_path("slurm", name))


def test_golden_slurm_spares(monkeypatch):
    """restart.spares on Slurm: the spares are nodes of the allocation (--nodes, --no-kill), one
    keeper step per slot pinned to its node, the c10d store in the batch script."""
    _home(monkeypatch, "slurm")
    _compare(render_golden("cuda", "slurm", spares=1), golden_path("slurm", SPARES_GOLDEN))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vendor", VENDORS)
def test_golden_render(vendor, backend, monkeypatch):
    _home(monkeypatch, backend)
    _compare(render_golden(vendor, backend), golden_path(backend, vendor))


@pytest.mark.parametrize("name", [*VENDORS, *(c[0] for c in SLURM_CONTAINERS), SPARES_GOLDEN])
def test_slurm_goldens_are_scripts_bash_reads(name):
    """Every golden sbatch script parses (`bash -n`), starts as sbatch wants (#!), and asks for its
    nodes before the first command (sbatch stops reading #SBATCH lines there)."""
    import subprocess

    text = golden_path("slurm", name).read_text(encoding="utf-8")
    checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH ")]
    assert directives and max(directives) < first_command
    nodes = 3 if name == SPARES_GOLDEN else 2        # the spare is a node of the allocation too
    assert f"#SBATCH --nodes={nodes}" in lines and "#SBATCH --no-requeue" in lines
    assert ("#SBATCH --no-kill" in lines) == (name == SPARES_GOLDEN)


@pytest.mark.parametrize("backend", ["kubernetes", "docker", "local"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_plans_have_no_yaml_anchors(vendor, backend, monkeypatch):
    # An object shared between two containers dumps as &id001/*id001: valid YAML, but a reader
    # (or a tool editing one container) no longer sees each container on its own.
    import yaml

    monkeypatch.setenv("WMCTL_HOME", "<home>/.wmctl")
    events = list(yaml.parse(render_golden(vendor, backend)))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)]


def test_golden_docker_spares(monkeypatch):
    """restart.spares: 1 on Docker: the store container and three keeper slots (docs/spares.md).
    The keeper is mounted from this installation: its path is <wmctl> in the golden."""
    from orchestrator.backends.docker.spares import source_files

    _home(monkeypatch, "docker")
    spec = full_spec("cpu", **{"restart.spares": 1})
    ctx = AttemptContext(attempt=1, excluded_nodes=("gpu-node-7",), resume=True, parent=0)
    text = plan_document(render_plan(spec, load_profile("cpu"), "docker", ctx, cpus=list(range(128))), "yaml")
    text = text.replace(str(Path(source_files()[0]).parents[2]), "<wmctl>")
    text = text.replace(str(spec.source_dir), "<specdir>").replace(os.path.expanduser("~"), "<home>")
    _compare(text, golden_path("docker", "cpu-spares"))


def test_golden_kubernetes_spares(monkeypatch):
    """restart.spares on Kubernetes (backends/kubernetes/spares.py): the Job of nodes + spares with
    per-index limits, the rounds and files ConfigMaps, the keepers' Role, the store's pod. The
    files ConfigMap carries runtime/keeper.py and runtime/c10dstore.py as they are (checked here):
    the golden shows their names, not their text, so an edit of the keeper changes no golden."""
    from orchestrator.backends.kubernetes import spares as sp

    _home(monkeypatch, "kubernetes")
    spec = full_spec("cuda", **{"restart.spares": 1})
    ctx = AttemptContext(attempt=1, excluded_nodes=("gpu-node-7",), resume=True, parent=0)
    plan = render_plan(spec, load_profile("cuda"), "kubernetes", ctx)
    files = next(o for o in plan.resources if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-files"))
    assert files["data"] == sp.file_texts()
    files["data"] = {name: f"<orchestrator/runtime/{name}>" for name in files["data"]}
    text = plan_document(plan, "yaml").replace(str(spec.source_dir), "<specdir>")
    _compare(text.replace(os.path.expanduser("~"), "<home>"), golden_path("kubernetes", "spares-cuda"))
