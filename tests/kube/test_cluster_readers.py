"""Readers of run state kept in the cluster never hold the watcher's lease (issue 22 item 3): a
`status` or `list` that reconciles a run nobody watches does it behind a gate of its own
(ConfigMap ``wmctl-run-<run>.reconcile``), so a watcher that starts meanwhile waits for that
reader and reads what it recorded, instead of being refused ("already watched by ...") and
leaving the run unwatched. Against the fake API server (its optimistic concurrency is the real
server's)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from orchestrator.backends import base as b
from orchestrator.backends.kubernetes.runstore import ClusterRunStore
from orchestrator.errors import RunExists
from orchestrator.reconcile import reconcile_stored
from orchestrator.state import AttemptRecord, RunRecord

pytestmark = pytest.mark.timeout(120)
NS = "training"


class ReadBackend(b.Backend[b.Any]):
    """The run's one attempt as a reader finds it: failed (node 1 exited 1) or running at step
    3. Its poll waits for ``gate`` and says when a reader is ``inside`` it."""

    name = "kubernetes"
    runs_image = False

    def __init__(self, *, failed: bool, gate: threading.Event | None = None,
                 inside: threading.Event | None = None, pause: float = 0.0):
        self.failed, self.gate, self.inside, self.pause = failed, gate, inside, pause

    @classmethod
    def render(cls, spec, profile, ctx, host):
        raise NotImplementedError       # never planned: the record exists already

    def submit(self, plan):
        raise NotImplementedError

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        if self.inside is not None:
            self.inside.set()
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"
        time.sleep(self.pause)
        if self.failed:
            return b.Observation([b.Event(b.NODE_EXITED, 100.0, 1, "h1", exit_code=1)],
                                 [b.NodeStatus(0, b.SUCCEEDED, "h0", 0), b.NodeStatus(1, b.FAILED, "h1", 1)])
        return b.Observation([b.Event(b.PROGRESS, time.time(), 0, "h0", progress={"event": "step", "step": 3})],
                             [b.NodeStatus(0, b.RUNNING, "h0"), b.NodeStatus(1, b.RUNNING, "h1")])

    def logs(self, ref, node=0, follow=False, query=None) -> Iterator[str]:
        return iter(())

    def cancel(self, ref, graceful=False) -> None:
        pass

    def attempts(self, run: str) -> list[b.AttemptRef]:
        return [b.AttemptRef(self.name, run, 0, NS)]


def store(client, run: str = "rd") -> ClusterRunStore:
    return ClusterRunStore(run, api_client=client, namespace=NS)


def running(client, run: str = "rd") -> RunRecord:
    record = RunRecord(run=run, backend="kubernetes", spec_path="", overrides={}, spec_hash="h", auto_resume=True,
                       namespace=NS, spec={"name": run})
    record.attempts.append(AttemptRecord(attempt=0, submitted_at=time.time()))
    store(client, run).save(record)
    return record


def read(client, backend: ReadBackend, run: str = "rd") -> tuple[RunRecord, str | None]:
    """What `wmctl status` does for a run whose record says running and whose lease is free."""
    return reconcile_stored(store(client, run), store(client, run).load(), lambda _record: backend)


def test_a_watcher_starting_while_a_reader_reconciles_waits_for_it_and_reads_what_it_saw(fake_api):
    running(fake_api.client)
    gate, inside = threading.Event(), threading.Event()
    seen: list[tuple[RunRecord, str | None]] = []
    reader = threading.Thread(target=lambda: seen.append(read(fake_api.client, ReadBackend(
        failed=True, gate=gate, inside=inside))))
    reader.start()
    try:
        assert inside.wait(30), "the reader never looked at the backend"
        watcher = store(fake_api.client)
        taken: list[object] = []

        def take() -> None:
            try:
                watcher.acquire_watcher()
                taken.append(watcher.load().status)      # what the watcher reads once it holds the lease
            except RunExists as exc:
                taken.append(exc)
        starting = threading.Thread(target=take)
        starting.start()
        # The watcher's lease is written (it waits for the reader's gate), or it was refused (the bug).
        deadline = time.monotonic() + 30
        while not taken and store(fake_api.client).lease() is None:
            assert time.monotonic() < deadline, "the watcher neither took its lease nor was refused"
            time.sleep(0.01)
        assert not taken, f"a starting watcher was refused while a reader looked: {taken}"
    finally:
        gate.set()
    reader.join(30)
    starting.join(30)
    assert taken == ["failed"], taken            # it waited, then read the reader's reconciled record
    assert seen and seen[0][0].attempts[0].outcome == "app_error" and seen[0][1] is None
    held = store(fake_api.client).lease()
    assert held is not None and held == watcher.lease()
    with pytest.raises(RunExists, match="already watched by"):
        store(fake_api.client).acquire_watcher()


def test_readers_in_a_loop_never_refuse_a_starting_watcher_nor_knock_one_off(fake_api):
    """Two readers loop (`status` every moment, from before the watcher starts). A watcher starts
    twenty times over, and renews its lease a few times each: never refused, never knocked off,
    and no reader ever writes the lease."""
    running(fake_api.client)
    stop = threading.Event()
    notes: list[str | None] = []
    loops = [0, 0]

    def loop(i: int) -> None:
        while not stop.is_set():
            notes.append(read(fake_api.client, ReadBackend(failed=False, pause=0.02))[1])
            loops[i] += 1
    readers = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    refused: list[str] = []
    beats = 0
    try:
        deadline = time.monotonic() + 30
        while min(loops) < 3:
            assert time.monotonic() < deadline, "the readers never went round"
            time.sleep(0.01)
        for _ in range(20):
            watcher = store(fake_api.client)
            try:
                watcher.acquire_watcher()
                for _ in range(3):
                    assert watcher._lease is not None
                    watcher._lease = watcher._lease.__class__(watcher._lease.pid, watcher._lease.host,
                                                              watcher._lease.started, 0.0)   # a beat is due
                    watcher.beat()                       # RunExists here: knocked off
                    beats += 1
                    time.sleep(0.02)
                watcher.release_watcher()
            except RunExists as exc:
                refused.append(str(exc))
    finally:
        stop.set()
        for t in readers:
            t.join(30)
    assert not refused, refused
    assert beats == 60 and min(loops) >= 3, (beats, loops)
    assert all(n is None for n in notes), set(notes)
    # Every write of the lease was the watchers' own: 20 takes, 60 renewals, 20 releases.
    writes = [r for r in fake_api.api.sent() if r["verb"] in ("POST", "PUT", "PATCH")
              and "wmctl-run-rd.lease" in str(r.get("body") or r["path"])]
    assert len(writes) == 100, [(r["verb"], r["path"]) for r in writes]


def test_a_reader_who_may_not_write_configmaps_gets_a_note_not_an_error(fake_api):
    editor = fake_api.as_user("editor-token", role="edit", namespace=NS)
    viewer = fake_api.as_user("viewer-token", role="view", namespace=NS)
    running(editor)
    record, note = read(viewer, ReadBackend(failed=True))
    assert record.status == "running" and note is not None
    assert "not checked against where it runs" in note and f"namespace {NS}" in note, note
    assert store(editor).load().status == "running"          # nothing was recorded
    assert store(editor).acquire_watcher() is None           # and the run is free to watch


def test_delete_removes_the_readers_gate_too(fake_api):
    running(fake_api.client)
    read(fake_api.client, ReadBackend(failed=False))
    names = {cm["metadata"]["name"] for cm in fake_api.store.list("configmaps", NS)[0]}
    assert "wmctl-run-rd.reconcile" in names
    store(fake_api.client).delete()
    assert not [n for n in (cm["metadata"]["name"] for cm in fake_api.store.list("configmaps", NS)[0])
                if n.startswith("wmctl-run-rd")]


def test_the_run_stores_own_client_reloads_a_rotated_token_like_the_engines(fake_api, tmp_path, monkeypatch):
    """The store's client is loaded from the kubeconfig, as `wmctl status` or a watcher's lease
    loads it; its user reads a tokenFile (a sidecar renews it). The token rotates: the next write
    and read meet a 401, reload the kubeconfig once and carry on (credentials.py). Before: the
    client read the file once, so each later request was 401 and a watcher lost its lease."""
    import yaml

    from orchestrator.backends.kubernetes.runstore import list_cluster_runs

    token = tmp_path / "token"
    token.write_text("t1")
    fake_api.as_user("t1", role="edit", namespace=NS)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake_api.server.url}}],
        "users": [{"name": "robot", "user": {"tokenFile": str(token)}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "robot", "namespace": NS}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("WMCTL_RUN_STORE_CONTEXT", raising=False)
    kept = ClusterRunStore("rot", namespace=NS)
    record = RunRecord(run="rot", backend="kubernetes", spec_path="", overrides={}, spec_hash="h",
                       auto_resume=True, namespace=NS, spec={"name": "rot"})
    kept.save(record)
    fake_api.server.rbac.rotate("t1", "t2")
    token.write_text("t2")
    record.status = "succeeded"
    kept.save(record)                                          # 401, reload, the write goes through
    assert kept.load().status == "succeeded"
    assert list_cluster_runs(namespace=NS) == ["rot"]          # a new client reads the new token at once
    refused = [r for r in fake_api.api.requests if r.get("code") == 401]
    assert len(refused) == 1, refused                          # one 401, then the reloaded token
