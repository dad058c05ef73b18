"""Client loading: kubeconfig contexts and clear errors (simulation against the fake API)."""

from __future__ import annotations

import sys

import pytest
import yaml

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import BackendError, EngineUnavailable
from orchestrator.adaptors.kubernetes import load_api_client


def _kubeconfig(tmp_path, good_url: str) -> str:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "broken",
           "clusters": [{"name": "fake", "cluster": {"server": good_url}},
                        {"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "sim", "context": {"cluster": "fake", "user": "u"}},
                        {"name": "broken", "context": {"cluster": "dead", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_sim_context_selects_the_cluster(fake_api, tmp_path):
    """Simulation: --context picks the fake server out of a two-context kubeconfig."""
    path = _kubeconfig(tmp_path, fake_api.server.url)
    b = KubernetesBackend(context="sim", kubeconfig=path, watch_timeout=2)
    try:
        assert b.attempts("nothing") == []
        assert fake_api.api.sent("GET", "/jobs")
    finally:
        b.close()


def test_unknown_context_is_a_clear_error(tmp_path):
    path = _kubeconfig(tmp_path, "http://127.0.0.1:9")
    with pytest.raises(EngineUnavailable) as err:
        load_api_client("nope", path)
    assert "'nope'" in str(err.value) and "--context" in str(err.value)


def test_missing_kubeconfig_outside_a_cluster(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(EngineUnavailable) as err:
        load_api_client(kubeconfig=str(tmp_path / "absent"))
    assert "KUBECONFIG" in str(err.value)


def test_in_cluster_without_service_account_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(EngineUnavailable) as err:
        load_api_client(in_cluster=True)
    assert "in-cluster" in str(err.value)


def test_unreachable_api_is_engine_unavailable(tmp_path):
    path = _kubeconfig(tmp_path, "http://127.0.0.1:9")
    b = KubernetesBackend(context="broken", kubeconfig=path)
    with pytest.raises(EngineUnavailable):
        b.attempts("x")


def test_plan_without_manifests_is_rejected():
    from orchestrator.backends.kubernetes.render import KubernetesRequest
    from orchestrator.plan import Plan

    empty = Plan(backend="kubernetes", run="r", attempt=0, spec_hash="h", request=KubernetesRequest("default"))
    with pytest.raises(BackendError, match="no Kubernetes manifests"):
        KubernetesBackend(api_client=object()).submit(empty)


def test_a_plan_for_another_backend_is_rejected():
    from orchestrator.backends.docker.render import DockerRequest
    from orchestrator.plan import Plan

    other = Plan(backend="docker", run="r", attempt=0, spec_hash="h", request=DockerRequest("net"),
                 resources=[{"kind": "container"}])
    with pytest.raises(BackendError, match="cannot be submitted to Kubernetes"):
        KubernetesBackend(api_client=object()).submit(other)  # type: ignore[arg-type]  # a Docker plan, on purpose


def test_importing_the_backend_does_not_import_kubernetes():
    import subprocess
    out = subprocess.run([sys.executable, "-c", "import orchestrator.backends.kubernetes, sys;"
                          "print('kubernetes' in sys.modules)"], capture_output=True, text=True,
                         check=True, cwd=str(__import__('pathlib').Path(__file__).parents[2]))
    assert out.stdout.strip() == "False"


def test_a_recorded_kubeconfig_absent_in_a_pod_means_the_service_account(monkeypatch, tmp_path):
    """`submit --kubeconfig FILE --in-cluster`: the record names the laptop's file, which the watcher
    pod has not; like the recorded context, it falls back to the pod's service account (here none
    is mounted, so the in-cluster config is what fails)."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(EngineUnavailable) as err:
        load_api_client("sim", kubeconfig=str(tmp_path / "laptop-kubeconfig"))
    assert "Service token file" in str(err.value) and "no kubeconfig found" not in str(err.value)
