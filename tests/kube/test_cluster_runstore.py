"""Run state kept in the cluster (WMCTL_RUN_STORE=kubernetes): the ConfigMap RunStore against the
fake API server, then through the real command line from several "machines" (each its own
WMCTL_HOME, sharing nothing but the cluster): a watcher killed mid-attempt is replaced by one
that adopts the attempt (no second submit), a cancel from another machine is obeyed, and a third
machine's `status` reads the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.kubernetes import runstore
from orchestrator.backends.kubernetes.runstore import ClusterRunStore, list_cluster_runs
from orchestrator.errors import RunExists, RunNotFound
from orchestrator.state import LEASE_STALE_S, RunRecord

from tests.procs import Lines

from .simhelpers import backdate_lease
from .test_cli_sim import progress, sim_env

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
NS = "training"


def store(fake_api, run: str = "cs") -> ClusterRunStore:
    return ClusterRunStore(run, api_client=fake_api.client, namespace=NS)


def record(run: str = "cs") -> RunRecord:
    return RunRecord(run=run, backend="kubernetes", spec_path="", overrides={}, spec_hash="h", auto_resume=True,
                     namespace=NS, spec={"name": run})


def test_the_record_round_trips_and_a_missing_run_names_the_namespace(fake_api):
    s = store(fake_api)
    with pytest.raises(RunNotFound, match="namespace training"):
        s.load()
    rec = record()
    s.save(rec)
    rec.status = "succeeded"
    s.save(rec)                                 # a replace, not a second object
    assert store(fake_api).load().status == "succeeded" and store(fake_api).exists()
    assert list_cluster_runs(_core(fake_api), NS) == ["cs"]


def _core(fake_api):
    import kubernetes.client

    return kubernetes.client.CoreV1Api(fake_api.client)


def test_one_watcher_at_a_time_and_a_stale_lease_is_taken_over(fake_api):
    a, b = store(fake_api), store(fake_api)
    assert a.acquire_watcher() is None
    with pytest.raises(RunExists, match="already watched by"):
        b.acquire_watcher()
    assert b.lease() is not None and b.watched()
    backdate_lease(fake_api, "cs", LEASE_STALE_S + 1, namespace=NS)
    assert not b.watched()
    note = b.acquire_watcher()
    assert note and "took over the stale lease" in note
    # a renews on its next beat and finds the lease gone to b: it stops, never supervises beside b
    assert a._lease is not None
    a._lease = a._lease.__class__(a._lease.pid, a._lease.host, a._lease.started, 0.0)
    with pytest.raises(RunExists, match="lost its watcher lease"):
        a.beat()
    b.release_watcher()
    assert store(fake_api).lease() is None


def test_two_candidates_racing_for_a_free_lease_get_one_winner(fake_api):
    """Both read "free", both write: the API server's optimistic concurrency lets one through."""
    winners, losers = [], []
    start = threading.Barrier(4)

    def candidate():
        s = store(fake_api)
        start.wait()
        try:
            s.acquire_watcher()
            winners.append(s)
        except RunExists:
            losers.append(s)

    threads = [threading.Thread(target=candidate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 3


def test_the_first_cancel_intent_stands(fake_api):
    s = store(fake_api)
    assert s.cancel_intent() is None
    first = s.request_cancel(by="alice", graceful=True)
    again = store(fake_api).request_cancel(by="bob", graceful=False)
    assert again == first and (intent := store(fake_api).cancel_intent()) is not None and intent["by"] == "alice"


def test_metrics_are_kept_in_chunks_under_the_configmap_limit(fake_api, monkeypatch):
    monkeypatch.setattr(runstore, "CHUNK_BYTES", 2000)
    s = store(fake_api)
    events = [{"event": "step", "step": i, "loss": 1.0 / (i + 1), "pad": "x" * 100} for i in range(60)]
    for e in events:
        s.append_metric(e)
    s.release_watcher()                                   # a watcher that lets go writes what it kept back
    assert store(fake_api).metrics() == events          # another process reads them all, in order
    chunks = [cm for cm in fake_api.store.list("configmaps", NS)[0]
              if cm["metadata"]["labels"].get("wmctl.io/store") == "metrics"]
    assert len(chunks) > 2 and all(len(cm["data"]["events"]) <= 2000 for cm in chunks)
    # a new watcher goes on filling the last chunk rather than overwriting chunk 0
    more = store(fake_api)
    more.append_metric({"event": "step", "step": 60})
    assert [e["step"] for e in store(fake_api).metrics()] == list(range(61))


class _Booted:
    """The time module, with a monotonic clock that reads ``uptime`` seconds and stands still."""

    def __init__(self, uptime: float):
        self.uptime = uptime

    def monotonic(self) -> float:
        return self.uptime

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_step_events_are_written_together_and_the_story_at_once(fake_api, monkeypatch):
    """Each ConfigMap write rewrites its whole chunk in etcd: step events wait for the next write
    (METRICS_FLUSH_S, a beat, letting go); a checkpoint, a failure, a resume go at once, with
    the steps before them, in order."""
    monkeypatch.setattr(runstore, "METRICS_FLUSH_S", 3600.0)
    # monotonic() counts from boot: the machine here booted 5 s ago (a fresh CI machine, a new
    # node), which must not hold the first event back for METRICS_FLUSH_S.
    monkeypatch.setattr(runstore, "time", _Booted(5.0))
    s = store(fake_api)

    def writes() -> int:
        return len([r for r in fake_api.api.sent() if r["verb"] in ("PUT", "POST") and r["path"].endswith(".m-0")])

    s.append_metric({"event": "step", "step": 0})             # the first goes at once
    for i in range(1, 50):
        s.append_metric({"event": "step", "step": i})
    assert [e["step"] for e in store(fake_api).metrics()] == [0] and writes() == 1
    s.append_metric({"event": "checkpoint", "step": 50})
    assert [e["step"] for e in store(fake_api).metrics()] == list(range(51)) and writes() == 2
    s.append_metric({"event": "step", "step": 51})
    monkeypatch.setattr(runstore, "METRICS_FLUSH_S", 0.0)       # due: the watcher's next beat writes it
    s.beat()
    assert [e["step"] for e in store(fake_api).metrics()] == list(range(52)) and writes() == 3


def test_the_fake_refuses_a_configmap_over_one_mib(fake_api):
    from kubernetes.client import ApiException

    core = _core(fake_api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "full"}, "data": {"x": "y" * (1024 * 1024)}})
    for name, value in (("big", "y" * (1024 * 1024 + 1)), ("wide", "\u00e9" * (512 * 1024 + 1))):  # bytes
        with pytest.raises(ApiException) as err:
            core.create_namespaced_config_map(NS, {"metadata": {"name": name}, "data": {"x": value}})
        assert err.value.body is not None
        assert err.value.status == 422 and "Too long" in err.value.body


def test_a_nodes_log_keeps_its_tail_within_the_limit(fake_api):
    s = store(fake_api)
    lines = [f"line {i} " + "z" * 60 for i in range(20_000)]        # ~1.4 MB
    s.archive_log(0, 1, ("\n".join(lines) + "\n").encode())
    kept = store(fake_api).archived_log(0, 1)
    assert kept is not None
    assert kept[-1] == lines[-1] and kept[0] in lines and len(kept) < len(lines)
    assert store(fake_api).archived_log(0, 0) is None


def test_delete_removes_every_object_of_the_run_and_no_other(fake_api):
    s, other = store(fake_api), store(fake_api, "other")
    s.save(record())
    other.save(record("other"))
    s.acquire_watcher()
    s.request_cancel(by="x", graceful=False)
    s.append_metric({"event": "step", "step": 1})
    s.archive_log(0, 0, b"hi\n")
    s.release_watcher()
    s.delete()
    names = [cm["metadata"]["name"] for cm in fake_api.store.list("configmaps", NS)[0]]
    assert names == ["wmctl-run-other"]


# --- through the command line, from several machines --------------------------------------------

def machine(fake_api, tmp_path: Path, name: str) -> dict[str, str]:
    (tmp_path / name).mkdir(exist_ok=True)
    env = sim_env(fake_api, tmp_path / name)
    env.update(WMCTL_RUN_STORE="kubernetes", WMCTL_RUN_STORE_NAMESPACE=NS, WMCTL_RUN_STORE_CONTEXT="sim")
    return env


def wmctl(env: dict[str, str], *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def test_sim_a_killed_watcher_is_replaced_elsewhere_without_a_second_submit(fake_api, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "icl", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "restart": {"max_attempts": 3, "backoff": "0s"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "kubernetes": {"namespace": NS},
    }))
    cluster = fake_api.cluster
    cluster.script(job="icl-a0", run_seconds=None,
                   logs=[(0.0, progress("start", 0)), (0.1, progress("checkpoint", 10))])
    cluster.start()
    a = machine(fake_api, tmp_path, "a")
    watcher = wmctl(a, "submit", str(spec), "-b", "kubernetes", "--context", "sim", "--auto-resume")

    def jobs():
        return sorted(j["metadata"]["name"] for j in fake_api.store.list("jobs")[0])
    try:
        if not cluster.run_until(lambda: jobs() == ["icl-a0"] and bool(
                [m for m in store(fake_api, "icl").metrics() if m.get("event") == "checkpoint"]), timeout=40):
            os.killpg(watcher.pid, signal.SIGKILL)
            pytest.fail(f"attempt 0 never reported its checkpoint; jobs {jobs()}; watcher:\n"
                        + watcher.communicate(timeout=10)[0][-3000:])
        os.killpg(watcher.pid, signal.SIGKILL)      # the laptop closes
        watcher.communicate(timeout=10)
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)

    b = machine(fake_api, tmp_path, "b")
    # Another machine sees the run and who last watched it, from the cluster alone.
    st = wmctl(b, "status", "icl", "-o", "json").communicate(timeout=60)[0]
    assert json.loads(st)["status"] == "running", st
    # While the dead watcher's lease is fresh, a second watcher is refused (it might be alive).
    refused = wmctl(b, "watch", "icl", "--auto-resume")
    out = refused.communicate(timeout=60)[0]
    assert refused.returncode != 0 and "already watched by" in out, out

    backdate_lease(fake_api, "icl", LEASE_STALE_S + 1, namespace=NS)
    adopter = wmctl({**b, "PYTHONUNBUFFERED": "1"}, "watch", "icl", "--auto-resume")
    said = Lines(adopter)
    try:
        said.wait_for("took over the stale lease", 60)     # the cancel below meets a watched run
        assert adopter.poll() is None, said.text()
        c = machine(fake_api, tmp_path, "c")
        cancel = wmctl(c, "cancel", "icl")
        cout = cancel.communicate(timeout=60)[0]
        assert cancel.returncode == 0, cout
        adopter.wait(timeout=60)
        out = said.text(join=True)
    finally:
        if adopter.poll() is None:
            os.killpg(adopter.pid, signal.SIGKILL)
    assert "took over the stale lease" in out, out
    assert "cancel" in out.lower(), out
    assert jobs() in ([], ["icl-a0"])                             # never an attempt 1
    assert len([r for r in fake_api.api.sent("POST", "") if r["path"].endswith("/jobs")]) == 1
    d = machine(fake_api, tmp_path, "d")
    final = json.loads(wmctl(d, "status", "icl", "-o", "json").communicate(timeout=60)[0])
    assert final["status"] == "cancelled" and len(final["attempts"]) == 1
    assert "icl" in wmctl(d, "list").communicate(timeout=60)[0]


@pytest.mark.parametrize("who", ["watcher-sa", "edit"])
def test_every_store_operation_is_allowed_to_the_watcher_and_to_edit(fake_api, who):
    """The in-cluster watcher runs under manifests/rbac-watcher.yaml; a user with the built-in
    `edit` role runs status/cancel/watch from a laptop. Both must be able to do all of it."""
    from .fakeapi.rbac import User
    from .manifests import watcher_rbac

    if who == "edit":
        client = fake_api.as_user("ed-token", role="edit", namespace=NS)
    else:
        sa = User.service_account(NS, "wmctl-watcher")
        client = fake_api.as_user("sa-token", sa, manifests=watcher_rbac())
    s = ClusterRunStore("rb", api_client=client, namespace=NS)
    s.acquire_watcher()
    s.save(record("rb"))
    assert s._lease is not None
    s._lease = s._lease.__class__(s._lease.pid, s._lease.host, s._lease.started, 0.0)
    s.beat()
    s.append_metric({"event": "step", "step": 1})
    s.append_metric({"event": "checkpoint", "step": 2})       # written at once: the chunk replaced
    s.archive_log(0, 0, b"x\n")
    s.request_cancel(by="me", graceful=False)
    assert s.load().run == "rb" and len(s.metrics()) == 2
    assert (intent := s.cancel_intent()) is not None and intent["by"] == "me"
    s.release_watcher()
    assert list_cluster_runs(__import__("kubernetes").client.CoreV1Api(client), NS) == ["rb"]
    s.delete()
    assert not fake_api.refused(), fake_api.refused()


@pytest.mark.parametrize("value", ["bogus", "docker"])
def test_a_store_name_that_keeps_no_state_is_refused_with_the_choices(tmp_path, value):
    env = {**os.environ, "WMCTL_HOME": str(tmp_path), "PYTHONPATH": str(REPO), "WMCTL_RUN_STORE": value}
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", "x"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out
    assert f"WMCTL_RUN_STORE={value!r} names no run store" in out.stderr and "kubernetes" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_store_the_user_may_not_read_is_a_clear_error(fake_api, tmp_path):
    """RBAC that grants no ConfigMaps (403): exit 4 naming the ConfigMap and the fix, not an
    ApiException traceback."""
    from .fakeapi.rbac import User

    fake_api.as_user("sim-token", User("bob"))           # RBAC on; bob is bound to nothing
    env = {**sim_env(fake_api, tmp_path), "WMCTL_RUN_STORE": "kubernetes", "WMCTL_RUN_STORE_CONTEXT": "sim"}
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", "cs"], env=env, cwd=str(REPO),
                         capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 4, out.stdout + out.stderr
    assert "ConfigMap training/wmctl-run-cs" in out.stderr and "403" in out.stderr, out.stderr


def test_a_renewal_whose_answer_was_lost_keeps_the_lease(fake_api):
    """The API server applied the renewal but the answer was lost: the client's retry carries the
    old resourceVersion and meets 409. The lease is still this watcher's (client-go's
    tryAcquireOrRenew goes by the holder it reads back), so it must not stop."""
    import dataclasses

    a, b = store(fake_api), store(fake_api)
    a.acquire_watcher()
    assert a._lease is not None
    a._lease = dataclasses.replace(a._lease, beat=a._lease.beat - 10)     # due for renewal
    fake_api.faults.lose_response_next(1, verb="PUT", path="wmctl-run-cs.lease")
    a.beat()
    assert a.lease() is not None
    with pytest.raises(RunExists):
        b.acquire_watcher()
    assert a._lease is not None
    a._lease = dataclasses.replace(a._lease, beat=a._lease.beat - 10)
    a.beat()                                                                 # and renews again after that
    a.release_watcher()
    assert not b.watched()


def test_a_first_write_whose_answer_was_lost_is_not_an_error(fake_api):
    """A create the API server applied but whose answer was lost: the retry meets 409
    AlreadyExists. The record (or a new events chunk) is there; the write must not fail."""
    s = store(fake_api)
    fake_api.faults.lose_response_next(1, verb="POST", path="/configmaps")
    rec = record()
    s.save(rec)
    assert store(fake_api).load().run == "cs"
    fake_api.faults.lose_response_next(1, verb="POST", path="/configmaps")
    s.append_metric({"event": "step", "step": 1})
    assert store(fake_api).metrics() == [{"event": "step", "step": 1}]


def test_a_node_log_of_undecodable_bytes_still_fits_a_configmap(fake_api):
    """Each undecodable byte becomes U+FFFD, three bytes in UTF-8: 512 KiB of them would be a
    1.5 MiB ConfigMap, which the API server refuses (ValidateConfigMap's 1 MiB)."""
    s = store(fake_api)
    s.archive_log(0, 1, (b"\xff" * 1000 + b"\n") * (runstore.LOG_TAIL_BYTES // 1000 + 10) + b"last line\n")
    kept = s.archived_log(0, 1)
    assert kept and kept[-1] == "last line"


def test_a_watcher_that_slept_past_its_lease_writes_nothing_over_its_successor(fake_api):
    """A watcher stalled past the lease (a suspended laptop) wakes with events in hand: its first
    write must find out that the lease went to another watcher, not replace that watcher's
    events chunk with its own stale copy (or the record with its stale one)."""
    import dataclasses

    a, b = store(fake_api), store(fake_api)
    a.acquire_watcher()
    a.save(record())
    a.append_metric({"event": "step", "step": 1})
    assert a._lease is not None
    a._lease = dataclasses.replace(a._lease, beat=a._lease.beat - LEASE_STALE_S - 1)   # a slept
    backdate_lease(fake_api, "cs", LEASE_STALE_S + 1, namespace=NS)
    assert b.acquire_watcher()
    b.append_metric({"event": "step", "step": 2})
    with pytest.raises(RunExists, match="lost its watcher lease"):
        a.append_metric({"event": "step", "step": 3})
    stale = record()
    stale.status = "failed"
    with pytest.raises(RunExists):
        a.save(stale)
    assert [m["step"] for m in store(fake_api).metrics()] == [1, 2]
    assert store(fake_api).load().status == "running"


def test_runs_whose_names_extend_each_other_keep_their_own_objects(fake_api):
    """Run `tr` and runs named like its parts (`tr-lease`, `tr-m-0`) in one namespace: each
    keeps its own record, lease and events; none replaces another's ConfigMap."""
    a = store(fake_api, "tr")
    a.acquire_watcher()
    a.save(record("tr"))
    a.append_metric({"event": "step", "step": 1})
    for other in ("tr-lease", "tr-m-0"):
        store(fake_api, other).save(record(other))
    assert store(fake_api, "tr").lease() is not None
    assert store(fake_api, "tr").metrics() == [{"event": "step", "step": 1}]
    assert [store(fake_api, r).load().run for r in ("tr", "tr-lease", "tr-m-0")] == ["tr", "tr-lease", "tr-m-0"]
    a.beat()
    a.release_watcher()
