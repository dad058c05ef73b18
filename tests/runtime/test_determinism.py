"""runtime.determinism: the switch a job turns on for a bit-exact resume on a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.runtime import determinism

PROBE = ("import json, os, torch; from orchestrator.runtime import determinism; done = determinism.enable(); "
         "print(json.dumps({'done': done, 'det': torch.are_deterministic_algorithms_enabled(), "
         "'cublas': os.environ.get('CUBLAS_WORKSPACE_CONFIG'), 'bench': torch.backends.cudnn.benchmark, "
         "'cudnn': torch.backends.cudnn.deterministic}))")


def probe(**env: str) -> dict:
    e = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_enable_sets_every_switch() -> None:
    got = probe()
    assert got["det"] is True and got["cudnn"] is True and got["bench"] is False
    assert got["cublas"] == determinism.CUBLAS_WORKSPACE
    assert any("CUBLAS_WORKSPACE_CONFIG" in d for d in got["done"])


def test_a_users_cublas_setting_is_kept() -> None:
    got = probe(CUBLAS_WORKSPACE_CONFIG=":16:8")
    assert got["cublas"] == ":16:8"
    assert not any("CUBLAS_WORKSPACE_CONFIG" in d for d in got["done"])


def test_requested_reads_the_environment() -> None:
    assert determinism.requested({"WMCTL_DETERMINISTIC": "1"})
    assert determinism.requested({"WMCTL_DETERMINISTIC": " True "})
    assert not determinism.requested({"WMCTL_DETERMINISTIC": "0"})
    assert not determinism.requested({})
