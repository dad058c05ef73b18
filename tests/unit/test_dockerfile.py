"""The rendered Dockerfile and build plan (no engine): layer order, offline mode, injection, .dockerignore."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator.imagebuild.context import scan_context, strip_userinfo
from orchestrator.imagebuild.dockerfile import DockerfileInputs, render_dockerfile
from orchestrator.imagebuild.ignore import is_ignored, parse_dockerignore
from orchestrator.imagebuild.plan import context_summary, plan_build
from orchestrator.imagebuild.quoting import dq
from orchestrator.errors import BuildError, WmctlError
from orchestrator.specload import load_spec
from orchestrator.vendors import available_profiles, load_profile

REPO = Path(__file__).resolve().parents[2]
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "LABEL"}

HOSTILE = [
    'a" b',
    "$(id)",
    "`id`",
    "x; RUN touch /pwned",
    "ünï cødé ✓",
    "back\\slash\\",
    "${HOME}",
    "'single' \"double\"",
]
HOSTILE_MULTILINE = [
    "x\nRUN touch /pwned",
    "x\r\nRUN touch /pwned",
    "x\u2028RUN touch /pwned",
    "x\u0085RUN touch /pwned",
    "tab\there",
]


def write_spec(root: Path, image_extra: str = "", name: str = "tiny", requirements: str | None = "requirements.txt"):
    root.mkdir(parents=True, exist_ok=True)
    if requirements:
        (root / requirements).write_text("numpy\n")
    (root / "train.py").write_text("print(1)\n")
    req_line = f"  requirements: {json.dumps(requirements)}\n" if requirements else ""
    (root / "job.yaml").write_text(
        f"name: {name}\nimage:\n  vendor: cpu\n  base: wmctl-test/base:x\n{req_line}{image_extra}"
        "command: [python, train.py]\n")
    return root / "job.yaml"


def make_wheel(folder: Path, name: str, version: str = "1.0", requires: tuple[str, ...] | list[str] = (),
               tag: str = "py3-none-any", init: str = "") -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) that pip can read; ``init`` is its
    package's ``__init__.py``."""
    import zipfile

    path = folder / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    wheel = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", init)
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", wheel)
        zf.writestr(f"{info}/RECORD", "")
    return path


def plan_for(spec_path: Path, profile=None, **kwargs):
    spec = load_spec(spec_path)
    profile = profile or load_profile(spec.image.vendor)
    kwargs.setdefault("source", {"source": "https://example.com/repo.git", "revision": "abc123"})
    kwargs.setdefault("created", "2026-01-01T00:00:00Z")
    return plan_build(spec, profile, wheel_name="wmctl-0.1.0-py3-none-any.whl", wheel_fingerprint="f" * 64,
                      wmctl_version="0.1.0", **kwargs)


def instructions(text: str) -> list[str]:
    """Parse like Docker: every line is blank, a comment, a known instruction or a continuation."""
    out = []
    continued = False
    for line in text.split("\n"):
        stripped = line.strip()
        if continued:
            continued = line.endswith("\\")
            continue
        if not stripped or stripped.startswith("#"):
            continue
        word = stripped.split(None, 1)[0]
        assert word in INSTRUCTIONS, f"unexpected line {line!r}"
        out.append(word)
        continued = line.endswith("\\")
    return out


def undq(word: str) -> str:
    """Read a double-quoted Dockerfile word back (\\ escapes the next character)."""
    assert word[0] == '"' and word[-1] == '"'
    out, i, body = [], 0, word[1:-1]
    while i < len(body):
        if body[i] == "\\":
            i += 1
        else:
            assert body[i] != '"', f"unescaped quote in {word!r}"
        out.append(body[i])
        i += 1
    return "".join(out)


# ---- order and content ----------------------------------------------------------------------------

def test_layer_order_dependencies_before_code(tmp_path):
    plan = plan_for(write_spec(tmp_path / "job"))
    lines = [ln for ln in plan.dockerfile.splitlines() if ln and not ln.startswith((" ", "#"))]

    def at(pred):
        found = [i for i, ln in enumerate(lines) if pred(ln)]
        assert found, plan.dockerfile
        return found[0]
    frm = at(lambda ln: ln.startswith("FROM "))
    torch = at(lambda ln: ln.startswith("RUN ") and "torch==2.13.0" in ln)
    req_copy = at(lambda ln: ln.startswith("COPY ") and "wmctl/req/" in ln)
    req_run = at(lambda ln: ln.startswith("RUN ") and "/tmp/wmctl/req/requirements.txt" in ln)
    wheel_copy = at(lambda ln: ln.startswith("COPY ") and "wmctl/wheels/" in ln)
    wheel_run = at(lambda ln: ln.startswith("RUN ") and "--no-deps" in ln)
    workdir = at(lambda ln: ln.startswith("WORKDIR "))
    code = at(lambda ln: ln.startswith("COPY ") and '"src/"' in ln)
    label = at(lambda ln: ln.startswith("LABEL "))
    assert frm == 0
    assert frm < torch < req_copy < req_run < wheel_copy < wheel_run < workdir < label < code
    # Only the requirements file is copied before the dependency install, not the code.
    assert sum(1 for ln in lines if ln.startswith("COPY ")) == 3
    # The code is the last step: a code change runs that one step and no other.
    assert instructions(plan.dockerfile)[-1] == "COPY"


def test_the_dependency_image_and_the_jobs_layers(tmp_path):
    from orchestrator.imagebuild.dockerfile import DEPS_SPLIT

    spec = write_spec(tmp_path / "job")
    plan = plan_for(spec)
    deps, code = plan.deps_dockerfile, plan.code_dockerfile
    assert plan.dockerfile.count(DEPS_SPLIT) == 1
    # Everything but the labels and the code makes the dependency image...
    assert instructions(deps)[-1] == "WORKDIR" and "LABEL" not in instructions(deps)
    assert '"src/"' not in deps and "torch==" in deps and "/tmp/wmctl/req/requirements.txt" in deps
    # ...and the job's layers are built FROM it: labels, then the code.
    assert instructions(code) == ["FROM", "LABEL", "COPY"]
    assert code.startswith(f"FROM {plan.deps_tag}\n") and plan.deps_tag.startswith("wmctl/tiny:wmctl-deps-")
    assert deps + code.split("\n", 1)[1] == plan.dockerfile
    # A code change keeps the dependency image; a requirement, the base's id or a build arg does not.
    (tmp_path / "job" / "train.py").write_text("print(2)\n")
    again = plan_for(spec)
    assert again.deps_tag == plan.deps_tag and again.content_tag != plan.content_tag
    (tmp_path / "job" / "requirements.txt").write_text("numpy\nsix\n")
    assert plan_for(spec).deps_tag != plan.deps_tag
    assert plan_for(spec, base_image_id="sha256:" + "1" * 64).deps_tag != again.deps_tag
    assert plan_for(spec, build_args={"X": "1"}).deps_tag != plan_for(spec, build_args={"X": "2"}).deps_tag


def test_labels_do_not_change_with_the_code_or_the_clock(tmp_path, monkeypatch):
    # The LABEL step comes before the code: a build time or a content digest in it would make it
    # run again on every code change, a second uncached step beside the code's COPY.
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    spec = write_spec(tmp_path / "job")
    first = plan_for(spec, created=None)
    (tmp_path / "job" / "train.py").write_text("print(2)\n")
    second = plan_for(spec, created=None)
    assert first.digest != second.digest
    label_lines = [[ln for ln in p.dockerfile.splitlines() if ln.startswith(("LABEL", "      \""))]
                   for p in (first, second)]
    assert label_lines[0] and label_lines[0] == label_lines[1]
    assert "org.opencontainers.image.created" not in first.labels
    assert second.digest[:12] not in second.dockerfile
    # SOURCE_DATE_EPOCH pins the created label (reproducible builds): the same on every build.
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    assert plan_for(spec, created=None).labels["org.opencontainers.image.created"] == "2026-01-01T00:00:00Z"


def test_runtime_wheel_installed_without_dependencies_and_checked(tmp_path):
    text = plan_for(write_spec(tmp_path / "job")).dockerfile
    run = next(ln for ln in text.splitlines() if ln.startswith("RUN ") and "wmctl-0.1.0-py3-none-any.whl" in ln)
    argv = json.loads(run[4:])
    assert argv[:4] == ["python3", "-m", "pip", "install"]
    assert "--no-deps" in argv and "--no-index" in argv
    assert 'ENV PYTHONUNBUFFERED="1" PIP_NO_CACHE_DIR="1"' in text
    assert any("wmctl-bind" in ln for ln in text.splitlines() if ln.startswith("RUN "))


def test_labels_oci_and_wmctl(tmp_path):
    plan = plan_for(write_spec(tmp_path / "job"))
    assert plan.labels["org.opencontainers.image.source"] == "https://example.com/repo.git"
    assert plan.labels["org.opencontainers.image.revision"] == "abc123"
    assert plan.labels["org.opencontainers.image.created"] == "2026-01-01T00:00:00Z"
    assert plan.labels["io.wmctl.vendor"] == "cpu"
    assert plan.labels["io.wmctl.version"] == "0.1.0"
    assert len(plan.labels["io.wmctl.spec-hash"]) == 12
    for key, value in plan.labels.items():
        assert f"{dq(key)}={dq(value)}" in plan.dockerfile


def test_offline_mode_every_pip_reads_only_the_wheelhouse(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"x")
    plan = plan_for(write_spec(tmp_path / "job"), wheelhouse=wh)
    lines = plan.dockerfile.splitlines()
    pip_runs = [json.loads(ln[4:]) for ln in lines if ln.startswith("RUN [") and '"pip"' in ln]
    assert len(pip_runs) == 3
    for argv in pip_runs:
        assert "--no-index" in argv, argv
        if "--no-deps" not in argv:
            assert argv[argv.index("--find-links") + 1] == "/tmp/wmctl/wheelhouse/"
    wh_copy = next(i for i, ln in enumerate(lines) if ln.startswith("COPY ") and "wheelhouse" in ln)
    first_pip = next(i for i, ln in enumerate(lines) if ln.startswith("RUN [") and '"pip"' in ln)
    assert wh_copy < first_pip
    assert plan.wheelhouse_files == [("six-1.17.0-py2.py3-none-any.whl", 1)]


def test_online_mode_uses_the_index(tmp_path):
    text = plan_for(write_spec(tmp_path / "job")).dockerfile
    req_run = next(ln for ln in text.splitlines() if ln.startswith("RUN ") and "/tmp/wmctl/req/requirements.txt" in ln)
    assert "--no-index" not in req_run and "wheelhouse" not in text


def _pip_runs(text: str) -> list[list[str]]:
    return [json.loads(ln[4:]) for ln in text.splitlines() if ln.startswith("RUN [") and '"pip"' in ln]


def test_cpu_profile_pip_steps_add_its_torch_index_beside_pips_own(tmp_path):
    profile = load_profile("cpu")
    assert profile.torch_index_url == "https://download.pytorch.org/whl/cpu"
    torch_run, req_run, runtime_run = _pip_runs(plan_for(write_spec(tmp_path / "job")).dockerfile)
    for argv in (torch_run, req_run):     # torchvision in requirements must match the CPU torch too
        assert argv[argv.index("--extra-index-url") + 1] == profile.torch_index_url, argv
        assert "--index-url" not in argv and "--trusted-host" not in argv
    assert torch_run[-2:] == ["torch==2.13.0", "numpy"]
    assert "--extra-index-url" not in runtime_run
    # Offline: only the wheelhouse (filled through the index by `wmctl wheelhouse`); no URL at all.
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"x")
    assert profile.torch_index_url not in plan_for(write_spec(tmp_path / "job"), wheelhouse=wh).dockerfile


def test_a_profile_without_torch_index_renders_no_index_option(tmp_path):
    profile = dataclasses.replace(load_profile("cpu"), torch_index_url=None)
    plan = plan_for(write_spec(tmp_path / "job"), profile=profile)
    assert not any("--extra-index-url" in argv for argv in _pip_runs(plan.dockerfile))
    # The index is part of what the image is: another index, another content digest.
    assert plan.digest != plan_for(write_spec(tmp_path / "job")).digest


@pytest.mark.parametrize("value", ["https://x/cpu --index-url https://evil", "ftp://x/cpu", "https://u:p@x/cpu",
                                   "https://x/cpu\nRUN touch /pwned", "/whl/cpu"])
def test_render_refuses_a_bad_torch_index_url_naming_the_field(value):
    with pytest.raises(BuildError, match="vendor profile cpu torch_index_url"):
        render_dockerfile(_inputs(torch_index_url=value))


def test_a_plain_http_torch_index_is_trusted_so_pip_does_not_skip_it():
    text = render_dockerfile(_inputs(torch_index_url="http://mirror.lan:8080/whl/cpu/?a=$(id)"))
    (torch_run,) = [argv for argv in _pip_runs(text) if "torch" in argv]
    assert torch_run[torch_run.index("--extra-index-url") + 1] == "http://mirror.lan:8080/whl/cpu/?a=$(id)"
    assert torch_run[torch_run.index("--trusted-host") + 1] == "mirror.lan:8080"


def test_offline_rejects_required_system_packages(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "a.whl").write_bytes(b"x")
    spec = write_spec(tmp_path / "job", "  system_packages: [numactl]\n")
    with pytest.raises(BuildError, match="image.system_packages"):
        plan_for(spec, wheelhouse=wh)


def test_system_packages_passed_as_arguments_not_shell(tmp_path):
    spec = write_spec(tmp_path / "job", "  system_packages: [numactl, libgomp1=12.2.0-14]\n")
    profile = dataclasses.replace(load_profile("cpu"), system_packages=["procps"])
    text = plan_for(spec, profile=profile).dockerfile
    run = next(ln for ln in text.splitlines() if "wmctl-apt" in ln)
    argv = json.loads(run[4:])
    assert argv[0:2] == ["/bin/sh", "-c"]
    assert argv[3:] == ["wmctl-apt", "1", "0", "procps", "numactl", "libgomp1=12.2.0-14"]
    assert '"$@"' in argv[2]


@pytest.mark.parametrize("vendor", available_profiles())
def test_every_vendor_profile_renders(tmp_path, vendor):
    spec = write_spec(tmp_path / "job", name="tiny")
    loaded = load_spec(spec, {"image.vendor": vendor, "image.base": None})
    profile = load_profile(vendor)
    plan = plan_build(loaded, profile, wheel_name="wmctl-0.1.0-py3-none-any.whl", wheel_fingerprint="0",
                      wmctl_version="0.1.0", source={"source": "x"}, created="2026-01-01T00:00:00Z")
    ins = instructions(plan.dockerfile)
    assert ins[0] == "FROM" and f"\nFROM {profile.base_image}\n" in plan.dockerfile
    assert f'"io.wmctl.vendor"="{vendor}"' in plan.dockerfile
    for key, value in profile.image_env.items():
        assert f"ENV {key}={dq(value)}" in plan.dockerfile
    if profile.pip_install_torch:
        assert any(all(p in ln for p in profile.torch_packages) for ln in plan.dockerfile.splitlines()
                   if ln.startswith("RUN "))


# ---- injection -------------------------------------------------------------------------------------------

def _inputs(**kw) -> DockerfileInputs:
    base: dict[str, Any] = dict(
        job_name="tiny", vendor="cpu", base="debian:bookworm", python="python3", workdir="/workspace",
        wheel_name="wmctl-0.1.0-py3-none-any.whl", wmctl_version="0.1.0", requirements=True,
        torch_packages=("torch",), labels=(("io.wmctl.job", "tiny"),))
    base.update(kw)
    return DockerfileInputs(**base)


BASELINE = instructions(render_dockerfile(_inputs()))


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_and_label_values_stay_values(value):
    text = render_dockerfile(_inputs(image_env=(("WM_X", value),), labels=(("io.wmctl.job", value),)))
    ins = instructions(text)
    assert ins.count("ENV") == BASELINE.count("ENV") + 1
    assert [i for i in ins if i != "ENV"] == [i for i in BASELINE if i != "ENV"]
    env_line = next(ln for ln in text.splitlines() if ln.startswith("ENV WM_X="))
    assert undq(env_line[len("ENV WM_X="):]) == value
    label_line = next(ln for ln in text.splitlines() if ln.startswith("LABEL "))
    assert undq(label_line.split("=", 1)[1]) == value
    assert "$(" not in text.replace("\\$(", "") and "${HOME}" not in text.replace("\\${HOME}", "")


@pytest.mark.parametrize("value", HOSTILE_MULTILINE)
def test_multiline_values_are_rejected_naming_the_field(value):
    with pytest.raises(BuildError, match=r"image_env\.WM_X"):
        render_dockerfile(_inputs(image_env=(("WM_X", value),)))
    with pytest.raises(BuildError, match="label"):
        render_dockerfile(_inputs(labels=(("io.wmctl.job", value),)))


@pytest.mark.parametrize("value", HOSTILE + HOSTILE_MULTILINE)
def test_hostile_exec_form_values_stay_one_argument(value):
    # torch_packages reach exec-form RUN; a newline is refused, the rest is one JSON argument.
    if any(c in value for c in "\n\r\t\u2028\u0085"):
        with pytest.raises(BuildError, match="torch_packages"):
            render_dockerfile(_inputs(torch_packages=(value,)))
        return
    text = render_dockerfile(_inputs(torch_packages=(value,)))
    assert instructions(text) == BASELINE
    run = next(ln for ln in text.splitlines() if ln.startswith("RUN ") and "--no-cache-dir" in ln)
    assert json.loads(run[4:])[-1] == value
    assert all(ord(c) < 128 for c in run)  # ASCII JSON: no raw separators, quotes escaped


@pytest.mark.parametrize("field,value", [
    ("base", 'debian"\nRUN x'), ("base", "debian:bookworm RUN"), ("base", "ü:1"), ("base", "$(id)"),
    ("workdir", "/work space"), ("workdir", "/w$(id)"), ("workdir", '/w"x'), ("workdir", "relative"),
    ("workdir", "/a/../etc"), ("python", "python3; id"),
])
def test_references_and_paths_are_validated(field, value):
    with pytest.raises(BuildError) as info:
        render_dockerfile(_inputs(**{field: value}))
    assert field in str(info.value) or "python" in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("image.base", 'debian"; RUN x'), ("image.base", "a\nRUN b"), ("image.tag", "x:`id`"),
    ("image.tag", "x y"), ("image.workdir", "/w$(id)"), ("image.requirements", "req\nRUN x.txt"),
])
def test_hostile_spec_fields_are_refused_with_the_field_name(tmp_path, field, value):
    spec_path = write_spec(tmp_path / "job")
    with pytest.raises(WmctlError) as info:
        spec = load_spec(spec_path, {field: value})
        plan_build(spec, load_profile("cpu"), wheel_name="wmctl-0.1.0-py3-none-any.whl", wheel_fingerprint="0",
                   wmctl_version="0.1.0", source={"source": "x"})
    assert field in str(info.value)


def test_hostile_requirements_path_stays_one_exec_form_argument(tmp_path):
    name = "req;$(id)`x`ü 'q\" ${HOME}.txt"
    plan = plan_for(write_spec(tmp_path / "job", requirements=name))
    assert plan.requirements.name == name
    assert instructions(plan.dockerfile).count("COPY") == 3
    # Only a RUN argument (exec form: no shell, no Docker variable expansion); COPY paths are fixed.
    run = next(ln for ln in plan.dockerfile.splitlines() if ln.startswith("RUN ") and '"-r"' in ln)
    assert json.loads(run[4:])[-1] == "/tmp/wmctl/req/" + name
    assert all(ord(c) < 128 for c in run)
    copies = [ln for ln in plan.dockerfile.splitlines() if ln.startswith("COPY ")]
    assert not any("req;" in ln for ln in copies)


def test_build_args_are_declared_and_validated(tmp_path):
    plan = plan_for(write_spec(tmp_path / "job"), build_args={"HTTP_PROXY": "http://p:3128"})
    assert "ARG HTTP_PROXY" in plan.dockerfile.splitlines()
    assert "http://p:3128" not in plan.dockerfile  # the value travels as a build arg, not text
    with pytest.raises(BuildError, match="BAD-NAME"):
        plan_for(write_spec(tmp_path / "job2"), build_args={"BAD-NAME": "x"})
    with pytest.raises(BuildError, match="HTTP_PROXY"):
        plan_for(write_spec(tmp_path / "job3"), build_args={"HTTP_PROXY": "a\nRUN x"})


def test_source_label_drops_credentials():
    assert strip_userinfo("https://user:tok@github.com/x/y.git") == "https://github.com/x/y.git"
    assert strip_userinfo("git@github.com:x/y.git") == "git@github.com:x/y.git"


def test_source_metadata_from_a_real_repository_and_no_git_outside_one(tmp_path, monkeypatch):
    from orchestrator.imagebuild import context

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)

    git("init", "-q")
    git("remote", "add", "origin", "https://user:tok@example.com/team/wm.git")
    (repo / "train.py").write_text("print(1)\n")
    git("add", "train.py")
    git("commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "untracked.txt").write_text("not a change to the commit\n")
    assert context.source_metadata(repo) == {"source": "https://example.com/team/wm.git", "revision": head}
    (repo / "train.py").write_text("print(2)\n")
    assert context.source_metadata(repo)["revision"] == head + "-dirty"

    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.delenv("GIT_WORK_TREE", raising=False)
    assert not any((folder / ".git").exists() for folder in outside.resolve().parents), \
        "pytest's tmp_path lies inside a git work tree here: give it another --basetemp"

    def no_process(*args, **kwargs):
        raise AssertionError("git was started outside a work tree")

    monkeypatch.setattr(context.subprocess, "Popen", no_process)
    assert context.source_metadata(outside) == {"source": outside.resolve().as_uri()}


# ---- .dockerignore and the context -------------------------------------------------------------------------

@pytest.mark.parametrize("patterns,path,ignored", [
    ("*.tmp", "a.tmp", True), ("*.tmp", "sub/a.tmp", False), ("**/*.tmp", "sub/a.tmp", True),
    ("data", "data/x/y.npy", True), ("data/", "data/x", True), ("/data", "data/x", True),
    ("data\n!data/keep.txt", "data/keep.txt", False), ("data\n!data/keep.txt", "data/other", True),
    ("*\n!train.py", "train.py", False), ("*\n!train.py", "model.py", True),
    ("**/cache", "a/b/cache/z", True), ("ca?he", "cache", True), ("[ab].py", "a.py", True),
    ("# comment\n\n", "x", False), ("./build", "build/x", True),
])
def test_dockerignore_matches_docker(patterns, path, ignored):
    assert is_ignored(path, parse_dockerignore(patterns)) is ignored


def test_scan_respects_dockerignore_and_reports_exclusions(tmp_path):
    root = tmp_path / "ctx"
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "big.npy").write_bytes(b"0" * 1000)
    (root / "data" / "keep.txt").write_text("k")
    (root / ".wmctl").mkdir()
    (root / ".wmctl" / "images.json").write_text("{}")
    (root / "train.py").write_text("x")
    (root / ".dockerignore").write_text("data\n!data/keep.txt\n")
    scan = scan_context(root)
    rels = [e.rel for e in scan.files]
    assert rels == [".dockerignore", "data/keep.txt", "train.py"]
    assert "data/" in scan.excluded and ".wmctl/" in scan.excluded
    assert scan.ignore_source == ".dockerignore"


def test_default_dockerignore_drops_git_and_caches(tmp_path):
    root = tmp_path / "ctx"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("x")
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (root / "pkg" / "m.py").write_text("x")
    scan = scan_context(root)
    assert [e.rel for e in scan.files] == ["pkg/m.py"]
    assert scan.ignore_source == "default"


def test_wheelhouse_inside_context_is_not_sent_twice(tmp_path):
    spec = write_spec(tmp_path / "job", "  wheelhouse: wheelhouse\n")
    (tmp_path / "job" / "wheelhouse").mkdir()
    (tmp_path / "job" / "wheelhouse" / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"x")
    plan = plan_for(spec)
    assert all(not e.rel.startswith("wheelhouse") for e in plan.context.entries)
    assert plan.wheelhouse_files and "--no-index" in plan.dockerfile


# ---- tags and the content digest ---------------------------------------------------------------------------

def test_content_digest_follows_content_not_time(tmp_path):
    spec = write_spec(tmp_path / "job")
    a = plan_for(spec, created="2026-01-01T00:00:00Z")
    b = plan_for(spec, created="2027-05-05T00:00:00Z", source={"source": "https://example.com/repo.git",
                                                                  "revision": "def456"})
    assert a.digest == b.digest and a.content_tag == b.content_tag
    (tmp_path / "job" / "train.py").write_text("print(2)\n")
    c = plan_for(spec)
    assert c.digest != a.digest
    (tmp_path / "job" / "requirements.txt").write_text("numpy\nsix\n")
    assert plan_for(spec).digest != c.digest
    assert plan_for(spec, build_args={"X": "1"}).digest != plan_for(spec, build_args={"X": "2"}).digest


def test_tags_user_and_content(tmp_path):
    spec = write_spec(tmp_path / "job", "  tag: registry.example.com:5000/team/wm:v3\n")
    plan = plan_for(spec)
    assert plan.tag == "registry.example.com:5000/team/wm:v3"
    assert plan.content_tag == f"registry.example.com:5000/team/wm:wmctl-{plan.digest[:12]}"
    assert plan_for(spec, tag="other/name").tag == "other/name:latest"
    default = plan_for(write_spec(tmp_path / "job2", name="wm"))
    assert default.tag == "wmctl/wm:latest"
    with pytest.raises(BuildError, match="lowercase"):
        plan_for(spec, tag="Team/WM:v1")


def test_context_summary_lists_files_exclusions_and_tags(tmp_path):
    spec = write_spec(tmp_path / "job")
    (tmp_path / "job" / ".dockerignore").write_text("*.log\n")
    (tmp_path / "job" / "run.log").write_text("x")
    plan = plan_for(spec)
    text = context_summary(plan)
    assert "files: 4" in text and "excluded: 1" in text and "- run.log" in text
    assert plan.tag in text and plan.content_tag in text
    assert "wmctl/wheels/wmctl-0.1.0-py3-none-any.whl" in text


# ---- the command (no engine) --------------------------------------------------------------------------------

def test_dry_run_prints_dockerfile_and_summary_without_docker(tmp_path):
    spec = write_spec(tmp_path / "job")
    code = ("import sys; from orchestrator.cli import main\n"
            "try:\n    main(['build-image', sys.argv[1], '--dry-run', '--build-arg', 'A=1'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = [m for m in ('docker', 'kubernetes', 'torch') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "FROM wmctl-test/base:x" in out.stdout
    assert "# ---- build context ----" in out.stdout and "wmctl/tiny:wmctl-" in out.stdout
    assert "ARG A" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_bad_build_arg_is_a_clear_error(tmp_path):
    from orchestrator.cli import cli

    spec = write_spec(tmp_path / "job")
    result = CliRunner().invoke(cli, ["build-image", str(spec), "--dry-run", "--build-arg", "NOEQUALS"])
    assert result.exit_code != 0
    assert isinstance(result.exception, BuildError) and "--build-arg" in str(result.exception)


def test_missing_wheelhouse_is_a_clear_error(tmp_path):
    with pytest.raises(BuildError, match="not a directory"):
        plan_for(write_spec(tmp_path / "job"), wheelhouse=tmp_path / "nope")


# ---- wmctl's own state never enters the context (audit: record inside the context) -----------------------

def test_record_next_to_a_spec_in_a_subfolder_is_not_sent(tmp_path):
    root = tmp_path / "project"
    (root / "deploy").mkdir(parents=True)
    (root / "train.py").write_text("print(1)\n")
    (root / "requirements.txt").write_text("numpy\n")
    spec = root / "deploy" / "job.yaml"
    spec.write_text("name: tiny\nimage:\n  vendor: cpu\n  base: wmctl-test/base:x\n  context: ..\n"
                    "  requirements: requirements.txt\ncommand: [python, train.py]\n")
    first = plan_for(spec)
    record = root / "deploy" / ".wmctl" / "images.json"
    record.parent.mkdir()
    record.write_text('{"tiny": {"built_at": "1"}}\n')
    second = plan_for(spec)
    assert all(".wmctl" not in e.rel.split("/") for e in second.context.entries)
    assert "deploy/.wmctl/" in second.context.excluded
    record.write_text('{"tiny": {"built_at": "2"}}\n')
    assert plan_for(spec).digest == second.digest == first.digest


# ---- the content digest: base identity and wheel contents (audit 5) ------------------------------------------

def test_base_image_id_is_part_of_the_digest(tmp_path):
    spec = write_spec(tmp_path / "job")
    none = plan_for(spec)
    a = plan_for(spec, base_image_id="sha256:" + "1" * 64)
    b = plan_for(spec, base_image_id="sha256:" + "2" * 64)
    assert len({none.digest, a.digest, b.digest}) == 3
    assert a.content_tag != b.content_tag
    assert "its id is part of the content digest" in context_summary(a)
    assert "its id is not part of this content digest" in context_summary(none)


def test_wheelhouse_digest_follows_wheel_contents_not_name_and_size(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    wheel = wh / "six-1.17.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"a" * 100)
    spec = write_spec(tmp_path / "job")
    before = plan_for(spec, wheelhouse=wh)
    wheel.write_bytes(b"b" * 100)   # rebuilt in place: same name, same size
    assert plan_for(spec, wheelhouse=wh).digest != before.digest


def test_dry_run_summary_says_the_base_id_is_left_out(tmp_path):
    from orchestrator.cli import cli

    result = CliRunner().invoke(cli, ["build-image", str(write_spec(tmp_path / "job")), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "its id is not part of this content digest" in result.output


# ---- requirements files named with -r / -c (audit 7) ---------------------------------------------------------

def _req_job(tmp_path: Path, files: dict[str, str], requirements: str = "requirements.txt") -> Path:
    root = tmp_path / "job"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    spec = write_spec(root, requirements=None)
    spec.write_text(spec.read_text().replace("  base: wmctl-test/base:x\n",
                                             f"  base: wmctl-test/base:x\n  requirements: {requirements}\n"))
    return spec


def test_nested_requirement_and_constraint_files_travel_with_their_paths(tmp_path):
    spec = _req_job(tmp_path, {
        "reqs/requirements.txt": "# top\n-r base.txt\n--constraint=../constraints/pins.txt\n"
                                 "six --hash=sha256:00  # hashed\n-rextra.txt\n--requirem \\\n  more.txt\n",
        "reqs/base.txt": "numpy\n-c ../constraints/pins.txt\n",
        "reqs/extra.txt": "idna\n",
        "reqs/more.txt": "--requirement https://example.com/remote.txt\ncharset-normalizer\n",
        "constraints/pins.txt": "numpy<3\n",
    }, requirements="reqs/requirements.txt")
    plan = plan_for(spec)
    assert [rel for rel, _ in plan.requirements_files] == [
        "reqs/requirements.txt", "reqs/base.txt", "constraints/pins.txt", "reqs/extra.txt", "reqs/more.txt"]
    run = next(ln for ln in plan.dockerfile.splitlines() if ln.startswith("RUN ") and '"-r"' in ln)
    assert json.loads(run[4:])[-2:] == ["-r", "/tmp/wmctl/req/reqs/requirements.txt"]
    assert 'COPY ["wmctl/req/", "/tmp/wmctl/req/"]' in plan.dockerfile
    summary = context_summary(plan)
    assert "named with -r/-c: constraints/pins.txt" in summary
    # A change in a nested file changes the digest.
    before = plan.digest
    (tmp_path / "job" / "constraints" / "pins.txt").write_text("numpy<2\n")
    assert plan_for(spec).digest != before


@pytest.mark.parametrize("line,words", [
    ("-r ../../outside.txt", ["line 1", "outside image.context", "-r ../../outside.txt"]),
    ("-c /etc/constraints.txt", ["line 1", "absolute path", "relative to this file"]),
    ("-r missing.txt", ["line 1", "does not exist"]),
    ("-r ${REQS}/base.txt", ["line 1", "environment variable"]),
    ("./libs/mypkg", ["line 1", "local path", "image.wheelhouse"]),
    ("mypkg @ file:///opt/mypkg", ["line 1", "local path"]),
    ("-e .", ["line 1", "editable install of a local path"]),
    ("--find-links ./wheels", ["line 1", "local folder", "image.wheelhouse"]),
    ("dist/mypkg-1.0-py3-none-any.whl", ["line 1", "local path"]),
])
def test_requirements_the_build_cannot_resolve_are_refused_naming_the_line(tmp_path, line, words):
    (tmp_path / "outside.txt").write_text("six\n")
    spec = _req_job(tmp_path, {"requirements.txt": f"{line}\nnumpy\n"})
    with pytest.raises(BuildError) as info:
        plan_for(spec)
    text = str(info.value)
    assert text.startswith("image.requirements: requirements.txt line 1")
    for word in words:
        assert word in text, text


def test_circular_requirement_files_are_refused(tmp_path):
    spec = _req_job(tmp_path, {"requirements.txt": "-r a.txt\n", "a.txt": "six\n-r requirements.txt\n"})
    with pytest.raises(BuildError, match="a.txt line 2.*includes requirements.txt"):
        plan_for(spec)


@pytest.mark.parametrize("line", [
    "numpy>=1.26; python_version >= '3.10'", "requests[socks]==2.32.3", "torch==2.13.0+cpu",
    "pkg @ https://example.com/pkg-1.0-py3-none-any.whl", "-e git+https://example.com/x.git#egg=x",
    "--index-url https://pypi.example.com/simple", "-f https://example.com/wheels/", "--pre", "",
    "# just a comment",
])
def test_ordinary_requirement_lines_are_accepted(tmp_path, line):
    spec = _req_job(tmp_path, {"requirements.txt": f"{line}\n"})
    assert [rel for rel, _ in plan_for(spec).requirements_files] == ["requirements.txt"]


# ---- offline builds: each wheel group copied just before its step (audit 8) ----------------------------------

def test_offline_torch_wheels_are_copied_apart_from_the_requirements_wheels(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    make_wheel(wh, "torch", "2.13.0", requires=["filelock", "typing-extensions>=4; python_version<'3.13'"])
    make_wheel(wh, "filelock")
    make_wheel(wh, "typing_extensions")
    make_wheel(wh, "numpy")
    make_wheel(wh, "six")
    plan = plan_for(write_spec(tmp_path / "job"), wheelhouse=wh)
    assert plan.torch_wheels == {"torch-2.13.0-py3-none-any.whl", "filelock-1.0-py3-none-any.whl",
                                 "typing_extensions-1.0-py3-none-any.whl", "numpy-1.0-py3-none-any.whl"}
    lines = plan.dockerfile.splitlines()

    def at(pred):
        return next(i for i, ln in enumerate(lines) if pred(ln))
    torch_copy = at(lambda ln: ln.startswith("COPY ") and "wmctl/wheelhouse-torch/" in ln)
    torch_run = at(lambda ln: ln.startswith("RUN ") and "torch==2.13.0" in ln)
    dep_copy = at(lambda ln: ln.startswith(
        f'COPY --from={plan.wheels_images["wmctl/wheelhouse"]} ["/wmctl/wheelhouse/"'))
    req_run = at(lambda ln: ln.startswith("RUN ") and "/tmp/wmctl/req/requirements.txt" in ln)
    assert torch_copy < torch_run < dep_copy < req_run
    # A new requirement's wheel changes only the later layer: the torch part renders the same.
    make_wheel(wh, "idna")
    again = plan_for(write_spec(tmp_path / "job"), wheelhouse=wh)
    assert again.torch_wheels == plan.torch_wheels
    cut = again.dockerfile.index("# Requirements before the code")
    assert again.dockerfile[:cut] == plan.dockerfile[:cut]


def test_offline_without_a_torch_step_copies_the_wheelhouse_right_before_requirements(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    make_wheel(wh, "six")
    profile = dataclasses.replace(load_profile("cpu"), base_has_torch=True)
    plan = plan_for(write_spec(tmp_path / "job"), profile=profile, wheelhouse=wh)
    assert "wheelhouse-torch" not in plan.dockerfile and not plan.torch_wheels
    lines = [ln for ln in plan.dockerfile.splitlines() if ln.startswith(("COPY ", "RUN "))]
    dep_copy = lines.index(
        f'COPY --from={plan.wheels_images["wmctl/wheelhouse"]} ["/wmctl/wheelhouse/", "/tmp/wmctl/wheelhouse/"]')
    assert lines[dep_copy - 1].startswith('COPY ["wmctl/req/"') and "-r" in lines[dep_copy + 1]
