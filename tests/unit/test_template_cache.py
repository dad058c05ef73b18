"""Compiled templates are kept between processes: a dry run does not compile the Kubernetes
templates again, and a cache folder that cannot be written changes nothing but the speed."""

from __future__ import annotations

import pytest
from jinja2 import Environment

from orchestrator import templating


@pytest.fixture
def fresh_environment(monkeypatch):
    """templating.environment() built anew for the test (and again after it)."""
    templating.environment.cache_clear()
    yield
    templating.environment.cache_clear()


def _objects() -> list:
    from orchestrator.backends.kubernetes.render import render_kubernetes
    from orchestrator.plan import AttemptContext, HostFacts
    from orchestrator.vendors import load_profile

    from .helpers import full_spec

    spec = full_spec()
    plan = render_kubernetes(spec, load_profile(spec.image.vendor), AttemptContext(), HostFacts.of_this_machine())
    return plan.resources


def test_a_second_process_loads_the_compiled_templates_instead_of_compiling(tmp_path, monkeypatch, fresh_environment):
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path))
    first = _objects()
    entries = list((tmp_path / templating.BYTECODE_FOLDER).iterdir())
    assert entries, "rendering wrote no compiled template to the cache folder"

    # As a new process: a new environment, and compiling is now an error.
    templating.environment.cache_clear()

    def no_compile(*args, **kwargs):
        raise AssertionError("a cached template was compiled again")

    monkeypatch.setattr(Environment, "compile", no_compile)
    assert _objects() == first


def test_a_cache_folder_that_cannot_be_made_renders_the_same(tmp_path, monkeypatch, fresh_environment):
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    expected = _objects()
    templating.environment.cache_clear()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(blocker))      # mkdir under a file fails
    assert templating._bytecode_cache() is None
    assert _objects() == expected


def test_a_cache_entry_that_cannot_be_written_is_skipped(tmp_path, monkeypatch, fresh_environment):
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    expected = _objects()
    templating.environment.cache_clear()
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "gone"))
    templating.environment(None)                              # makes its cache folder...
    (tmp_path / "gone" / templating.BYTECODE_FOLDER).rmdir()  # ...which is gone when an entry is written
    assert _objects() == expected
    assert not (tmp_path / "gone" / templating.BYTECODE_FOLDER).exists()
