"""``wmctl affinity`` through Click's CliRunner and through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli, main
from orchestrator.errors import WmctlError

from .fakesysfs import two_socket_8gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path):
    two_socket_8gpu(tmp_path)
    return str(tmp_path)


def test_table_for_eight_ranks(root):
    result = CliRunner().invoke(cli, ["affinity", "--nproc", "8", "--mode", "exclusive", "--vendor", "cuda",
                                      "--sysfs-root", root])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("vendor: cuda   devices: 8 (from pci)")
    assert "allowed CPUs: 0-63" in lines[1] and "0: 0-15,32-47" in lines[1]
    assert lines[2] == "mode: exclusive"
    assert lines[3].split() == ["LOCAL_RANK", "DEVICE", "NUMA", "CPUS", "COUNT", "THREADS"]
    assert lines[4].split() == ["0", "0000:0a:00.0", "0", "0-3,32-35", "8", "8"]
    assert lines[11].split() == ["7", "0000:ca:00.0", "1", "28-31,60-63", "8", "8"]


def test_numa_table_shows_each_ranks_thread_share(root):
    result = CliRunner().invoke(cli, ["affinity", "--nproc", "8", "--vendor", "cuda", "--sysfs-root", root])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[4].split() == ["0", "0000:0a:00.0", "0", "0-15,32-47", "32", "8"]


def test_json_output_and_fallback_note(root):
    result = CliRunner().invoke(cli, ["affinity", "--nproc", "3", "--vendor", "cpu", "--sysfs-root", root,
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mode"] == "even" and data["requested"] == "numa"
    # 32 cores of 2 threads split 10/11/11, siblings kept together
    assert [r["cpus"] for r in data["ranks"]] == ["0-9,32-41", "10-20,42-52", "21-31,53-63"]
    assert [r["num_cpus"] for r in data["ranks"]] == [20, 22, 22]
    assert data["notes"] and "splitting the allowed CPUs evenly" in data["notes"][0]


def test_errors_name_the_option_and_the_fix(root):
    runner = CliRunner()
    result = runner.invoke(cli, ["affinity", "--nproc", "65", "--mode", "exclusive", "--vendor", "cpu",
                                 "--sysfs-root", root])
    assert result.exit_code != 0 and isinstance(result.exception, WmctlError)
    assert "65 ranks but only 64 allowed CPUs" in str(result.exception)
    assert "lower nproc_per_node" in str(result.exception)
    result = runner.invoke(cli, ["affinity", "--nproc", "2", "--mode", '{"0": "0-99", "1": "1"}',
                                 "--sysfs-root", root, "--vendor", "cuda"])
    assert isinstance(result.exception, WmctlError) and "outside the allowed CPUs 0-63" in str(result.exception)
    result = runner.invoke(cli, ["affinity", "--nproc", "2", "--vendor", "tpu", "--sysfs-root", root])
    assert isinstance(result.exception, WmctlError) and str(result.exception).startswith("--vendor: unknown vendor")
    result = runner.invoke(cli, ["affinity", "--nproc", "0"])
    assert result.exit_code == 2 and "--nproc" in result.output


def test_real_entry_point_prints_no_traceback(root, capsys):
    with pytest.raises(SystemExit) as info:
        main(["affinity", "--nproc", "65", "--mode", "exclusive", "--vendor", "cpu", "--sysfs-root", root])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --mode/--nproc: 65 ranks") and "Traceback" not in err


def test_this_machine():
    result = CliRunner().invoke(cli, ["affinity", "--nproc", "1", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ranks"][0]["num_cpus"] >= 1


def test_cli_import_loads_no_torch():
    code = ("import sys; import orchestrator.cli, orchestrator.commands.affinity, orchestrator.commands.doctor; "
            "print([m for m in sys.modules if m.split('.')[0] == 'torch'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
