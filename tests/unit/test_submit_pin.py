"""A run pinned to a pushed digest stays pinned: the run record keeps the digest, so a watcher
started again after a rebuild (which drops the recorded push) still runs the same bytes."""

from __future__ import annotations

import json

import yaml

from orchestrator.imagebuild import record as build_record
from orchestrator import api
from orchestrator.watchview import EchoView

DIGEST = "sha256:" + "ab" * 32


def test_the_pinned_digest_is_kept_in_the_run_record(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    tag = "registry.example.com/team/tiny:v1"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "tiny", "image": {"vendor": "cpu", "tag": tag},
                                    "command": ["python", "-c", "pass"]}))
    build_record.record_image(spec, "tiny", {"tag": tag, "image_id": "sha256:1",
                                       "repo_digest": f"registry.example.com/team/tiny@{DIGEST}"})
    lines: list[str] = []
    assert api.submit(api.load_job(spec, {}), "local", watch=True, view=EchoView(lines.append)) == 0
    record = json.loads((tmp_path / "home" / "runs" / "tiny" / "run.json").read_text())
    assert record["overrides"]["image.tag"] == f"registry.example.com/team/tiny@{DIGEST}"
    assert record["status"] == "succeeded"
