"""``wmctl doctor`` through Click's CliRunner and the real entry point."""

from __future__ import annotations

import json

from click.testing import CliRunner

from orchestrator.cli import cli, main
from orchestrator.errors import MachineUnfit, WmctlError

import pytest


def test_cpu_machine_passes():
    result = CliRunner().invoke(cli, ["doctor", "--vendor", "cpu", "--num-workers", "0"])
    assert result.exit_code == 0, result.output
    assert "[ ok  ] devices: vendor cpu" in result.output
    assert result.output.rstrip().endswith("0 error(s), 0 warning(s)")


def test_missing_vendor_module_fails_with_hint():
    result = CliRunner().invoke(cli, ["doctor", "--vendor", "musa", "--expect-devices", "8"])
    assert isinstance(result.exception, MachineUnfit) and result.exception.exit_code == 9
    assert "[error] device-module: torch.musa is not available: torch_musa cannot be imported" in result.output
    assert "hint: install torch_musa" in result.output
    assert "libmthreads_core.so" in result.output
    assert isinstance(result.exception, WmctlError)


def test_shm_minimum_and_json(tmp_path):
    result = CliRunner().invoke(cli, ["doctor", "--vendor", "cpu", "--shm-min", "100t", "--shm-path", str(tmp_path),
                                      "-o", "json"])
    assert isinstance(result.exception, MachineUnfit)
    data = json.loads(result.output)
    shm = next(f for f in data["findings"] if f["check"] == "shm")
    assert shm["level"] == "error" and "below the required 100.0 TiB" in shm["message"]
    assert "resources.shm" in shm["hint"]
    assert data["errors"] == 1


def test_cuda_on_a_cpu_build_reports_device_count():
    result = CliRunner().invoke(cli, ["doctor", "--vendor", "cuda", "--expect-devices", "2", "--num-workers", "0"])
    assert isinstance(result.exception, MachineUnfit)
    assert "torch.cuda.device_count() is 0, expected 2" in result.output


def test_bad_options_are_clear(capsys):
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--shm-min", "lots"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --shm-min: bad size 'lots'") and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["doctor", "--vendor", "tpu"])
    assert "--vendor: unknown vendor 'tpu'" in capsys.readouterr().err
