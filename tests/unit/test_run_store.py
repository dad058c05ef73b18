"""The run store: the record keeps the spec as submitted, reads older records, and a damaged
record is reported per run, never a crash."""

from __future__ import annotations

import json

import pytest
import yaml
from orchestrator import api
from orchestrator.errors import RecordDamaged
from orchestrator.specload import from_dict
from orchestrator.state import RECORD_VERSION, LocalRunStore, RunRecord

from .helpers import DATA, full_spec
from .test_cli import run_main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_resolved_spec_round_trips_through_the_record(home):
    spec = full_spec("cuda", **{"affinity": {0: "0-15", 1: "16-31"}, "env": {"A": "1", "B": "yes"}})
    record = RunRecord(run=spec.name, backend="local", spec_path=str(DATA / "full.yaml"), overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True, spec=spec.to_dict(),
                       source_dir=str(spec.source_dir))
    store = LocalRunStore(spec.name)
    store.save(record)
    loaded = store.load()
    again = from_dict(json.loads(json.dumps(loaded.spec)), source_dir=spec.source_dir)
    assert again == spec and again.spec_hash() == spec.spec_hash()
    assert loaded.version == RECORD_VERSION


def test_a_watcher_runs_the_spec_as_submitted_not_the_file_as_edited(home, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "edited", "image": {"vendor": "cpu"}, "command": ["python", "a.py"]}))
    job = api.load_job(path)
    record = RunRecord(run="edited", backend="local", spec_path=str(path), overrides={}, spec_hash=job.spec.spec_hash(),
                       auto_resume=True, spec=job.spec.to_dict(), source_dir=str(job.spec.source_dir))
    path.write_text(yaml.safe_dump({"name": "edited", "image": {"vendor": "cpu"}, "command": ["python", "b.py"]}))
    resumed, notes = api.job_of(record)
    assert resumed.spec.command == ["python", "a.py"]
    assert notes and "changed since submission" in notes[0] and "as submitted" in notes[0]


def test_a_record_from_before_resolved_specs_still_loads(home, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "old", "image": {"vendor": "cpu"}, "command": ["python", "a.py"]}))
    store = LocalRunStore("old")
    store.dir.mkdir(parents=True)
    # a version-1 record: no version, no spec, and a key this wmctl does not know
    store.path.write_text(json.dumps({"run": "old", "backend": "local", "spec_path": str(path), "overrides": {},
                                      "spec_hash": "x", "auto_resume": False, "status": "succeeded",
                                      "attempts": [{"attempt": 0, "submitted_at": 1.0, "from_the_future": 1}],
                                      "added_later": True}))
    record = store.load()
    assert record.version == 1 and record.spec is None and record.attempts[0].attempt == 0
    job, _ = api.job_of(record)
    assert job.spec.command == ["python", "a.py"]


def test_a_record_from_a_newer_wmctl_is_refused_with_the_fix(home):
    store = LocalRunStore("new")
    store.dir.mkdir(parents=True)
    store.path.write_text(json.dumps({"run": "new", "backend": "local", "spec_path": "x", "overrides": {},
                                      "spec_hash": "x", "auto_resume": False, "version": RECORD_VERSION + 1}))
    with pytest.raises(RecordDamaged, match="newer wmctl") as err:
        store.load()
    assert "upgrade" in str(err.value)


@pytest.mark.parametrize("content", ["", "{\"run\": \"bad\", \"backe", "[]", "null", "{\"run\": 1}", "\xff\xfe"])
def test_a_damaged_record_is_reported_by_status_and_listed_by_list(home, content, capsys):
    good = LocalRunStore("good")
    good.save(RunRecord(run="good", backend="local", spec_path="x", overrides={}, spec_hash="h", auto_resume=False))
    bad = LocalRunStore("bad")
    bad.dir.mkdir(parents=True)
    bad.path.write_bytes(content.encode("utf-8", "surrogateescape") if content != "\xff\xfe" else b"\xff\xfe")
    code, _, err = run_main(["status", "bad"], capsys)
    assert code == 6 and "damaged" in err and "mv " in err and "Traceback" not in err
    code, out, _ = run_main(["list"], capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["RUN", "BACKEND", "STATUS", "ATTEMPTS", "STEP", "WATCHER"]
    # "good" says running, has no attempt and nobody watches it: the submitter died before submitting.
    assert ["good", "local", "failed", "0", "-", "unwatched"] in rows
    assert any(row[:3] == ["bad", "-", "damaged"] for row in rows)
    assert "None" not in out
    for output in ("json", "yaml"):
        code, out, _ = run_main(["list", "-o", output], capsys)
        assert code == 0
        import yaml
        listed = {r["run"]: r for r in (json.loads(out) if output == "json" else yaml.safe_load(out))}
        assert listed["good"] == {"run": "good", "backend": "local", "status": "failed", "attempts": 0, "step": None,
                                  "watcher": {"state": "unwatched", "pid": None, "host": None, "beat_age_s": None},
                                  "problem": None}
        assert listed["bad"]["watcher"] == {"state": "unknown", "pid": None, "host": None, "beat_age_s": None}
        assert listed["bad"]["status"] == "damaged" and listed["bad"]["problem"] and listed["bad"]["backend"] is None


# ---- the watcher lease ------------------------------------------------------------------------

LEASE_HOLDER = """
import sys, time
from orchestrator.state import LocalRunStore
store = LocalRunStore(sys.argv[1])
store.acquire_watcher()
print("held", flush=True)
time.sleep(60)
"""


def _hold_lease_in_another_process(run, tmp_path):
    import subprocess
    import sys
    script = tmp_path / "hold.py"
    script.write_text(LEASE_HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), run], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_watcher_is_refused_with_who_holds_the_lease(home, tmp_path):
    import os
    import socket
    from orchestrator.errors import WmctlError
    proc = _hold_lease_in_another_process("leased", tmp_path)
    try:
        store = LocalRunStore("leased")
        lease = store.lease()
        assert lease is not None and lease.pid == proc.pid and lease.host == socket.gethostname()
        assert store.watched()
        with pytest.raises(WmctlError) as err:
            store.acquire_watcher()
        assert f"watched by {proc.pid}@{socket.gethostname()} (beat " in err.value.message
        assert lease.pid != os.getpid()
    finally:
        proc.kill()
        proc.wait()
    # The holder died: its flock went with it, so the lease is free, and taking it needs no note.
    store = LocalRunStore("leased")
    assert store.lease() is None and not store.watched()
    assert store.acquire_watcher() is None
    assert (lease := store.lease()) is not None and lease.pid == os.getpid()
    store.release_watcher()
    assert store.lease() is None


def _lease_from_another_host(store, age_s):
    import time
    from orchestrator.state import Lease
    store.dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    store._write_lease(Lease(4242, "other-host", now - 600, now - age_s))


def test_a_live_lease_from_another_host_is_refused_and_a_stale_one_taken_over(home):
    from orchestrator.errors import WmctlError
    from orchestrator.state import LEASE_STALE_S
    store = LocalRunStore("shared")
    _lease_from_another_host(store, age_s=3)
    assert (lease := store.lease()) is not None and lease.host == "other-host"
    with pytest.raises(WmctlError) as err:
        store.acquire_watcher()
    assert "watched by 4242@other-host (beat 3s ago)" in err.value.message
    _lease_from_another_host(store, age_s=LEASE_STALE_S + 5)
    assert store.lease() is None
    note = store.acquire_watcher()
    assert note is not None and "took over the stale lease of 4242@other-host" in note
    store.release_watcher()


def test_the_watcher_beats_its_lease(home, monkeypatch):
    import orchestrator.state as state
    store = LocalRunStore("beating")
    store.acquire_watcher()
    first = store._read_lease()
    monkeypatch.setattr(state, "LEASE_BEAT_S", 0.0)
    store.beat()
    second = store._read_lease()
    assert first is not None and second is not None
    assert second.beat > first.beat and second.started == first.started
    store.release_watcher()
