"""A vendor is one YAML file: a profile written by this test, for hardware no line of wmctl knows,
renders on Kubernetes and Docker, gets its Dockerfile, and its job's launcher and preflight find
its cards through the profile the plan hands over."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.imagebuild.plan import plan_build
from orchestrator.plan import AttemptContext, HostFacts
from orchestrator.specload import from_dict
from orchestrator.vendors import available_profiles, load_profile

from .fakesysfs import FakeSysfs

REPO = Path(__file__).resolve().parents[2]
ORCHESTRATOR = REPO / "orchestrator"
PCI_ID = 0xA0A0

PROFILE = {
    "name": "acmeai", "display_name": "Acme AI accelerator", "accelerator": True,
    "resource": "acme.example.com/npu", "torch_module": "acme", "dist_backend": "accl",
    "smi": ["acme-smi"], "base_image": "acme/pytorch:1.0", "base_has_torch": True, "python": "python3",
    "pci_vendor_ids": ["0xa0a0"], "visible_devices_env": "ACME_VISIBLE_DEVICES",
    "default_accelerators_per_node": 2, "runtime_libraries": ["libacmert.so"],
    "docker": {"per_device": ["/dev/acme{i}"], "visible_devices_env": "ACME_VISIBLE_DEVICES"},
    "runtime": {"torch_plugin": "acme_torch", "libraries": ["acmert"], "smi": ["acme-smi"],
                "device_sources": ["pci"], "aliases": ["acme"], "unverified": []},
}

# What the vendor's PyTorch plugin does on import: register torch.<module> with its devices.
PLUGIN = """import torch, types
m = types.ModuleType("torch.acme")
m.is_available = lambda: True
m.device_count = lambda: 2
torch.acme = m
"""


@pytest.fixture
def vendor_path(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "acmeai.yaml").write_text(yaml.safe_dump(PROFILE))
    monkeypatch.setenv("WMCTL_VENDOR_PATH", str(folder))
    return folder


def spec_for(tmp_path: Path):
    (tmp_path / "train.py").write_text("print(1)\n")
    return from_dict({"name": "acmejob", "nodes": 2, "image": {"vendor": "acmeai", "tag": "reg.example.com/acme:1",
                                                               "base": "acme/pytorch:1.0"},
                      "command": ["python", "train.py"], "resources": {"cpu": 4, "memory": "8Gi", "shm": "1Gi"}},
                     source_dir=tmp_path)


def test_a_profile_on_the_vendor_path_is_found_by_name_and_alias(vendor_path):
    assert "acmeai" in available_profiles()
    assert load_profile("acme").name == "acmeai"
    assert load_profile("acmeai").runtime_profile().pci_vendor_ids == (PCI_ID,)


def test_a_new_vendor_renders_on_kubernetes_and_docker_and_gets_a_dockerfile(vendor_path, tmp_path):
    from orchestrator import backends

    spec, profile = spec_for(tmp_path), load_profile("acmeai")
    host = HostFacts(cpus=tuple(range(8)), python="/usr/bin/python3", home=tmp_path / "home")
    k8s = backends.render_plan(spec, profile, "kubernetes", AttemptContext(), host)
    job = next(o for o in k8s.resources if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert str(container["resources"]["limits"]["acme.example.com/npu"]) == "2"
    env = {e["name"]: e.get("value") for e in container["env"]}
    handed = json.loads(env["WMCTL_VENDOR_PROFILE"])
    assert handed["torch_module"] == "acme" and handed["dist_backend"] == "accl"
    docker = backends.render_plan(spec, profile, "docker", AttemptContext(), host)
    nodes = [r["create"] for r in docker.resources if r["kind"] == "container"]
    assert [n["environment"]["ACME_VISIBLE_DEVICES"] for n in nodes] == ["0,1", "2,3"]
    build = plan_build(spec, profile, wheel_name="wmctl-0.1.0-py3-none-any.whl", wheel_fingerprint="f" * 64,
                       wmctl_version="0.1.0", source={"source": "https://example.com/acme.git", "revision": "abc"},
                       created="2026-01-01T00:00:00Z")
    assert "FROM acme/pytorch:1.0" in build.dockerfile
    assert "ENV WMCTL_VENDOR_PROFILE=" in build.dockerfile and '\\"torch_module\\":\\"acme\\"' in build.dockerfile


def test_the_job_binds_and_preflights_through_the_profile_it_is_handed(vendor_path, tmp_path):
    """As the job starts on a node: the env the local plan gives (no profile folder, no YAML in
    the job), a fake sysfs with two cards of the new vendor, and the vendor's torch plugin."""
    from orchestrator import backends

    spec, profile = spec_for(tmp_path), load_profile("acmeai")
    host = HostFacts(cpus=tuple(range(8)), python=sys.executable, home=tmp_path / "home", port=29500)
    plan = backends.render_plan(spec, profile, "local", AttemptContext(), host)
    job_env = dict(plan.resources[0]["env"])
    cpus = sorted(os.sched_getaffinity(0))
    fs = FakeSysfs(tmp_path / "sys").cpus(max(cpus) + 1).node(0, cpus)
    fs.pci("0000:01:00.0", PCI_ID, 0x120000, 0).pci("0000:02:00.0", PCI_ID, 0x120000, 0)
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "acme_torch.py").write_text(PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WMCTL_")}
    env.update(job_env)
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "plugin")]), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "2", "WMCTL_SYSFS_ROOT": str(tmp_path / "sys")})
    env.pop("WMCTL_VENDOR_PATH", None)    # the job has only what the plan handed it
    probe = "import os; print(os.environ['WMCTL_BOUND_CPUS'])"
    bound = subprocess.run([sys.executable, "-m", "orchestrator.runtime.affinity", "--", sys.executable, "-c", probe],
                           env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bound.returncode == 0, bound.stderr
    assert "numa=0" in bound.stderr and bound.stdout.strip()
    pre = subprocess.run([sys.executable, "-m", "orchestrator.runtime.preflight", "--expect-devices", "2",
                          "--num-workers", "0", "-o", "json"], env=env, capture_output=True, text=True,
                         timeout=100, cwd=tmp_path)
    report = json.loads(pre.stdout)
    checks = {f["check"]: f for f in report["findings"]}
    assert checks["devices"]["level"] == "ok" and "torch.acme sees 2 device(s)" in checks["devices"]["message"]
    assert checks["sysfs"]["level"] == "ok" and "2 acmeai device(s)" in checks["sysfs"]["message"]
    assert "libacmert.so" in checks["runtime-library"]["message"] and "acme-smi" in checks["smi"]["message"]


def _source_files() -> list[Path]:
    return [p for p in ORCHESTRATOR.rglob("*.py")]


def test_the_new_vendors_facts_appear_nowhere_in_the_code():
    text = "\n".join(p.read_text(encoding="utf-8").lower() for p in _source_files())
    for fact in ("acme", "accl", "a0a0"):
        assert fact not in text


def test_no_vendor_table_is_left_in_the_code():
    """The facts of the shipped vendors live in images/*.yaml only."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in _source_files())
    for fact in ("mccl", "torch_musa", "torch_npu", "habana_frameworks", "cncl", "mthreads-gmi"):
        assert fact not in text, fact
    assert not re.search(r"0x1ed5|0x10de|0x19e5", text, re.IGNORECASE)
