"""Hostile values in names, args, env and paths: rendered output parses back to exactly the
input, shell lines are quoted, and invalid ones are rejected with a clear error."""

from __future__ import annotations

import shlex

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.commands._common import plan_document
from orchestrator.errors import SpecError
from .helpers import render_plan
from orchestrator.backends.kubernetes.render import escape_expansion
from orchestrator.templating import yaml_value
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
    "$(WMCTL_RUN)",
    "$$(HOSTILE) $$ $ $(unclosed $",
    "$世 $😀 $\u2028",
]


def kubelet_expand(text: str, mapping) -> str:
    """The kubelet's $(VAR) expansion of command, args and env values, byte for byte as in
    kubernetes third_party/forked/golang/expansion/expand.go (Expand, tryReadVariableName):
    '$$' -> '$', '$(NAME)' -> mapping(NAME), otherwise '$' plus the next byte read as a rune."""
    data = text.encode("utf-8")
    out = bytearray()
    checkpoint = cursor = 0
    while cursor < len(data):
        if data[cursor] == ord("$") and cursor + 1 < len(data):
            out += data[checkpoint:cursor]
            rest = data[cursor + 1:]
            if rest[0] == ord("$"):
                read, is_var, advance = b"$", False, 1
            elif rest[0] == ord("("):
                close = rest.find(b")", 1)
                read, is_var, advance = (rest[1:close], True, close + 1) if close != -1 else (b"$(", False, 1)
            else:
                read, is_var, advance = b"$" + chr(rest[0]).encode("utf-8"), False, 1
            if is_var:
                read = mapping(read.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
            out += read
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out += data[checkpoint:]
    return out.decode("utf-8", "surrogateescape")


def container_as_started(container: dict) -> tuple[list[str], dict[str, str]]:
    """Command and env as the process sees them: env values expand against the entries before
    them, command and args against the whole env; an unknown name stays as written."""
    env: dict[str, str] = {}

    def lookup(name: str) -> str:
        return env.get(name, f"$({name})")

    for entry in container["env"]:
        env[entry["name"]] = (kubelet_expand(entry["value"], lookup) if "value" in entry
                              else f"<{entry['name']} from the downward API>")
    return [kubelet_expand(a, lookup) for a in container["command"]], env


def path_safe(value: str) -> str:
    """Paths are one line without Docker's volume separators (a newline, ',' or ':' in a mount or
    host path is refused: tests/unit/test_hostile_input.py); every other character must survive."""
    return "".join("_" if ord(c) < 0x20 or c in ",:\x7f\x85" else c for c in value)


def hostile_spec(value: str):
    return spec_from({
        "name": "inj",
        "image": {"vendor": "cuda", "tag": "registry.local/inj:1"},
        "nodes": 2,
        "command": ["python", "train.py", value, f"--arg={value}"],
        "env": {"HOSTILE": value},
        "volumes": [{"name": "data", "mount": "/data/" + path_safe(value), "host_path": "/mnt/" + path_safe(value)}],
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
    command, env = container_as_started(c)
    assert command[-2:] == [value, f"--arg={value}"]
    assert env["HOSTILE"] == value
    host = {v["name"]: v for v in docs[1]["spec"]["template"]["spec"]["volumes"]}["data"]["hostPath"]["path"]
    assert host == "/mnt/" + path_safe(value)


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
    data: dict = {"name": "ok", "command": ["python", "x.py"]}
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


def test_kubelet_expand_matches_documented_behaviour():
    # From the Kubernetes docs: $(VAR) expands, $$ escapes, an unknown name stays as written.
    env = {"MESSAGE": "hello"}.get
    assert kubelet_expand("echo $(MESSAGE)", lambda n: env(n) or f"$({n})") == "echo hello"
    assert kubelet_expand("$$(MESSAGE)", lambda n: "hello") == "$(MESSAGE)"
    assert kubelet_expand("$(NOPE) $x $", lambda n: f"$({n})") == "$(NOPE) $x $"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.one_of(st.sampled_from("$()ab"), st.characters(exclude_categories=["Cs"])), max_size=40))
def test_escape_survives_kubelet_expansion(text):
    # Every name resolves, so any reference the escape missed would change the output.
    assert kubelet_expand(escape_expansion(text), lambda name: "<expanded>") == text


def literal_reference_spec():
    return spec_from({
        "name": "lit", "image": {"vendor": "cuda", "tag": "registry.local/lit:1"}, "nodes": 2,
        "command": ["python", "train.py", "$(WMCTL_RUN)", "--tag=$(HOSTNAME)"],
        "env": {"LITERAL": "$(WMCTL_RUN)", "PRICE": "$$5"},
    })


def test_command_reference_reaches_kubernetes_container_literally():
    plan = render_plan(literal_reference_spec(), load_profile("cuda"), "kubernetes")
    job = next(o for o in plan.resources if o["kind"] == "Job")
    command, env = container_as_started(job["spec"]["template"]["spec"]["containers"][0])
    assert command[-2:] == ["$(WMCTL_RUN)", "--tag=$(HOSTNAME)"]
    assert env["LITERAL"] == "$(WMCTL_RUN)" and env["PRICE"] == "$$5"
    # wmctl's own values are unchanged by expansion too (the endpoint, the run name).
    assert env["WMCTL_RUN"] == "lit" and any(a.startswith("--rdzv-endpoint=lit-a0-0.") for a in command)


def test_command_reference_reaches_docker_container_literally():
    plan = render_plan(literal_reference_spec(), load_profile("cuda"), "docker", cpus=[0, 1])
    containers = [r for r in plan.resources if r["kind"] == "container"]
    assert len(containers) == 2
    for res in containers:
        assert res["create"]["command"][-2:] == ["$(WMCTL_RUN)", "--tag=$(HOSTNAME)"]
        assert res["create"]["environment"]["LITERAL"] == "$(WMCTL_RUN)"
        argv = shlex.split(res["docker_run"])
        assert argv[-2:] == ["$(WMCTL_RUN)", "--tag=$(HOSTNAME)"] and "PRICE=$$5" in argv


def test_command_reference_reaches_local_agent_literally(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    plan = render_plan(literal_reference_spec(), load_profile("cuda"), "local", cpus=[0, 1])
    assert len(plan.resources) == 2
    for agent in plan.resources:
        assert agent["argv"][-2:] == ["$(WMCTL_RUN)", "--tag=$(HOSTNAME)"]
        assert agent["env"]["LITERAL"] == "$(WMCTL_RUN)" and agent["env"]["PRICE"] == "$$5"
