"""Job spec loading: defaults, overrides, and the cross-field checks that catch real mistakes."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.launch import nproc_per_node
from orchestrator.spec import apply_overrides, check_backend, load_spec, parse_set_flags, parse_spec
from orchestrator.vendors import load_profile

from .helpers import DATA, full_spec, spec_from

BASE = {"name": "wm", "command": ["python", "train.py"]}


def problems_of(data, **kw):
    with pytest.raises(SpecError) as err:
        spec_from({**BASE, **data}, **kw)
    return dict(err.value.problems)


def test_minimal_spec_gets_defaults():
    spec = load_spec(DATA / "tiny.yaml")
    assert spec.nodes == 1 and spec.image.vendor == "cpu" and spec.resources.shm_bytes == 16 * 2**30
    assert spec.restart.max_attempts == 3 and spec.checkpoint.every_steps == 200
    assert len(spec.spec_hash()) == 12


def test_nproc_defaults_from_vendor():
    cuda = full_spec("cuda", accelerators_per_node=None)
    assert nproc_per_node(cuda, load_profile("cuda")) == 8           # profile default: one rank per card
    four = full_spec("musa", accelerators_per_node=4)
    assert nproc_per_node(four, load_profile("musa")) == 4
    cpu = spec_from({**BASE, "resources": {"cpu": 6}})
    assert nproc_per_node(cpu, load_profile("cpu")) == 6
    assert nproc_per_node(spec_from(BASE), load_profile("cpu")) == 1
    explicit = spec_from({**BASE, "nproc_per_node": 3})
    assert nproc_per_node(explicit, load_profile("cpu")) == 3


def test_unknown_key_suggests_the_right_one():
    p = problems_of({"resources": {"shm_size": "1Gi"}, "checkpont": {}})
    assert "did you mean 'shm'" in p["resources.shm_size"]
    assert "did you mean 'checkpoint'" in p["checkpont"]


def test_shm_larger_than_memory_is_rejected():
    p = problems_of({"resources": {"memory": "8Gi", "shm": "16Gi"}})
    assert "counts toward the memory limit" in p["resources.shm"]


def test_tiny_shm_is_rejected():
    assert "64Mi" in problems_of({"resources": {"shm": "1Mi"}})["resources.shm"]


def test_bad_quantity_and_duration_name_their_field():
    p = problems_of({"resources": {"memory": "lots"}, "restart": {"backoff": "soon"}})
    assert "16Gi" in p["resources.memory"] and "30s" in p["restart.backoff"]


def test_name_too_long_with_attempt_suffix():
    p = problems_of({"name": "a" * 60, "restart": {"max_attempts": 10}, "nodes": 16})
    assert "shorten it to at most" in p["name"]


def test_two_volumes_on_one_mount_path():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data", "pvc": "x"},
                                 {"name": "b", "mount": "/data/", "host_path": "/mnt"}]})
    assert "two volumes on one mount path" in p["volumes[1].mount"]


def test_volume_needs_exactly_one_source():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data", "pvc": "x", "host_path": "/y"},
                                 {"name": "b", "mount": "/b"}]})
    assert "exactly one source" in p["volumes[0]"] and "none" in p["volumes[1]"]


def test_auto_resume_needs_checkpoint_on_persistent_volume():
    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/ckpt"},
                      "volumes": [{"name": "scratch", "mount": "/ckpt", "empty_dir": {}}]})
    with pytest.raises(SpecError) as err:
        check_backend(spec, "kubernetes", auto_resume=True)
    assert "lost with the container" in dict(err.value.problems)["checkpoint.dir"]
    check_backend(spec, "kubernetes", auto_resume=False)      # fine without auto-resume
    check_backend(spec, "local", auto_resume=True)            # local disk persists
    ok = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/ckpt/run1"},
                    "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}]})
    check_backend(ok, "kubernetes", auto_resume=True)


def test_image_required_for_container_backends():
    with pytest.raises(SpecError) as err:
        check_backend(spec_from(BASE), "docker", auto_resume=False)
    assert "image.tag" in dict(err.value.problems)


def test_secret_volume_rejected_on_docker():
    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "volumes": [{"name": "s", "mount": "/s", "secret": "x"}]})
    with pytest.raises(SpecError):
        check_backend(spec, "docker", auto_resume=False)


def test_unknown_vendor_suggests():
    p = problems_of({"image": {"vendor": "cudaa"}})
    assert "did you mean 'cuda'" in p["image.vendor"]


def test_explicit_affinity_map():
    spec = spec_from({**BASE, "affinity": {0: "0-15", 1: "16-31"}})
    assert spec.affinity == {0: "0-15", 1: "16-31"}
    p = problems_of({"affinity": {0: "zero"}})
    assert "affinity.0" in p
    p = problems_of({"affinity": "numaa"})
    assert "affinity" in p


def test_overrides_and_set_flags():
    flags = parse_set_flags(["nodes=4", "resources.shm=32Gi", "env.FOO=bar baz", "restart.auto_resume=true"])
    assert flags == {"nodes": 4, "resources.shm": "32Gi", "env.FOO": "bar baz", "restart.auto_resume": True}
    spec = load_spec(DATA / "tiny.yaml", flags)
    assert spec.nodes == 4 and spec.resources.shm == "32Gi" and spec.env["FOO"] == "bar baz"
    with pytest.raises(SpecError):
        parse_set_flags(["novalue"])
    with pytest.raises(SpecError):
        apply_overrides({"nodes": 2}, {"nodes.x": 1})


def test_env_values_are_strings_and_reserved_names_rejected():
    spec = spec_from({**BASE, "env": {"PORT": 8080, "DEBUG": True}})
    assert spec.env == {"PORT": "8080", "DEBUG": "true"}
    assert "WMCTL_" in problems_of({"env": {"WMCTL_RUN": "x"}})["env.WMCTL_RUN"]


def test_yaml_syntax_error_reports_line():
    with pytest.raises(SpecError) as err:
        parse_spec("name: x\ncommand: [python\n")
    assert "line" in str(err.value)


def test_missing_file():
    with pytest.raises(SpecError) as err:
        load_spec(DATA / "nope.yaml")
    assert "does not exist" in str(err.value)


def test_spec_hash_changes_with_content():
    a = spec_from(BASE).spec_hash()
    b = spec_from({**BASE, "nodes": 2}).spec_hash()
    assert a != b and a == spec_from(BASE).spec_hash()
