"""Admission (issue 23 item 7): a PodSecurity refusal is permanent and ends the attempt at once
naming the field to change; a quota refusal names the quota and waits; objects are created with
strict field validation. The fake's refusals follow the upstream plugins named in
tests/kube/fakeapi/api.py (_admit_pod) and server.py."""

from __future__ import annotations

import json
import time

import pytest
from .sdk import client as k8s

from orchestrator.backends.kubernetes import admission
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Outcome, Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView

pytestmark = pytest.mark.timeout(90)


def test_explain_names_the_fields_a_podsecurity_refusal_is_about_and_the_quota():
    reason, msg = admission.explain('pods "the pod" is forbidden: violates PodSecurity "restricted:latest": '
                                    'allowPrivilegeEscalation != false (container "main" must set '
                                    'securityContext.allowPrivilegeEscalation=false), hostPath volumes (volume "m")')
    assert reason == "PodSecurity" and "'restricted'" in msg
    assert "securityContext.allowPrivilegeEscalation" in msg and "volumes[].host_path" in msg
    reason, msg = admission.explain("exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1")
    assert reason == "ResourceQuota" and "ResourceQuota 'compute' is full" in msg
    assert admission.explain("something else") == ("FailedCreate", "something else")


def _run(fake_api, data: dict, labels: dict, setup=None) -> tuple[Outcome, list[str], RunStore, float]:
    core = k8s.CoreV1Api(fake_api.client)
    core.create_namespace({"metadata": {"name": "team", "labels": labels}})
    if setup is not None:
        setup(core)
    spec = from_dict(data)
    fake_api.cluster.script(job=f"{spec.name}-a0", run_seconds=None)
    fake_api.cluster.start()
    backend = KubernetesBackend(fake_api.client, watch_timeout=2, namespace="team")
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="p.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[str] = []
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    t0 = time.monotonic()
    try:
        outcome = sup.run()
    finally:
        backend.close()
    return outcome, lines, store, time.monotonic() - t0


def test_sim_a_podsecurity_refusal_ends_the_attempt_at_once_naming_the_field(fake_api, tmp_path, monkeypatch):
    """The namespace enforces baseline and the spec mounts a hostPath: the refusal is the same
    every time, so the attempt ends at once (pending_timeout is an hour here) with the field to
    change. Before: it waited out restart.pending_timeout as if the cluster were busy."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    outcome, lines, store, took = _run(fake_api, {
        "name": "psa", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 3, "backoff": "0s", "pending_timeout": "1h"},
        "kubernetes": {"namespace": "team"},
        "volumes": [{"name": "models", "mount": "/models", "host_path": "/mnt/models"}],
    }, {"pod-security.kubernetes.io/enforce": "baseline"})
    (a0,) = store.load().attempts
    assert outcome.exit_code == 7, outcome.report
    assert (a0.outcome, a0.decision) == ("unschedulable", "stop")
    assert a0.evidence is not None
    assert 'violates PodSecurity "baseline:latest": hostPath volumes' in a0.evidence
    assert "volumes[].host_path" in a0.evidence and "refused, not retried" in a0.evidence
    assert took < 60


def test_sim_a_quota_refusal_names_the_quota_while_it_waits(fake_api, tmp_path, monkeypatch):
    """A full ResourceQuota frees up as other pods end: the attempt waits (within
    restart.pending_timeout) and says which quota holds it."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))

    def quota(core: k8s.CoreV1Api) -> None:
        core.create_namespaced_resource_quota("team", {"metadata": {"name": "compute"},
                                                       "spec": {"hard": {"pods": "1"}}})
    outcome, lines, store, _ = _run(fake_api, {
        "name": "quo", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 3, "backoff": "0s", "pending_timeout": "2s"},
        "kubernetes": {"namespace": "team"},
    }, {}, quota)
    (a0,) = store.load().attempts
    assert outcome.exit_code == 7 and a0.outcome == "unschedulable"
    assert a0.evidence is not None
    assert "ResourceQuota 'compute' is full" in a0.evidence and "restart.pending_timeout" in a0.evidence
    assert any("node_waiting" in ln and "ResourceQuota 'compute' is full" in ln for ln in lines), lines


# --- strict field validation ----------------------------------------------------------------------
def test_contract_strict_field_validation_refuses_an_unknown_field_and_default_keeps_quiet(fake_api):
    from kubernetes.client.exceptions import ApiException

    from .manifests import rendered_plan

    job = next(m for m in rendered_plan("fv", 0).resources if m["kind"] == "Job")
    job["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "1"}}   # pod-level resources: 1.32+
    batch = k8s.BatchV1Api(fake_api.client)
    batch.create_namespaced_job("default", {**job, "metadata": {**job["metadata"], "name": "new"}},
                                field_validation="Strict")              # a 1.34 cluster knows it
    fake_api.server.schema_version = "1.30"                             # an older one does not
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job("default", job, field_validation="Strict")
    assert err.value.status == 400
    assert err.value.body is not None
    assert ('Job in version "v1" cannot be handled as a Job: strict decoding error: unknown field '
            '"spec.template.spec.resources"') == json.loads(err.value.body)["message"]
    batch.create_namespaced_job("default", job)          # no fieldValidation: not checked here
