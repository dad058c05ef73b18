"""API outages and expiring credentials (issue 23 items 2 and 4): a control-plane upgrade during a
resubmission, a throttled read inside poll(), a token that expires and is renewed on disk, one that
is never renewed. Contract tests pin the fake (tests/kube/fakeapi/faults.py outage, rbac.py
rotate/expire, server.py /version authentication); product tests drive the real backend and
supervisor through it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from .sdk import client
from kubernetes.client.exceptions import ApiException

from orchestrator.adaptors.kubernetes import single_try
from orchestrator.backends.kubernetes import client as kc
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import CredentialsRejected
from orchestrator.specload import from_dict

from .conftest import make_client
from .manifests import rendered_plan
from .simhelpers import Collector, start_supervisor

pytestmark = pytest.mark.timeout(90)


def _status_until(fn, want: int, timeout: float = 10.0) -> int:
    """Call ``fn`` until it answers ``want`` (an HTTP status; 200 for no error) or time is up."""
    deadline = time.monotonic() + timeout
    got = -1
    while time.monotonic() < deadline:
        try:
            fn()
            got = 200
        except ApiException as exc:
            got = exc.status
        if got == want:
            return got
        time.sleep(0.02)
    return got


def _kubeconfig(tmp_path: Path, url: str, token_file: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "robot", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "robot"}}]}))
    return path


# --- the fake's contract ------------------------------------------------------------------------
def test_contract_an_outage_is_429_shutting_down_then_503_then_service(fake_api):
    core = client.CoreV1Api(single_try(fake_api.client))
    fake_api.faults.outage(0.6, shutting_down_s=0.6)
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    assert err.value.headers is not None and err.value.body is not None
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "5"   # with_retry_after.go
    assert "The apiserver is shutting down" in err.value.body
    assert _status_until(lambda: core.list_namespaced_config_map("default"), 503) == 503
    assert _status_until(lambda: core.list_namespaced_config_map("default"), 200) == 200


def test_contract_a_rotated_token_is_refused_with_401_on_every_path(fake_api):
    fake_api.as_user("t1", role="view", namespace="default")
    fake_api.server.rbac.rotate("t1", "t2")
    old = client.CoreV1Api(single_try(make_client(fake_api.server.url, "t1")))
    for call in (lambda: old.list_namespaced_pod("default"),
                 lambda: client.VersionApi(old.api_client).get_code()):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 401
    assert client.CoreV1Api(make_client(fake_api.server.url, "t2")).list_namespaced_pod("default").items == []
    anonymous = client.VersionApi(fake_api.client).get_code()      # no credential: public-info-viewer
    assert anonymous.major == "1"


# --- item 2: outages and throttling ---------------------------------------------------------------
def test_sim_a_throttled_events_read_does_not_escape_poll(fake_api):
    """A Job with fewer pods than nodes makes poll() read its Events (the FailedCreate reason);
    the API server throttles that read (429) past call()'s retries. poll() goes on without it and
    reads again when due."""
    b = KubernetesBackend(fake_api.client, watch_timeout=2, contact=kc.Contact(interval=0.0))
    try:
        ref = b.submit(rendered_plan("sim", 0))        # the fake cluster is not ticking: no pod yet
        rule = fake_api.faults.fail_next(10_000, code=429, verb="GET", path="/events", retry_after="0")
        col = Collector(b, ref)
        assert col.until(lambda col: rule.fired >= 5, timeout=20)
        assert fake_api.api.sent("GET", "/events")
    finally:
        b.close()


def test_sim_a_resubmission_rides_out_a_control_plane_outage(fake_api, tmp_path, monkeypatch):
    """Attempt 0 loses a node; as attempt 1 is submitted the control plane goes away for 4 s
    (the load balancer answers 503). The submission waits it out and
    says so; attempt 1 runs and the run succeeds. Before: the client gave up after ~1.5 s, the
    attempt was `not_submitted` and the run `failed`."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    monkeypatch.setenv("WMCTL_TEST_PAUSE_AT", "submitting")
    spec = from_dict({
        "name": "out", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s"},
    })
    c = fake_api.cluster
    c.script(job="out-a0", run_seconds=None)
    c.script(job="out-a0", index=0, run_seconds=None, logs=[(0.0, 'WMCTL-PROGRESS {"event":"checkpoint","step":10}')])
    c.script(job="out-a1", run_seconds=0.5)
    c.script(job="out-a1", index=0, run_seconds=0.6, logs=[(0.0, 'WMCTL-PROGRESS {"event":"resume","step":10}')])
    c.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend)
    try:
        def held() -> bool:
            return any(p.name == "pause-submitting" for p in (tmp_path).rglob("pause-submitting"))
        assert c.run_until(held, timeout=30)
        next(tmp_path.rglob("pause-submitting")).unlink()     # attempt 0 goes
        assert c.run_until(lambda: any("checkpoint committed at step 10" in ln for ln in lines), timeout=30)
        running = [p for p in fake_api.store.list("pods")[0] if p["metadata"]["labels"].get("job-name") == "out-a0"
                   and p["status"].get("phase") == "Running"]
        c.kill_node(next(p["spec"]["nodeName"] for p in running
                         if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"))
        assert c.run_until(held, timeout=30)                   # attempt 1 about to be submitted
        fake_api.faults.outage(4.0)
        next(tmp_path.rglob("pause-submitting")).unlink()
        notes: list[str] = []

        def noted() -> bool:      # `wmctl status` and the panel read the attempt's evidence
            attempts = store.load().attempts
            if len(attempts) > 1 and attempts[1].evidence:
                notes.append(attempts[1].evidence)
            return any("kubernetes API unavailable, retrying while submitting attempt 1 (since " in n
                       and ", budget 1m00s)" in n for n in notes)
        assert c.run_until(noted, timeout=30), (notes, lines)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()
    outcome = result["outcome"]
    assert outcome.exit_code == 0, outcome.report + "\n" + "\n".join(lines)
    a0, a1 = store.load().attempts
    assert a0.outcome == "node_lost" and a1.outcome == "succeeded"
    assert not a1.evidence or "API unavailable" not in a1.evidence      # cleared once it was back
    said = "\n".join(lines)
    assert "kubernetes API unavailable while submitting attempt 1" in said and "nothing is marked failed" in said
    assert "kubernetes API back: submitting attempt 1 done after" in said


# --- item 4: credentials that expire ---------------------------------------------------------------
@pytest.fixture
def token_user(fake_api, tmp_path):
    """A kubeconfig whose user reads its token from a file, as a sidecar-renewed or projected
    token is handed over; the fake accepts "t1" (cluster-admin)."""
    token_file = tmp_path / "token"
    token_file.write_text("t1")
    fake_api.as_user("t1", role="cluster-admin")
    return _kubeconfig(tmp_path, fake_api.server.url, token_file), token_file


def test_sim_a_token_file_renewed_on_disk_is_read_again_on_a_401(fake_api, token_user):
    """The token expires and its file is rewritten with the new one. The Python client read the
    file once (kube_config.py _load_user_token); wmctl reloads on the 401 and carries on: poll()
    keeps contact and the next attempt is created. Before: every request was 401 from then on."""
    kubeconfig, token_file = token_user
    b = KubernetesBackend(kubeconfig=str(kubeconfig), watch_timeout=2, contact=kc.Contact(interval=0.0))
    try:
        ref = b.submit(rendered_plan("sim", 0))
        b.poll(ref)
        fake_api.server.rbac.rotate("t1", "t2")
        token_file.write_text("t2")
        b.poll(ref)                                              # GET /version: 401, reload, 200
        b.submit(rendered_plan("sim", 1))
        assert b.cluster.credentials is not None and b.cluster.credentials.reloads == 1
        assert [j["metadata"]["name"] for j in fake_api.store.list("jobs")[0]] == ["sim-a0", "sim-a1"]
    finally:
        b.close()


def test_sim_a_credential_never_renewed_is_lost_contact_naming_its_source(fake_api, token_user):
    """Nothing renews the token: poll() says contact is lost (EngineUnavailable, which the
    supervisor waits out without calling the run hung), naming the tokenFile and the fix.
    Before: a 401 counted as an API server that is there, and the run was later called hung."""
    kubeconfig, token_file = token_user
    b = KubernetesBackend(kubeconfig=str(kubeconfig), watch_timeout=2, contact=kc.Contact(interval=0.0))
    try:
        ref = b.submit(rendered_plan("sim", 0))
        fake_api.server.rbac.expire("t1")
        with pytest.raises(CredentialsRejected) as err:
            b.poll(ref)
        assert "401" in err.value.message and str(token_file) in err.value.message
        assert err.value.hint and str(token_file) in err.value.hint
        with pytest.raises(CredentialsRejected):                # a submission says the same
            b.submit(rendered_plan("sim", 1))
    finally:
        b.close()


def test_many_threads_meeting_one_401_reload_the_credential_once(fake_api, token_user):
    """The watch threads, log followers and poll() meet the same expiry together: one reload."""
    kubeconfig, token_file = token_user
    b = KubernetesBackend(kubeconfig=str(kubeconfig), watch_timeout=2)
    try:
        core = b.cluster.core()
        core.list_namespaced_pod("default")
        fake_api.server.rbac.rotate("t1", "t2")
        token_file.write_text("t2")
        errors: list[BaseException] = []

        def read() -> None:
            try:
                core.list_namespaced_pod("default")
            except ApiException as exc:
                errors.append(exc)
        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors
        assert b.cluster.credentials is not None and b.cluster.credentials.reloads == 1
    finally:
        b.close()
