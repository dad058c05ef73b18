"""`wmctl wheelhouse`: the pip download command line, its platform ladder and Python version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.commands import wheelhouse
from orchestrator.commands.wheelhouse import default_platforms, download_command, host_arch, image_python_version
from orchestrator.errors import BuildError
from orchestrator.resources import images_dir
from orchestrator.runtime.protocol import ENV_VENDOR_PATH

from .simpleindex import CPU_TORCH, CUDA_TORCH, cpu_and_default_indexes
from .test_cli import run_main
from .test_dockerfile import make_wheel

HOST = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_default_ladder_reaches_manylinux2014_and_plain_linux():
    tags = default_platforms("x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    for tag in ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                "linux_x86_64"):
        assert tag in tags
    assert tags.index("manylinux_2_28_x86_64") < tags.index("manylinux2014_x86_64") < tags.index("linux_x86_64")
    arm = default_platforms("aarch64")
    assert "manylinux2014_aarch64" in arm and "linux_aarch64" in arm
    assert not any(t.startswith(("manylinux1", "manylinux2010", "manylinux_2_16")) for t in arm)


def test_download_command_passes_every_platform_and_the_python():
    cmd = download_command(["torch==2.13.0"], Path("/r/requirements.txt"), Path("/wh"), "3.10",
                           ["manylinux_2_28_x86_64", "manylinux2014_x86_64"])
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.10"
    assert cmd[cmd.index("--implementation") + 1] == "cp"
    platforms = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    assert platforms == ["manylinux_2_28_x86_64", "manylinux2014_x86_64"]
    assert cmd[cmd.index("-r") + 1] == "/r/requirements.txt" and cmd[-1] == "torch==2.13.0"


@pytest.mark.timeout(120)
def test_pip_accepts_a_manylinux2014_wheel_with_the_default_ladder(tmp_path):
    """The audit's case, with the real pip and no index: a wheel tagged only manylinux_2_17 /
    manylinux2014 (most of PyPI's binary wheels) is downloadable with the default platforms."""
    found = tmp_path / "found"
    found.mkdir()
    make_wheel(found, "oldglibc", tag="cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64")
    dest = tmp_path / "dest"
    cmd = download_command(["oldglibc"], None, dest, "3.11", default_platforms("x86_64"))
    cmd += ["--no-index", "--find-links", str(found)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in dest.iterdir()] == [
        "oldglibc-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]


@pytest.mark.parametrize("base,python,expected", [
    ("python:3.11-slim-bookworm", "python3", "3.11"),
    ("docker.io/library/python:3.9", "python3", "3.9"),
    ("quay.io/ascend/cann:8.0.rc3-910b-ubuntu22.04-py3.10", "python3", "3.10"),
    ("rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0", "python3", "3.10"),
    ("wmctl-test/base:bookworm-py311-torch2.13.0", "python3", "3.11"),
    ("nvcr.io/nvidia/pytorch:24.12-py3", "/opt/conda/bin/python3.12", "3.12"),
    ("nvcr.io/nvidia/pytorch:24.12-py3", "python", None),
    ("mthreads/pytorch:2.0.0-musa2204", "python", None),
    ("registry.example.com/pytorch-installer-2.4.0:latest", "python3", None),
])
def test_image_python_version_from_profile_or_base(base, python, expected):
    found = image_python_version(base, python)
    assert (found[0] if found else None) == expected


def _spec(tmp_path: Path, base: str, requirements: str = "six\n") -> Path:
    (tmp_path / "requirements.txt").write_text(requirements)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: tiny\nimage: {{vendor: cpu, base: '{base}', requirements: requirements.txt}}\n"
                    "command: [python, train.py]\n")
    return spec


def _run(monkeypatch, tmp_path, *args):
    from orchestrator.cli import cli

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    result = CliRunner().invoke(cli, ["wheelhouse", *args, "--dir", str(tmp_path / "wh")])
    return result, calls


def test_command_uses_the_image_python_and_the_whole_ladder(monkeypatch, tmp_path):
    result, calls = _run(monkeypatch, tmp_path, str(_spec(tmp_path, "python:3.10-slim")), "--no-torch")
    assert result.exit_code == 0, result.output
    (cmd,) = calls
    assert cmd[cmd.index("--python-version") + 1] == "3.10"
    assert "python 3.10, from the base image python:3.10-slim" in result.output
    platforms = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    assert platforms == default_platforms()


def test_command_falls_back_to_this_python_with_a_note(monkeypatch, tmp_path):
    result, calls = _run(monkeypatch, tmp_path, str(_spec(tmp_path, "registry.example.com/team/base:v1")),
                         "--no-torch")
    assert result.exit_code == 0, result.output
    assert calls[0][calls[0].index("--python-version") + 1] == HOST
    assert f"using this machine's ({HOST})" in result.stderr and "--python-version" in result.stderr


def test_explicit_python_and_platform_win(monkeypatch, tmp_path):
    result, calls = _run(monkeypatch, tmp_path, str(_spec(tmp_path, "python:3.10-slim")), "--no-torch",
                         "--python-version", "3.12", "--platform", "manylinux2014_aarch64")
    assert result.exit_code == 0, result.output
    cmd = calls[0]
    assert cmd[cmd.index("--python-version") + 1] == "3.12"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == ["manylinux2014_aarch64"]


def test_requirements_the_build_would_refuse_are_refused_here_too(monkeypatch, tmp_path):
    result, calls = _run(monkeypatch, tmp_path, str(_spec(tmp_path, "python:3.10-slim", "-e ./libs/x\n")),
                         "--no-torch")
    assert isinstance(result.exception, BuildError) and "requirements.txt line 1" in str(result.exception)
    assert calls == []


def test_help_documents_the_default_python():
    from orchestrator.cli import cli

    text = CliRunner().invoke(cli, ["wheelhouse", "--help"]).output
    assert "base image name" in text and "manylinux2014" in text


# ---- the cpu profile's torch index (a local PEP 503 index stands in for download.pytorch.org) ----------

@pytest.fixture
def cpu_indexes(tmp_path, monkeypatch):
    with cpu_and_default_indexes(tmp_path, monkeypatch) as indexes:
        yield indexes


def test_download_command_adds_the_torch_index_beside_pips_own():
    cmd = download_command(["torch==2.13.0"], None, Path("/wh"), "3.11", ["linux_x86_64"],
                           "https://download.pytorch.org/whl/cpu")
    assert cmd[cmd.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "--index-url" not in cmd and "--trusted-host" not in cmd
    assert "--extra-index-url" not in download_command(["torch"], None, Path("/wh"), "3.11", ["linux_x86_64"])
    plain = download_command(["torch"], None, Path("/wh"), "3.11", ["linux_x86_64"], "http://mirror.lan:8080/cpu/")
    assert plain[plain.index("--trusted-host") + 1] == "mirror.lan:8080"


@pytest.mark.timeout(120)
def test_wheelhouse_takes_torch_from_the_profile_index_and_the_rest_from_pips_index(cpu_indexes, tmp_path):
    """The real `wmctl wheelhouse` and the real pip against both indexes: torch is the CPU build,
    from the CPU index; its dependency and the job's requirements come from pip's own index, which
    --index-url would have replaced (six and filelock are not on the CPU index)."""
    pypi, cpu_index = cpu_indexes
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "requirements.txt").write_text("six\n")
    spec = tmp_path / "job" / "job.yaml"
    spec.write_text("name: tiny\nimage: {vendor: cpu, requirements: requirements.txt}\ncommand: [python, train.py]\n")
    from orchestrator.cli import cli

    result = CliRunner().invoke(cli, ["wheelhouse", str(spec), "--dir", str(tmp_path / "wh")])
    assert result.exit_code == 0, result.output
    assert f"torch index (vendor profile cpu): {cpu_index.url}" in result.output
    got = sorted(p.name for p in (tmp_path / "wh").iterdir())
    assert got == sorted([CPU_TORCH, "filelock-3.0-py3-none-any.whl", "numpy-2.0.0-py3-none-any.whl",
                          "six-1.16.0-py3-none-any.whl"]), got
    assert cpu_index.served(CPU_TORCH) and not pypi.served(CUDA_TORCH)
    for name in ("six-1.16.0-py3-none-any.whl", "filelock-3.0-py3-none-any.whl", "numpy-2.0.0-py3-none-any.whl"):
        assert pypi.served(name), (name, pypi.requests)


def _bad_profile(tmp_path: Path, monkeypatch, value: str) -> Path:
    profiles = tmp_path / "profiles"
    profiles.mkdir(exist_ok=True)
    text = (images_dir() / "cpu.yaml").read_text()
    (profiles / "cpu.yaml").write_text(text.replace("https://download.pytorch.org/whl/cpu", value))
    monkeypatch.setenv(ENV_VENDOR_PATH, str(profiles))
    return _spec(tmp_path, "python:3.11-slim")


@pytest.mark.parametrize("value,words", [
    ("ftp://download.pytorch.org/whl/cpu", "not an http(s) URL"),
    ("download.pytorch.org/whl/cpu", "not an http(s) URL"),
    ("'https://download.pytorch.org/whl/cpu --index-url https://evil.example'", "without spaces"),
    ("https://user:s3cret@mirror.example/cpu", "credentials"),
    ("https://mirror.example:99999/cpu", "not a URL"),
    ("'https://'", "not an http(s) URL with a host"),
    ("[https://download.pytorch.org/whl/cpu]", "torch_index_url"),
])
@pytest.mark.parametrize("command", ["wheelhouse", "build-image"])
def test_a_bad_torch_index_url_is_refused_naming_the_field(tmp_path, monkeypatch, capsys, value, words, command):
    spec = _bad_profile(tmp_path, monkeypatch, value)
    args = [command, str(spec)] + (["--dry-run"] if command == "build-image" else ["--dir", str(tmp_path / "wh")])
    code, out, err = run_main(args, capsys)
    assert code == 2, out + err     # README: 2, an invalid profile; nothing was done
    assert "torch_index_url" in err and words in err, err
    assert "Traceback" not in err and "s3cret" not in out + err and out == ""
    assert not (tmp_path / "wh").exists()


@pytest.mark.timeout(120)
def test_the_rendered_torch_step_installs_the_cpu_build_from_the_index(cpu_indexes, tmp_path):
    """The torch step's exact pip argv from the rendered Dockerfile, run by the real pip against
    the two indexes (no engine: --dry-run --report, for the image's Python and platform): it
    resolves the CPU torch from the CPU index and torch's dependency from pip's own index."""
    import json

    from .test_dockerfile import plan_for, write_spec

    pypi, cpu_index = cpu_indexes
    plan = plan_for(write_spec(tmp_path / "job"))
    runs = [json.loads(line[4:]) for line in plan.dockerfile.splitlines()
            if line.startswith("RUN [") and "torch==2.13.0" in line]
    (argv,) = runs
    assert argv[:4] == ["python3", "-m", "pip", "install"] and cpu_index.url in argv
    report = tmp_path / "report.json"
    cmd = [sys.executable, *argv[1:], "--dry-run", "--ignore-installed", "--report", str(report),
           "--only-binary=:all:", "--python-version", "3.11", "--platform", f"manylinux_2_28_{host_arch()}",
           "--target", str(tmp_path / "target")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    chosen = {item["metadata"]["name"]: (item["metadata"]["version"], item["download_info"]["url"])
              for item in json.loads(report.read_text())["install"]}
    assert set(chosen) == {"torch", "filelock", "numpy"}, chosen
    assert chosen["torch"][0] == "2.13.0+cpu" and chosen["torch"][1].startswith(cpu_index.url.removesuffix("simple/"))
    assert chosen["filelock"][1].startswith(pypi.url.removesuffix("simple/"))
