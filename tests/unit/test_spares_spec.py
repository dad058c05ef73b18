"""restart.spares: the field, its bounds, the backends that refuse it, and what it changes in a
local plan (nothing at 0)."""

from __future__ import annotations

import pytest

from orchestrator.runtime.keeper import with_rdzv_id
from orchestrator.errors import SpecError
from orchestrator.vendors import load_profile

from .helpers import check_backend, render_plan, spec_from

BASE = {"name": "sp", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "x:1"}}


def test_spares_default_to_none_and_leave_the_spec_hash_and_plan_as_they_were():
    plain = spec_from(BASE)
    assert plain.restart.spares == 0
    zero = spec_from({**BASE, "restart": {"spares": 0}})
    assert zero.spec_hash() == plain.spec_hash()
    plan = render_plan(plain, load_profile("cpu"), "local")
    assert "spares" not in plan.to_dict()["extra"] and len(plan.resources) == 2
    assert all("is_host" not in " ".join(a["argv"]) for a in plan.resources)


def test_a_local_plan_with_a_spare_has_a_waiting_slot_and_the_store_apart():
    spec = spec_from({**BASE, "restart": {"spares": 1}})
    plan = render_plan(spec, load_profile("cpu"), "local")
    assert [a.get("spare") for a in plan.resources] == [False, False, True]
    assert all("is_host=false" in " ".join(a["argv"]) for a in plan.resources)
    assert plan.to_dict()["extra"]["spares"] == 1
    assert all(a["env"]["WMCTL_FENCE_EPOCH"] == "0" for a in plan.resources)


@pytest.mark.parametrize("value", [-1, 65])
def test_spares_out_of_bounds_are_refused_naming_the_field(value):
    with pytest.raises(SpecError) as err:
        spec_from({**BASE, "restart": {"spares": value}})
    assert "restart.spares" in str(err.value)


def test_a_backend_without_spares_refuses_them_with_the_fix(monkeypatch):
    """Every backend keeps spares now; the one generic check (backends.check) still refuses them
    for a backend class that says it cannot, naming the field, the fix and the backends that can."""
    from orchestrator.backends import backend_class

    monkeypatch.setattr(backend_class("docker"), "spares", False)
    spec = spec_from({**BASE, "restart": {"spares": 1}, "checkpoint": {"dir": "/ck"},
                      "volumes": [{"name": "ck", "mount": "/ck", "pvc": "ck"}]})
    with pytest.raises(SpecError) as err:
        check_backend(spec, "docker", auto_resume=False)
    text = str(err.value)
    assert "restart.spares" in text and "the docker backend cannot keep spare nodes" in text
    assert "set restart.spares: 0" in text and "(spares run on local, kubernetes, slurm)" in text


def test_every_backend_keeps_spares():
    from orchestrator.backends import REGISTRY, backend_class

    assert {name: backend_class(name).spares for name in REGISTRY} == {name: True for name in REGISTRY}


def test_the_local_backend_takes_spares():
    check_backend(spec_from({**BASE, "restart": {"spares": 2}}), "local", auto_resume=True)


def test_the_docker_backend_takes_spares():
    check_backend(spec_from({**BASE, "restart": {"spares": 1}}), "docker", auto_resume=False)


def test_the_kubernetes_backend_takes_spares():
    spec = spec_from({**BASE, "restart": {"spares": 1}, "checkpoint": {"dir": "/ck"},
                      "volumes": [{"name": "ck", "mount": "/ck", "pvc": "ck"}]})
    check_backend(spec, "kubernetes", auto_resume=True)


def test_slurm_takes_spares_without_a_container_only():
    """Slurm's keeper and c10d store run with the submitting host's interpreter: no container yet."""
    check_backend(spec_from({**BASE, "restart": {"spares": 1}}), "slurm", auto_resume=True)
    with pytest.raises(SpecError) as err:
        check_backend(spec_from({**BASE, "restart": {"spares": 1}, "image": {"tag": "reg.io/wm:1"},
                                 "slurm": {"container": "pyxis"}}), "slurm", auto_resume=True)
    text = str(err.value)
    assert "restart.spares" in text and "slurm.container pyxis" in text and "restart.spares: 0" in text


def test_a_round_changes_only_torchruns_rendezvous_id():
    argv = ["torchrun", "--rdzv-id=r-a0", "--", "wmctl-bind", "train.py", "--rdzv-id=mine"]
    assert with_rdzv_id(argv, "r-a0-r1") == ["torchrun", "--rdzv-id=r-a0-r1", "--", "wmctl-bind", "train.py",
                                             "--rdzv-id=mine"]
