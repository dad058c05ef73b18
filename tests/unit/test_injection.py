"""Hostile values in names, args, env and paths: rendered output parses back to exactly the
input, shell lines are quoted, and invalid ones are rejected with a clear error."""

from __future__ import annotations

import shlex

import pytest
import yaml

from orchestrator.commands._common import plan_document
from orchestrator.errors import SpecError
from orchestrator.render import render_plan
from orchestrator.render.safe import yaml_value
from orchestrator.vendors import load_profile

from .helpers import spec_from

HOSTILE = [
    'quote " and \' both',
    "new\nline: injected\n- item",
    "$(rm -rf /)",
    "`reboot`",
    "a; echo pwned",
    "unicode ✓ 世界 😀",
    "line\u2028separator\x85nel",
    "{{ jinja }} {% raw %}",
    "key: value # comment",
    "--- \n...",
    "tab\there",
    "",
]


def hostile_spec(value: str):
    return spec_from({
        "name": "inj",
        "image": {"vendor": "cuda", "tag": "registry.local/inj:1"},
        "nodes": 2,
        "command": ["python", "train.py", value, f"--arg={value}"],
        "env": {"HOSTILE": value},
        "volumes": [{"name": "data", "mount": "/data/" + value.replace("\n", "_").replace("\x85", "_"),
                     "host_path": "/mnt/" + value}],
    })


@pytest.mark.parametrize("value", HOSTILE)
def test_yaml_value_round_trips(value):
    assert yaml.safe_load(f"k: {yaml_value(value)}")["k"] == value
    assert yaml.safe_load(f"k: {yaml_value({'a': [value, 1, None, True]})}")["k"] == {"a": [value, 1, None, True]}


@pytest.mark.parametrize("value", HOSTILE)
def test_kubernetes_render_round_trips_hostile_values(value):
    spec = hostile_spec(value)
    plan = render_plan(spec, load_profile("cuda"), "kubernetes")
    docs = list(yaml.safe_load_all(plan_document(plan, "yaml")))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    c = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][-2:] == [value, f"--arg={value}"]
    assert {e["name"]: e.get("value") for e in c["env"]}["HOSTILE"] == value
    host = {v["name"]: v for v in docs[1]["spec"]["template"]["spec"]["volumes"]}["data"]["hostPath"]["path"]
    assert host == "/mnt/" + value


@pytest.mark.parametrize("value", HOSTILE)
def test_docker_run_line_is_shell_quoted(value):
    spec = hostile_spec(value)
    plan = render_plan(spec, load_profile("cuda"), "docker", cpus=[0, 1])
    for res in plan.resources:
        if res["kind"] != "container":
            continue
        argv = shlex.split(res["docker_run"])
        assert argv[-2:] == [value, f"--arg={value}"]
        assert f"HOSTILE={value}" in argv
        assert res["create"]["command"][-2:] == [value, f"--arg={value}"]


@pytest.mark.parametrize("value", HOSTILE)
def test_local_argv_is_exact(value, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    plan = render_plan(hostile_spec(value), load_profile("cpu"), "local", cpus=[0, 1])
    for agent in plan.resources:
        assert agent["argv"][-2:] == [value, f"--arg={value}"]
        assert agent["env"]["HOSTILE"] == value


@pytest.mark.parametrize("field,value", [
    ("name", "Bad Name"), ("name", "x;rm"), ("name", "a" * 70),
    ("image.tag", "img:1\nRUN evil"), ("image.tag", "img $(x)"), ("image.base", "base\nRUN x"),
    ("env.BAD-NAME", "x"), ("env.A\nB", "x"), ("kubernetes.namespace", "Bad_NS"),
    ("kubernetes.node_selector.zone", "bad value!"), ("image.system_packages", ["curl; rm -rf /"]),
])
def test_invalid_values_are_rejected_naming_the_field(field, value):
    data = {"name": "ok", "command": ["python", "x.py"]}
    node = data
    parts = field.split(".")
    if parts[0] == "env" or (len(parts) == 3):
        pass
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    with pytest.raises(SpecError) as err:
        spec_from(data)
    paths = [p for p, _ in err.value.problems]
    top = parts[0] if parts[0] in ("env",) else ".".join(parts[:2]) if len(parts) > 1 else parts[0]
    assert any(p.startswith(top) for p in paths), paths
