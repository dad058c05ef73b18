"""Golden renders for every vendor profile x backend.

Regenerate after an intended change with:
    WMCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_golden.py
and review the diff of tests/golden/: that review is how a rendering change is checked.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.commands._common import plan_document
from orchestrator.plan import AttemptContext
from .helpers import render_plan
from orchestrator.vendors import available_profiles, load_profile

from .helpers import GOLDEN, full_spec

VENDORS = available_profiles()
REGEN = os.environ.get("WMCTL_REGEN_GOLDEN") == "1"


def render_golden(vendor: str, backend: str) -> str:
    spec = full_spec(vendor)
    profile = load_profile(vendor)
    # A retry attempt: exercises resume, parent and node exclusion in every render.
    ctx = AttemptContext(attempt=1, excluded_nodes=("gpu-node-7",), resume=True, parent=0)
    kwargs = {}
    if backend == "docker":
        kwargs["cpus"] = list(range(128))     # a fixed host, not this machine
    if backend == "local":
        kwargs.update(cpus=list(range(128)), python="/usr/bin/python3", port=29500)
    plan = render_plan(spec, profile, backend, ctx, **kwargs)
    text = plan_document(plan, "yaml")
    # Paths of this checkout and of $HOME vary between machines; goldens must not.
    return text.replace(str(spec.source_dir), "<specdir>").replace(os.path.expanduser("~"), "<home>")


def test_every_vendor_has_a_profile_file():
    expected = {"cuda", "rocm", "musa", "ascend", "gaudi", "cambricon", "hygon", "metax", "iluvatar", "cpu"}
    assert expected <= set(VENDORS)


@pytest.mark.parametrize("backend", ["kubernetes", "docker", "local"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_golden_render(vendor, backend, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", "<home>/.wmctl")
    text = render_golden(vendor, backend)
    path = GOLDEN / backend / f"{vendor}.yaml"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path}; regenerate with WMCTL_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"render of {vendor}/{backend} changed; review and regenerate with WMCTL_REGEN_GOLDEN=1")


@pytest.mark.parametrize("backend", ["kubernetes", "docker", "local"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_plans_have_no_yaml_anchors(vendor, backend, monkeypatch):
    # An object shared between two containers dumps as &id001/*id001: valid YAML, but a reader
    # (or a tool editing one container) no longer sees each container on its own.
    import yaml

    monkeypatch.setenv("WMCTL_HOME", "<home>/.wmctl")
    events = list(yaml.parse(render_golden(vendor, backend)))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)]
