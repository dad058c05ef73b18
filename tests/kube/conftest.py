"""Fixtures for simulations against the fake Kubernetes API server (tests/kube/fakeapi)."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.backends.kubernetes.engine import KubernetesBackend

from .fakeapi.cluster import Cluster, Timings
from .fakeapi.server import FakeApiServer

# Kubernetes seconds -> real seconds: grace period 40 s -> 0.2 s, tolerationSeconds 300 -> 1.5 s
TEST_SCALE = 0.005


@dataclass
class FakeKube:
    server: FakeApiServer
    cluster: Cluster
    client: "object"           # kubernetes.client.ApiClient

    @property
    def api(self):
        return self.server.api

    @property
    def faults(self):
        return self.server.faults

    @property
    def store(self):
        return self.server.api.store

    def as_user(self, token: str, user=None, *, role: str | None = None, namespace: str | None = None,
                manifests: list[dict] | None = None):
        """Turn RBAC on (see fakeapi/rbac.py) and return a client that authenticates with
        ``token``: bound to the built-in ``role`` in ``namespace`` (a RoleBinding; None: a
        ClusterRoleBinding), or to whatever the RBAC documents of ``manifests`` grant ``user``."""
        from .fakeapi.rbac import Rbac, User

        if self.server.rbac is None:
            self.server.rbac = Rbac()
        user = user or User(token)
        self.server.rbac.add_user(token, user)
        if manifests is not None:
            self.server.rbac.load(manifests)
        if role is not None:
            self.server.rbac.bind(user, role, namespace)
        return make_client(self.server.url, token)

    def refused(self, code: int = 403) -> list[dict]:
        """Every request the server answered with ``code``."""
        return [r for r in self.api.sent() if r.get("code") == code]


def make_client(url: str, token: str | None = None):
    import kubernetes.client

    cfg = kubernetes.client.Configuration()
    cfg.host = url
    if token is not None:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(cfg)


@pytest.fixture(autouse=True)
def forget_remembered_exclusions() -> Iterator[None]:
    """Each test's fake cluster is a new one, but its address (127.0.0.1:<free port>) may be an
    earlier test's: what that cluster's nodes were remembered for (restart.remember_exclusions,
    kept under the session's WMCTL_HOME when a test sets none of its own) is forgotten after each
    test. Torn down after the test's own monkeypatch, so the session's home is the one cleared."""
    yield
    home = os.environ.get("WMCTL_HOME")
    if home:
        (Path(home) / "exclusions.json").unlink(missing_ok=True)


@pytest.fixture
def fake_api(request) -> Iterator[FakeKube]:
    """Fake API server on 127.0.0.1:<free port> in a thread, a scripted cluster with three
    nodes (node-a/b/c; not ticking until a test starts it or calls tick()), and a real
    ``kubernetes.client.ApiClient`` configured for it. Always shut down.

    Options through ``@pytest.mark.fake_api(history_limit=..., nodes=[...], scale=...)``."""
    marker = request.node.get_closest_marker("fake_api")
    opts = dict(marker.kwargs) if marker else {}
    server = FakeApiServer(history_limit=opts.get("history_limit", 10_000)).start()
    server.api.crds = set(opts.get("crds", ()))      # no CRD installed unless a test says so
    cluster = Cluster(server.api, Timings(scale=opts.get("scale", TEST_SCALE)))
    for name in opts.get("nodes", ["node-a", "node-b", "node-c"]):
        cluster.add_node(name)
    client = make_client(server.url)
    try:
        yield FakeKube(server, cluster, client)
    finally:
        cluster.stop()
        client.close()
        server.stop()


@pytest.fixture
def backend(fake_api) -> Iterator[KubernetesBackend]:
    """The Kubernetes backend over the fake API (watch_timeout 2 s), closed after the test; close()
    must leave no watcher or log-follower thread behind."""
    b = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        yield b
    finally:
        b.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _wmctl_threads():
        time.sleep(0.05)
    assert not _wmctl_threads(), _stacks()


def _leftover() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wmctl-") and t.is_alive()]


def _wmctl_threads() -> list[str]:
    return [t.name for t in _leftover()]


def _stacks() -> str:
    """Where each leftover thread is stuck: what a failure must show (CI saw a log follower
    outlive close() once, 1 run in many, and its stack was not on record)."""
    frames = sys._current_frames()
    return "\n".join(f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
                     for t in _leftover() if t.ident in frames)


def pytest_configure(config):
    config.addinivalue_line("markers", "fake_api(**opts): options for the fake_api fixture")
