"""`wmctl completion bash|zsh|fish`: the script bash accepts, and run names completed for RUN
arguments through Click's completion protocol, end to end through the script's own function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent          # where the installed `wmctl` entry point lives


def wmctl_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(REPO),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def recorded(home: Path, *runs: str) -> None:
    for run in runs:
        (home / "runs" / run).mkdir(parents=True)
        (home / "runs" / run / "run.json").write_text("{}")
    (home / "runs" / "no-record").mkdir()     # a folder without a record is no run


def script(shell: str, home: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "completion", shell], env=wmctl_env(home),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_bash_script_is_valid_bash(tmp_path):
    path = tmp_path / "wmctl.bash"
    path.write_text(script("bash", tmp_path))
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "_WMCTL_COMPLETE=bash_complete" in path.read_text()


@pytest.mark.parametrize("shell,marker", [("zsh", "compdef"), ("fish", "complete --no-files --command wmctl")])
def test_zsh_and_fish_scripts_use_the_same_protocol(tmp_path, shell, marker):
    text = script(shell, tmp_path)
    assert f"_WMCTL_COMPLETE={shell}_complete" in text and marker in text


def test_unknown_shell_is_refused_naming_the_choices(tmp_path):
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "completion", "tcsh"], env=wmctl_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bash" in r.stderr and "fish" in r.stderr


@pytest.mark.parametrize("command", ["logs", "status", "describe", "cancel", "watch", "delete", "metrics", "plot"])
def test_run_arguments_complete_recorded_run_names(tmp_path, command):
    recorded(tmp_path, "alpha", "alpine", "beta")
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli"], capture_output=True, text=True, timeout=60,
                       env=wmctl_env(tmp_path, _WMCTL_COMPLETE="bash_complete", COMP_WORDS=f"wmctl {command} al",
                                     COMP_CWORD="2"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["plain,alpha", "plain,alpine"]


def test_the_sourced_bash_function_completes_run_names(tmp_path):
    """What bash does on <TAB>: the function the script defines asks `wmctl` on PATH."""
    recorded(tmp_path, "alpha", "beta")
    path = tmp_path / "wmctl.bash"
    path.write_text(script("bash", tmp_path))
    probe = (f"source {path}; COMP_WORDS=(wmctl logs ''); COMP_CWORD=2; _wmctl_completion wmctl; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"; complete -p wmctl")
    r = subprocess.run(["bash", "-c", probe], env=wmctl_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["alpha", "beta"] and "-F _wmctl_completion wmctl" in lines[2], r.stdout
    # and command names for the first word
    probe = f"source {path}; COMP_WORDS=(wmctl de); COMP_CWORD=1; _wmctl_completion wmctl; echo ${{COMPREPLY[@]}}"
    r = subprocess.run(["bash", "-c", probe], env=wmctl_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["describe", "delete"], r.stdout + r.stderr


def test_every_run_argument_completes_run_names():
    """A new command taking RUN gets completion too (the run_argument decorator)."""
    import click

    from orchestrator.cli import COMMANDS, cli
    from orchestrator.commands._params import complete_runs

    ctx = click.Context(cli)
    for name in COMMANDS:
        for p in cli.get_command(ctx, name).params:
            if isinstance(p, click.Argument) and p.name == "run":
                assert p._custom_shell_complete is complete_runs, f"wmctl {name} RUN does not complete run names"
