"""Shared helpers for unit tests: load specs without touching any engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator import backends
from orchestrator.layout import wmctl_home
from orchestrator.plan import AttemptContext, HostFacts, Plan
from orchestrator.spec import JobSpec
from orchestrator.specload import from_dict, load_spec

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent.parent / "golden"


def spec_from(data: dict[str, Any], source_dir: Path = DATA) -> JobSpec:
    return from_dict(data, source_dir=source_dir)


def full_spec(vendor: str = "cuda", **overrides: Any) -> JobSpec:
    return load_spec(DATA / "full.yaml", {"image.vendor": vendor, **overrides})


def render_plan(spec: JobSpec, profile: Any, backend: str, ctx: AttemptContext | None = None, *,
                cpus: list[int] | None = None, python: str | None = None, port: int | None = None) -> Plan[Any]:
    """A backend's pure render for a host with these facts (default: this machine's)."""
    here = HostFacts.of_this_machine()
    host = HostFacts(cpus=tuple(cpus) if cpus is not None else here.cpus, python=python or here.python,
                     home=wmctl_home(), port=port)
    return backends.render_plan(spec, profile, backend, ctx, host)


def check_backend(spec: JobSpec, backend: str, *, auto_resume: bool) -> None:
    """The registry's spec checks for the backend named ``backend``."""
    backends.check(backends.backend_class(backend), spec, auto_resume=auto_resume)
