"""A backend registered from the test folder renders and runs through the CLI like the built-in
ones: adding a backend is one package plus one registry line."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from orchestrator import backends
from orchestrator.cli import cli


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setitem(backends.REGISTRY, "toy", "tests.unit.toy")
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "toyrun", "nodes": 2, "image": {"vendor": "cpu"},
                                    "command": ["python", "train.py"]}))
    return spec


def test_a_registered_backend_renders_and_runs_through_the_cli(toy):
    runner = CliRunner()
    rendered = runner.invoke(cli, ["render", str(toy), "-b", "toy", "-o", "json"], catch_exceptions=False)
    assert rendered.exit_code == 0, rendered.output
    plan = json.loads(rendered.output)
    assert plan["backend"] == "toy" and [r["node"] for r in plan["resources"]] == [0, 1]

    submitted = runner.invoke(cli, ["submit", str(toy), "-b", "toy", "--watch"], catch_exceptions=False)
    assert submitted.exit_code == 0, submitted.output
    assert "run toyrun succeeded on attempt 0 at step 3" in submitted.output

    status = runner.invoke(cli, ["status", "toyrun", "-o", "json"], catch_exceptions=False)
    record = json.loads(status.output)
    assert record["backend"] == "toy" and record["status"] == "succeeded"
    assert record["attempts"][0]["last_step"] == 3


def test_an_unregistered_backend_is_a_usage_error(toy):
    backends.REGISTRY.pop("toy")
    result = CliRunner().invoke(cli, ["render", str(toy), "-b", "toy"])
    assert result.exit_code == 2 and "toy" in result.output
