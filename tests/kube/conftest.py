"""Fixtures for simulations against the fake Kubernetes API server (tests/kube/fakeapi)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pytest

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


def make_client(url: str):
    import kubernetes.client

    cfg = kubernetes.client.Configuration()
    cfg.host = url
    return kubernetes.client.ApiClient(cfg)


@pytest.fixture
def fake_api(request) -> Iterator[FakeKube]:
    """Fake API server on 127.0.0.1:<free port> in a thread, a scripted cluster with three
    nodes (node-a/b/c; not ticking until a test starts it or calls tick()), and a real
    ``kubernetes.client.ApiClient`` configured for it. Always shut down.

    Options through ``@pytest.mark.fake_api(history_limit=..., nodes=[...], scale=...)``."""
    marker = request.node.get_closest_marker("fake_api")
    opts = dict(marker.kwargs) if marker else {}
    server = FakeApiServer(history_limit=opts.get("history_limit", 10_000)).start()
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


def pytest_configure(config):
    config.addinivalue_line("markers", "fake_api(**opts): options for the fake_api fixture")
