"""Simulations: the watcher reads only the Nodes its attempt runs on (nodewatch.py), and lists
Nodes in pages when it must list them. Against the fake API server (tests/kube/fakeapi): no real
cluster; Kubernetes durations scaled."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends import base
from orchestrator.backends.kubernetes import nodewatch

from .manifests import rendered_plan
from .simhelpers import Collector

pytestmark = pytest.mark.timeout(90)

CLUSTER = [f"node-{i:02d}" for i in range(24)]


def _node_requests(fake_api) -> list[dict]:
    return [r for r in fake_api.api.sent("GET") if r["path"].startswith("/api/v1/nodes")]


def _run_and_lose_a_node(fake_api, backend):
    c = fake_api.cluster
    c.default_script.run_seconds = None
    c.start()
    ref = backend.submit(rendered_plan("scope", 0))
    col = Collector(backend, ref)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    hosts = {n.host for n in col.last.nodes}
    victim = col.last.nodes[1].host
    c.kill_node(victim)
    assert col.until(lambda col: col.kinds(base.NODE_LOST))
    lost = col.kinds(base.NODE_LOST)[0]
    assert (lost.host, lost.reason) == (victim, "NodeStatusUnknown")
    return ref, hosts


@pytest.mark.fake_api(nodes=CLUSTER)
def test_sim_watcher_reads_only_its_attempts_nodes(fake_api, backend):
    """Simulation: a 2-node attempt in a 24-node cluster lists and watches its two Nodes by name
    (fieldSelector metadata.name), never the whole cluster, and still sees one of them die.
    Before, every attempt listed and watched all Nodes."""
    ref, hosts = _run_and_lose_a_node(fake_api, backend)
    backend.cancel(ref)
    reqs = _node_requests(fake_api)
    assert reqs
    unscoped = [r for r in reqs if r["path"] == "/api/v1/nodes" and "fieldSelector" not in r["query"]]
    assert unscoped == []
    named = {r["query"]["fieldSelector"].removeprefix("metadata.name=") for r in reqs
             if r["path"] == "/api/v1/nodes"} | {r["path"].rsplit("/", 1)[-1] for r in reqs
                                                 if r["path"] != "/api/v1/nodes"}
    assert named == hosts
    st = next(iter(backend._attempts.values()))
    assert st.node_watch.cached() == 2 and not st.node_watch.wide


@pytest.mark.fake_api(nodes=CLUSTER)
def test_sim_many_nodes_one_paged_watch_keeps_only_trimmed_nodes(fake_api, backend, monkeypatch):
    """Simulation: above PER_NAME_MAX nodes the watcher uses one watch of all Nodes from a list
    in pages (limit/continue), keeps each Node trimmed (no images, no nodeInfo), and still sees
    a node die; a teardown pages its Node list too."""
    monkeypatch.setattr(nodewatch, "PER_NAME_MAX", 1)
    monkeypatch.setattr(nodewatch, "PAGE_SIZE", 5)
    import orchestrator.backends.kubernetes.teardown as teardown
    monkeypatch.setattr(teardown, "PER_NAME_MAX", 1)
    monkeypatch.setattr(teardown, "PAGE_SIZE", 5)
    fake_api.store.update("nodes", None, CLUSTER[0], lambda n: n["status"].update(
        images=[{"names": ["registry.example.com/big:1"], "sizeBytes": 1}], nodeInfo={"kubeletVersion": "v1.34"}))
    ref, hosts = _run_and_lose_a_node(fake_api, backend)
    st = next(iter(backend._attempts.values()))
    assert st.node_watch.wide
    lists = [r for r in _node_requests(fake_api) if r["path"] == "/api/v1/nodes" and r["query"].get("watch") != "true"
             and "fieldSelector" not in r["query"]]
    assert lists and all(r["query"].get("limit") == "5" for r in lists)
    assert any("continue" in r["query"] for r in lists)
    cached = [st.node_watch.lookup(n)[1] for n in CLUSTER]
    assert all(n is not None and "images" not in n["status"] and "nodeInfo" not in n["status"] for n in cached)
    before = len(lists)
    backend.cancel(ref)
    after = [r for r in _node_requests(fake_api) if r["path"] == "/api/v1/nodes"
             and r["query"].get("watch") != "true" and "fieldSelector" not in r["query"]][before:]
    assert after and all(r["query"].get("limit") == "5" for r in after)


@pytest.mark.fake_api(nodes=CLUSTER)
def test_sim_paged_list_restarts_when_its_continue_token_expires(fake_api, backend, monkeypatch):
    """Simulation: history compacted between two pages of the Node list -> 410 Expired for the
    continue token; the watcher lists again from the first page and syncs."""
    monkeypatch.setattr(nodewatch, "PAGE_SIZE", 5)
    calls = {"n": 0}
    from tests.kube.fakeapi import server as fake_server
    real = fake_server.Handler._list_page

    def compact_before_second_page(self, res, ns, query, match, limit, token):
        if token and calls["n"] == 0:
            calls["n"] += 1
            fake_api.cluster.set_node_ready(CLUSTER[-1], False)
            fake_api.store.compact()
        return real(self, res, ns, query, match, limit, token)

    monkeypatch.setattr(fake_server.Handler, "_list_page", compact_before_second_page)
    w = nodewatch.NodeWatch(__import__("kubernetes").client.CoreV1Api(fake_api.client).list_node,
                            lambda names: None, watch_timeout=2)
    monkeypatch.setattr(nodewatch, "PER_NAME_MAX", 0)
    try:
        w.add({CLUSTER[3]})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not w.lookup(CLUSTER[3])[0]:
            time.sleep(0.02)
        assert w.lookup(CLUSTER[3])[0] and w.cached() == len(CLUSTER)
        assert w.relists >= 1
        expired = [r for r in fake_api.api.sent("GET", "/api/v1/nodes") if r.get("code") == 410]
        assert len(expired) == 1
    finally:
        w.stop()
