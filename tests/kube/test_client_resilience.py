"""The API client against a server that misbehaves as real ones do: half-open streams, 429 with
Retry-After, outages, watch bookmarks. Contract tests pin the fake's behaviour (each follows the
upstream source named in tests/kube/fakeapi); product tests drive the real backend through it."""

from __future__ import annotations

import email.utils
import time

import pytest
import urllib3
from kubernetes import watch
from .sdk import client
from kubernetes.client.exceptions import ApiException

from orchestrator.adaptors.kubernetes import single_try
from orchestrator.backends import base
from orchestrator.backends.kubernetes import client as kc
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import EngineUnavailable

from .manifests import rendered_plan
from .simhelpers import Collector

pytestmark = pytest.mark.timeout(60)


def _cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {}}


# --- the fake's contract ------------------------------------------------------------------------
def test_contract_429_carries_retry_after_and_a_plain_text_body(fake_api):
    fake_api.faults.fail_next(1, code=429, verb="GET", path="/configmaps")
    core = client.CoreV1Api(single_try(fake_api.client))
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    assert err.value.status == 429
    assert err.value.headers is not None and err.value.body is not None
    assert err.value.headers["Retry-After"] == "1"         # maxinflight.go: retryAfter = "1"
    assert "Too many requests" in err.value.body
    assert core.list_namespaced_config_map("default").items == []     # one shot only


def test_contract_a_stalled_stream_sends_nothing_and_never_closes(fake_api):
    core = client.CoreV1Api(fake_api.client)
    resp = core.list_namespaced_config_map("default", watch=True, timeout_seconds=1,
                                           _preload_content=False, _request_timeout=(2, 1.5))
    try:
        fake_api.faults.stall_streams()
        core.create_namespaced_config_map("default", _cm("after-stall"))
        t0 = time.monotonic()
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            # the server asked for a 1 s watch would have ended it; a half-open one never ends
            for _ in watch.watch.iter_resp_lines(resp):
                pass
        assert time.monotonic() - t0 >= 1.4
    finally:
        resp.release_conn()
    # a new stream is served normally
    fresh = [e["raw_object"]["metadata"]["name"] for e in watch.Watch().stream(
        core.list_namespaced_config_map, "default", timeout_seconds=1, _request_timeout=(2, 5))]
    assert fresh == ["after-stall"]


def test_contract_bookmarks_only_when_asked_and_carry_only_a_resource_version(fake_api):
    fake_api.server.bookmark_interval_s = 0.1
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_config_map("default", _cm("one"))
    _, rv = fake_api.store.list("configmaps")
    asked = list(watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=str(rv),
                                      allow_watch_bookmarks=True, timeout_seconds=1, deserialize=False))
    plain = list(watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=str(rv),
                                      timeout_seconds=1, deserialize=False))
    marks = [e for e in asked if e["type"] == "BOOKMARK"]
    assert marks and not [e for e in plain if e["type"] == "BOOKMARK"]
    assert all(set(m["object"]) == {"apiVersion", "kind", "metadata"} and
               set(m["object"]["metadata"]) == {"resourceVersion"} and
               int(m["object"]["metadata"]["resourceVersion"]) >= rv for m in marks)


# --- the client's delay policy --------------------------------------------------------------------
class _Exc(Exception):
    def __init__(self, headers):
        self.headers = headers


def test_retry_after_is_read_as_seconds_or_an_http_date():
    assert kc.retry_after_s(_Exc({"Retry-After": "3"})) == 3.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (kc.retry_after_s(_Exc({"Retry-After": later})) or 0) <= 31
    assert kc.retry_after_s(_Exc({})) is None and kc.retry_after_s(_Exc({"Retry-After": "soon"})) is None


def test_backoff_grows_with_jitter_caps_and_honours_retry_after():
    lows, highs = kc.Backoff(0.1, 0.8, rng=lambda: 0.0), kc.Backoff(0.1, 0.8, rng=lambda: 1.0)
    assert [round(lows.delay(), 3) for _ in range(5)] == [0.05, 0.1, 0.2, 0.4, 0.4]
    assert [round(highs.delay(), 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.8, 0.8]
    assert kc.Backoff(0.1, 0.8).delay(_Exc({"Retry-After": "2"})) == 2.0
    assert kc.Backoff(0.1, 0.8).delay(_Exc({"Retry-After": "3600"})) == kc.MAX_RETRY_AFTER_S


# --- the product ------------------------------------------------------------------------------
def test_a_429_is_retried_after_its_retry_after_not_sooner(fake_api):
    """call() waits the server's Retry-After (given with the injected sleep) before the retry."""
    fake_api.faults.fail_next(1, code=429, verb="POST", path="/configmaps", retry_after="2")
    slept: list[float] = []
    core = client.CoreV1Api(single_try(fake_api.client))
    kc.call(core.create_namespaced_config_map, "default", _cm("x"), what="create", sleep=slept.append)
    assert slept and slept[0] >= 2.0
    assert len(fake_api.api.sent("POST", "/configmaps")) == 2


def test_sim_submit_waits_out_a_429_for_its_retry_after(fake_api, backend):
    fake_api.faults.fail_next(1, code=429, verb="POST", path="/services", retry_after="1")
    backend.submit(rendered_plan("sim", 0))
    posts = fake_api.api.sent("POST", "/services")
    assert len(posts) == 2 and posts[1]["time"] - posts[0]["time"] >= 1.0


def test_sim_poll_reports_an_api_outage_and_its_end(fake_api):
    """An API server that answers nothing but 503 is an outage poll() reports (EngineUnavailable,
    which the supervisor waits out), not a quiet run; once it answers again poll() does too."""
    b = KubernetesBackend(fake_api.client, watch_timeout=2, contact=kc.Contact(interval=0.0))
    try:
        ref = b.submit(rendered_plan("sim", 0))
        b.poll(ref)
        rule = fake_api.faults.fail_next(10_000, code=503)
        with pytest.raises(EngineUnavailable) as err:
            b.poll(ref)
        assert "503" in str(err.value)
        rule.remaining = 0
        b.poll(ref)
    finally:
        b.close()


def test_sim_half_open_streams_are_timed_out_and_reopened(fake_api, monkeypatch):
    """Every watch and rank 0's log go half-open mid-run: nothing arrives and nothing closes.
    The client-side read timeouts end them, the watchers reopen from where they were, and the
    rest of the run (its progress lines, both exits) still arrives, once each."""
    monkeypatch.setattr(kc, "STREAM_MARGIN_S", 1.0)
    c = fake_api.cluster
    c.script(job="sim-a0", index=0, run_seconds=5.0,
             logs=[(0.2 * i, f'WMCTL-PROGRESS {{"event":"step","step":{i}}}') for i in range(20)])
    c.script(job="sim-a0", index=1, run_seconds=4.5)
    c.start()
    b = KubernetesBackend(fake_api.client, watch_timeout=1, log_read_timeout=2.0)
    try:
        ref = b.submit(rendered_plan("sim", 0))
        col = Collector(b, ref)
        assert col.until(lambda col: len(col.kinds(base.PROGRESS)) >= 3, timeout=30)
        fake_api.faults.stall_streams()
        assert col.until(lambda col: col.last.finished and len(col.kinds(base.PROGRESS)) == 20, timeout=30)
        assert [p["step"] for p in col.progress()] == list(range(20))
        assert sorted((e.node, e.exit_code) for e in col.kinds(base.NODE_EXITED)) == [(0, 0), (1, 0)]
        assert sum(s["reconnects"] for s in b.watch_stats(ref).values()) >= 1
    finally:
        b.close()


def test_sim_bookmarks_keep_a_quiet_watch_resumable_after_compaction(fake_api):
    """Nothing happens to the attempt's objects while the rest of the cluster moves on and the
    history is compacted; the watch streams then drop. Resumed from their bookmarks' versions,
    they need no relist (a relist of every watched kind at 1,024 nodes is what bookmarks save)."""
    fake_api.server.bookmark_interval_s = 0.1
    c = fake_api.cluster
    c.script(job="sim-a0", index=0, run_seconds=30)
    c.script(job="sim-a0", index=1, run_seconds=30)
    c.start()
    b = KubernetesBackend(fake_api.client, watch_timeout=5)
    try:
        ref = b.submit(rendered_plan("sim", 0))
        col = Collector(b, ref)
        assert col.until(lambda col: len(col.kinds(base.NODE_STARTED)) == 2)
        c.stop()
        core = client.CoreV1Api(fake_api.client)
        for i in range(5):
            core.create_namespaced_config_map("default", _cm(f"other-{i}"))
        _, now_rv = fake_api.store.list("configmaps")
        watchers = b._state(ref).watchers
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(int(w.resource_version or 0) < now_rv for w in watchers):
            time.sleep(0.05)
        assert all(w.resource_version is not None and int(w.resource_version) >= now_rv for w in watchers)
        fake_api.store.compact()
        fake_api.faults.drop_watches()

        def reconnects() -> int:
            return sum(s["reconnects"] for s in b.watch_stats(ref).values())
        deadline = time.monotonic() + 10       # each watch thread must get a core to see its stream end
        while time.monotonic() < deadline and reconnects() < 3:
            time.sleep(0.05)
        stats = b.watch_stats(ref)
        assert sum(s["reconnects"] for s in stats.values()) >= 3
        assert sum(s["relists"] for s in stats.values()) == 0
    finally:
        b.close()
