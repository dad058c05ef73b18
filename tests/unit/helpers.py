"""Shared helpers for unit tests: load specs without touching any engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spec import JobSpec, from_dict, load_spec

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent.parent / "golden"


def spec_from(data: dict[str, Any], source_dir: Path = DATA) -> JobSpec:
    return from_dict(data, source_dir=source_dir)


def full_spec(vendor: str = "cuda", **overrides: Any) -> JobSpec:
    return load_spec(DATA / "full.yaml", {"image.vendor": vendor, **overrides})
