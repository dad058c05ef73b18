"""Hostile and unusual input, through the CLI a user runs (`wmctl submit`): each is refused with
exit 2, one short message that names the field, no traceback, and nothing submitted (no run
record, no attempt). Where the check is missed the case fails loudly rather than quietly: the
container backends point at engines that cannot be reached (exit 5), and the local backend would
record a run.

Also here: what a printed plan means to a YAML 1.2 reader (kubectl), duplicate keys, alias bombs,
and credentials in git remotes."""

from __future__ import annotations

import pytest

from orchestrator.imagebuild.context import strip_userinfo
from orchestrator.yamlsafe import MAX_VALUES

from .test_cli import run_main

MAX_MESSAGE = 2048
BASE = "name: wm\nimage: {vendor: cpu, context: ., tag: 'reg.io/team/wm:1'}\ncommand: [python, train.py]\n"
UNREACHABLE = {"DOCKER_HOST": "tcp://127.0.0.1:1", "KUBECONFIG": "/nonexistent/kubeconfig"}


def bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(f"  {line}" for line in lines)


CASES = {
    # (spec text, backend, a piece of the field path the message must name)
    "duplicate-key": (BASE + "nodes: 1\nnodes: 3\n", "local", "given twice"),
    "alias-bomb-in-env": (BASE + "env:\n" + bomb(), "local", "through aliases"),
    "deep-nesting": (BASE + "env: " + "[" * 5000 + "]" * 5000 + "\n", "local", "(file)"),
    "heartbeat-zero": (BASE + "restart: {heartbeat_timeout: 0s}\n", "local", "restart.heartbeat_timeout"),
    "accelerators-on-cpu": (BASE + "accelerators_per_node: 8\n", "local", "accelerators_per_node"),
    "empty-program": ("name: wm\nimage: {vendor: cpu, context: .}\ncommand: ['']\n", "local", "command[0]"),
    "missing-context-local": ("name: wm\nimage: {vendor: cpu, context: nothere}\ncommand: [python, t.py]\n",
                              "local", "image.context"),
    "context-is-a-file": ("name: wm\nimage: {vendor: cpu, context: train.py}\ncommand: [python, t.py]\n",
                          "local", "image.context"),
    "context-name-too-long": ("name: wm\nimage: {vendor: cpu, context: " + "c" * 300 + "}\ncommand: [python, t]\n",
                              "local", "image.context"),
    "nfs-mount-options": (BASE + "volumes: [{name: s, mount: /s, nfs: {server: '1.2.3.4,rw,exec,suid', "
                          "path: /x}}]\n", "docker", "nfs.server"),
    "nfs-server-newline": (BASE + 'volumes: [{name: s, mount: /s, nfs: {server: "a\\nb", path: /x}}]\n',
                           "docker", "nfs.server"),
    "mount-newline": (BASE + 'volumes: [{name: s, mount: "/s\\nx", host_path: /tmp}]\n', "docker",
                      "volumes[0].mount"),
    "mount-colon": (BASE + "volumes: [{name: s, mount: '/s:/etc', host_path: /tmp}]\n", "docker",
                    "volumes[0].mount"),
    "workdir-newline": (BASE + 'workdir: "/w\\nRUN x"\n', "docker", "workdir"),
    "pvc-name": (BASE + "volumes: [{name: s, mount: /s, pvc: 'Bad Name/../x'}]\n", "kubernetes",
                 "volumes[0].pvc"),
    "pull-secret-name": (BASE + "kubernetes: {image_pull_secrets: ['Bad Secret!']}\n", "kubernetes",
                         "image_pull_secrets[0]"),
    "upper-case-repository": (BASE.replace("team/wm", "Team/WM"), "kubernetes", "image.tag"),
    "tag-300-characters": (BASE.replace("wm:1", "wm:" + "a" * 300), "kubernetes", "image.tag"),
    "bad-digest": (BASE.replace("wm:1", "wm@sha256:bad"), "kubernetes", "image.tag"),
    "short-sha256": (BASE.replace("wm:1", "wm@sha256:" + "ab" * 20), "kubernetes", "image.tag"),
    "annotations-300-KiB": (BASE + "kubernetes: {annotations: {big: '" + "a" * 300 * 1024 + "'}}\n", "kubernetes",
                            "kubernetes.annotations"),
    "value-300-KiB-in-tag": (BASE.replace("wm:1", "wm:" + "x" * 300 * 1024), "docker", "image.tag"),
    "string-aliased-200-times": ("env: {BIG: &s '" + "x" * 100_000 + "'}\n"
                                 + BASE.replace("command: [python, train.py]", "command: [python" + ", *s" * 200 + "]"),
                                 "docker", "through aliases"),
    "thousands-of-unknown-keys": (BASE + "".join(f"bogus{i}: 1\n" for i in range(3000)), "local", "bogus0"),
}


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """The exit code and everything printed (stdout and stderr together)."""
    code, out, err = run_main(argv, capsys)
    return code, out + err


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_refused_in_one_short_message(case, tmp_path, monkeypatch, capsys):
    text, backend, names = CASES[case]
    home = tmp_path / "home"
    monkeypatch.setenv("WMCTL_HOME", str(home))
    for key, value in UNREACHABLE.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(text, encoding="utf-8")
    code, output = _run(["submit", str(spec), "-b", backend], capsys)
    assert code == 2, output[-600:]
    assert "Traceback" not in output
    assert len(output.encode()) < MAX_MESSAGE, f"{len(output)} characters"
    assert names in output, output
    assert not (home / "runs").exists() or not any((home / "runs").iterdir()), "a run was recorded"


def test_every_problem_is_cut_to_a_short_excerpt(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\ncommand: [python, t.py]\n" + "".join(f"k{'x' * 500}{i}: 1\n" for i in range(50)))
    code, output = _run(["render", str(spec), "-b", "local"], capsys)
    assert code == 2 and len(output) < MAX_MESSAGE
    assert "more characters]" in output and "more problem(s)" in output


def test_aliases_within_the_bound_still_load(tmp_path, capsys, monkeypatch):
    # Anchors are a real YAML feature (one env block for two fields): only expansion is bounded.
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\ncommand: &cmd [python, t.py]\nimage: {context: .}\n"
                    "env: &e {A: '1'}\nlocal: {}\n", encoding="utf-8")
    code, output = _run(["render", str(spec), "-b", "local"], capsys)
    assert code == 0, output
    assert MAX_VALUES >= 10_000


def test_render_into_an_unwritable_folder_is_an_option_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\ncommand: [python, t.py]\n", encoding="utf-8")
    code, output = _run(["render", str(spec), "-b", "local", "--out", "/proc/wmctl-cannot-write"], capsys)
    assert code == 2 and "--out" in output and "Traceback" not in output


def test_wmctl_home_that_is_a_file_is_named(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("WMCTL_HOME", str(home))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\nimage: {context: .}\ncommand: [python, t.py]\n", encoding="utf-8")
    for argv in (["submit", str(spec)], ["list"], ["status", "wm"]):
        code, output = _run(argv, capsys)
        assert code == 2 and "WMCTL_HOME" in output and "Traceback" not in output, (argv, output)


def test_secret_looking_env_values_get_a_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\nimage: {context: .}\ncommand: [python, t.py]\n"
                    "env: {HF_TOKEN: hf_abc, WANDB_API_KEY: k, DB_PASSWORD: p, NCCL_DEBUG: WARN, KEYS_DIR: /k}\n")
    code, output = _run(["render", str(spec), "-b", "local"], capsys)
    assert code == 0
    warning = next(line for line in output.splitlines() if "look like credentials" in line)
    assert "HF_TOKEN" in warning and "WANDB_API_KEY" in warning and "DB_PASSWORD" in warning
    assert "NCCL_DEBUG" not in warning and "KEYS_DIR" not in warning


def test_set_and_a_named_flag_the_named_flag_wins(tmp_path, capsys, monkeypatch):
    # docs/spec.md: "--nodes, --image, --vendor and --namespace are applied after every --set".
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: wm\nimage: {context: .}\ncommand: [python, t.py]\n", encoding="utf-8")
    code, output = _run(["render", str(spec), "-b", "local", "--set", "nodes=2", "--nodes", "3", "-o", "json"],
                        capsys)
    assert code == 0 and '"--nnodes=3"' in output and "--nnodes=2" not in output


@pytest.mark.parametrize("url,clean", [
    ("https://user:tok@host/x.git", "https://host/x.git"),
    ("HTTPS://user:tok@host/x.git", "HTTPS://host/x.git"),
    ("https://user:p@ss@host/x.git", "https://host/x.git"),
    ("Git+SSH://git:secret@host:22/x", "Git+SSH://host:22/x"),
    ("https://host/path@v1", "https://host/path@v1"),
    ("git@github.com:org/x.git", "git@github.com:org/x.git"),
])
def test_credentials_are_scrubbed_from_git_remotes(url, clean):
    assert strip_userinfo(url) == clean
    assert "tok" not in strip_userinfo(url) and "secret" not in strip_userinfo(url)



# Strings a YAML 1.1 reader (PyYAML) or a YAML 1.2 reader (kubectl's, ruamel) reads as another type.
TYPED_LOOKING = ["1e-4", "1e3", "0o17", "0x1F", "1_000", "12:30", "yes", "no", "on", "off", "null", "~", "true",
                 "False", ".inf", "-.inf", ".nan", "+1", "-2.5", ".5", "1.", "0b101", "007", "", "2026-12-04",
                 "=", "<<", "y", "Y", "n", "N", "On", "OFF"]
# go-yaml v2's resolve.go bool table (sigs.k8s.io/yaml, kubectl's reader, is built on it): neither
# PyYAML nor ruamel reads these as booleans, so the parse below cannot catch them; needs_quotes must.
GO_YAML_V2_BOOLS = ["y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE",
                    "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"]


def test_go_yaml_v2_booleans_are_quoted():
    from orchestrator.serialize import dump, needs_quotes
    assert all(needs_quotes(word) for word in GO_YAML_V2_BOOLS)
    assert dump({"args": GO_YAML_V2_BOOLS}, "yaml").count("'") == 2 * len(GO_YAML_V2_BOOLS)


def test_long_lines_are_never_folded():
    from orchestrator.serialize import dump
    line = "docker run " + " ".join(f"-e K{i}=v{i}" for i in range(400))
    assert dump({"docker_run": line}, "yaml") == f"docker_run: {line}\n"


@pytest.mark.parametrize("reader", ["yaml-1.1", "yaml-1.2"])
@pytest.mark.parametrize("backend", ["kubernetes", "docker"])
def test_printed_plans_keep_every_string_a_string(reader, backend, tmp_path, capsys, monkeypatch):
    """`--lr 1e-4` rendered unquoted reached the pod as the number 0.0001 through kubectl."""
    import json

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE.replace("command: [python, train.py]", "command: " + json.dumps(["python", *TYPED_LOOKING]))
                    + "env: " + json.dumps({f"V{i}": v for i, v in enumerate(TYPED_LOOKING)}) + "\n")
    code, output = _run(["render", str(spec), "-b", backend], capsys)
    assert code == 0, output
    if reader == "yaml-1.1":
        import yaml
        docs = [d for d in yaml.safe_load_all(output) if d]
    else:
        from ruamel.yaml import YAML
        docs = [d for d in YAML(typ="safe", pure=True).load_all(output) if d]
    if backend == "kubernetes":
        container = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
        argv, env = container["command"], {e["name"]: e.get("value") for e in container["env"]}
    else:
        create = next(r for r in docs[0]["resources"] if r["kind"] == "container")["create"]
        argv, env = create["command"], create["environment"]
    assert argv[-len(TYPED_LOOKING):] == TYPED_LOOKING
    assert [env[f"V{i}"] for i in range(len(TYPED_LOOKING))] == TYPED_LOOKING
    assert all(isinstance(a, str) for a in argv)

