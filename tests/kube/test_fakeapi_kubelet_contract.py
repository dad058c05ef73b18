"""Contract tests of the fake's kubelet-started terminations (fakeapi/kubelet_terminations.py):
what a watcher sees, update by update, follows pkg/kubelet/status/status_manager.go
mergePodStatus, pkg/kubelet/eviction/eviction_manager.go and
pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go."""

from __future__ import annotations

from .sdk import client

from .fakeapi import kubelet_terminations as kt


def _running_pod(fake_api, name: str, node: str) -> None:
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                           "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                    "nodeName": node}})
    fake_api.cluster.script(when=lambda p: p["metadata"]["name"] == name, run_seconds=None, sigterm_exit_code=1)
    assert fake_api.cluster.run_until(
        lambda: core.read_namespaced_pod(name, "default").status.phase == "Running", timeout=10)


def _updates(fake_api, since: int, name: str) -> list[dict]:
    return [c.obj for c in fake_api.store.changes_since(since, "pods")
            if c.obj["metadata"]["name"] == name and c.type == "MODIFIED"]


def _dt(pod: dict) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


def test_sim_a_storage_limit_eviction_kills_at_once_then_says_evicted_without_disruption_target(fake_api):
    _running_pod(fake_api, "p", "node-a")
    rv = fake_api.store.rv
    assert kt.evict_for_storage_limit(fake_api.cluster, "node-a", kt.emptydir_message("scratch", "1Gi")) == ["p"]
    first, second = _updates(fake_api, rv, "p")
    # the containers' exit first, the phase held back ...
    assert first["status"]["phase"] == "Running" and "reason" not in first["status"]
    assert first["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert _dt(first) is None
    # ... then Failed, Evicted, the eviction manager's message; no DisruptionTarget for a local limit
    assert (second["status"]["phase"], second["status"]["reason"]) == ("Failed", "Evicted")
    assert second["status"]["message"] == 'Usage of EmptyDir volume "scratch" exceeds the limit "1Gi". '
    assert _dt(second) is None


def test_sim_a_node_pressure_eviction_taints_the_node_and_sets_disruption_target_with_the_phase(fake_api):
    _running_pod(fake_api, "p", "node-a")
    rv = fake_api.store.rv
    kt.evict_for_node_pressure(fake_api.cluster, "node-a")
    first, second = _updates(fake_api, rv, "p")
    assert first["status"]["phase"] == "Running" and _dt(first) is None
    assert (second["status"]["phase"], second["status"]["reason"]) == ("Failed", "Evicted")
    assert (dt := _dt(second)) is not None and dt["reason"] == "TerminationByKubelet"
    assert second["status"]["message"].startswith("The node was low on resource: ephemeral-storage.")
    node = fake_api.store.get("nodes", None, "node-a")
    taint = node["spec"]["taints"][0]
    assert (taint["key"], taint["effect"]) == ("node.kubernetes.io/disk-pressure", "NoSchedule")
    assert any(c["type"] == "DiskPressure" and c["status"] == "True" for c in node["status"]["conditions"])


def test_sim_a_graceful_node_shutdown_sigterms_and_says_terminated(fake_api):
    _running_pod(fake_api, "p", "node-b")
    rv = fake_api.store.rv
    kt.shut_down_node(fake_api.cluster, "node-b")
    first, second = _updates(fake_api, rv, "p")
    assert first["status"]["phase"] == "Running"
    assert first["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1   # torchrun on SIGTERM
    assert (second["status"]["phase"], second["status"]["reason"]) == ("Failed", "Terminated")
    assert second["status"]["message"] == kt.SHUTDOWN_MESSAGE
    assert (dt := _dt(second)) is not None and dt["reason"] == "TerminationByKubelet"
    ready = next(c for c in fake_api.store.get("nodes", None, "node-b")["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == ("False", "node is shutting down")
