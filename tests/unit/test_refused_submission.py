"""A submission refused before anything ran leaves nothing that blocks its name (issue 22, item 4).

A Docker spec refused for a missing image ("nothing was submitted") used to keep a failed record
whose attempt 0 was `not_submitted`; the corrected resubmission under the same name was then
refused ("a run named ... already exists"). The real-engine half (the image refused before any
record is written) is tests/docker/test_docker_faults.py's."""

from __future__ import annotations

import time

import pytest

from orchestrator import api, backends
from orchestrator.errors import RunExists
from orchestrator.state import AttemptRecord, LocalRunStore, RunRecord

from .helpers import full_spec


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def recorded(run: str, *outcomes: str | None, status: str = "failed") -> LocalRunStore:
    spec = full_spec("cpu")
    record = RunRecord(run=run, backend="local", spec_path="", overrides={}, spec_hash=spec.spec_hash(),
                       auto_resume=False, spec=spec.to_dict(), source_dir=str(spec.source_dir))
    record.status = status
    for i, outcome in enumerate(outcomes):
        record.attempts.append(AttemptRecord(attempt=i, submitted_at=time.time(), outcome=outcome))
    store = LocalRunStore(run)
    store.save(record)
    return store


def test_a_run_that_never_submitted_an_attempt_does_not_hold_its_name(home):
    lines: list[str] = []
    engine = backends.create("local")
    for run, outcomes in (("never", ("not_submitted",)), ("nothing", ())):
        store = recorded(run, *outcomes)
        api._clear_the_name(store, engine, lines.append, replace=False)
        assert not store.exists(), run
    assert any("never started" in line for line in lines), lines


def test_a_run_that_ran_still_holds_its_name_until_replaced(home):
    engine = backends.create("local")
    store = recorded("ran", "app_error")
    with pytest.raises(RunExists):
        api._clear_the_name(store, engine, lambda _: None, replace=False)
    assert store.exists()
    store = recorded("retried", "node_lost", "not_submitted")   # attempt 0 ran: the run is real
    with pytest.raises(RunExists):
        api._clear_the_name(store, engine, lambda _: None, replace=False)
