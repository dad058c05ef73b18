"""Several nodes on one host (Docker containers, local agents) each get their own accelerators,
and both backends split them the same way."""

from __future__ import annotations

import pytest

from orchestrator.launch import device_ids_per_node
from .helpers import render_plan
from orchestrator.vendors import available_profiles, load_profile

from .helpers import full_spec, spec_from

ACCELERATOR_VENDORS = [v for v in available_profiles() if load_profile(v).accelerator]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))


def local_agents(spec, vendor):
    return render_plan(spec, load_profile(vendor), "local", cpus=list(range(16)))


@pytest.mark.parametrize("vendor", ACCELERATOR_VENDORS)
def test_local_agents_get_disjoint_device_slices(vendor):
    profile = load_profile(vendor)
    spec = full_spec(vendor, nodes=3, accelerators_per_node=4)
    plan = local_agents(spec, vendor)
    seen = [a["env"][profile.visible_devices_env] for a in plan.resources]
    assert seen == ["0,1,2,3", "4,5,6,7", "8,9,10,11"]
    assert any(profile.visible_devices_env in n and "4,5,6,7" in n for n in plan.notes)


@pytest.mark.parametrize("vendor", ACCELERATOR_VENDORS)
def test_local_and_docker_split_alike(vendor):
    spec = full_spec(vendor, nodes=2, accelerators_per_node=2)
    ids = device_ids_per_node(spec, load_profile(vendor))
    local = [a["env"][load_profile(vendor).visible_devices_env] for a in local_agents(spec, vendor).resources]
    docker_plan = render_plan(spec, load_profile(vendor), "docker", cpus=list(range(16)))
    docker_note = next(n for n in docker_plan.notes if "accelerators split" in n)
    assert local == ids == ["0,1", "2,3"] and "0,1; 2,3" in docker_note


def test_one_local_agent_keeps_every_device():
    spec = full_spec("cuda", nodes=1)
    [agent] = local_agents(spec, "cuda").resources
    assert "CUDA_VISIBLE_DEVICES" not in agent["env"]


def test_cpu_local_agents_get_no_device_env():
    spec = spec_from({"name": "c", "command": ["python", "t.py"], "nodes": 2})
    for agent in local_agents(spec, "cpu").resources:
        assert not [k for k in agent["env"] if k.endswith("VISIBLE_DEVICES")]


def test_user_env_still_overrides_the_split():
    spec = full_spec("cuda", nodes=2, **{"env.CUDA_VISIBLE_DEVICES": "3"})
    assert [a["env"]["CUDA_VISIBLE_DEVICES"] for a in local_agents(spec, "cuda").resources] == ["3", "3"]
