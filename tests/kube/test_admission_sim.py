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
    assert "kubernetes.security_context.allowPrivilegeEscalation: false" in msg and "volumes[].host_path" in msg
    reason, msg = admission.explain("exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1")
    assert reason == "ResourceQuota" and "ResourceQuota 'compute' is full" in msg
    assert admission.explain("something else") == ("FailedCreate", "something else")


def _run(fake_api, data: dict, labels: dict, setup=None,
         run_seconds: float | None = None) -> tuple[Outcome, list[str], RunStore, float]:
    core = k8s.CoreV1Api(fake_api.client)
    core.create_namespace({"metadata": {"name": "team", "labels": labels}})
    if setup is not None:
        setup(core)
    spec = from_dict(data)
    fake_api.cluster.script(job=f"{spec.name}-a0", run_seconds=run_seconds)
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


# --- the restricted Pod Security Standard ---------------------------------------------------------
def test_contract_podsecurity_restricted_refuses_a_pod_that_may_run_as_root_in_upstreams_words(fake_api):
    """policy/check_allowPrivilegeEscalation.go, check_capabilities_restricted.go,
    check_runAsNonRoot.go, check_seccompProfile_restricted.go: each failed check's reason and
    detail, in the checks' ID order (tests/kube/fakeapi/podsecurity.py)."""
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(fake_api.client)
    core.create_namespace({"metadata": {"name": "locked", "labels": {"pod-security.kubernetes.io/enforce":
                                                                    "restricted"}}})
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("locked", bare)
    assert err.value.status == 403 and err.value.body is not None
    assert json.loads(err.value.body)["message"] == (
        'pods "bare" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "main" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "main" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
        'container "main" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "main" '
        'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    # a container's own settings count as the pod's do; an explicit false is named as such
    ok = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
          "runAsNonRoot": True, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}
    core.create_namespaced_pod("locked", {"metadata": {"name": "fine"}, "spec": {"containers": [
        {"name": "main", "image": "busybox", "securityContext": ok}]}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("locked", {"metadata": {"name": "root"}, "spec": {
            "securityContext": {"runAsNonRoot": False},
            "containers": [{"name": "main", "image": "busybox", "securityContext": {**ok, "runAsNonRoot": None}}]}})
    assert err.value.body is not None
    assert json.loads(err.value.body)["message"].endswith(
        'violates PodSecurity "restricted:latest": runAsNonRoot != true (pod must not set '
        'securityContext.runAsNonRoot=false)')
    core.create_namespace({"metadata": {"name": "base", "labels": {"pod-security.kubernetes.io/enforce":
                                                                  "baseline"}}})
    core.create_namespaced_pod("base", bare)        # baseline asks none of these


def test_sim_the_in_cluster_watchers_pod_passes_podsecurity_restricted(fake_api):
    """The watcher's Deployment (incluster.watcher_manifest) creates its pod in the run's namespace:
    one that enforces `restricted` admits it. Before: refused on all four checks, so the
    ReplicaSet never had a pod and the run went unsupervised."""
    from orchestrator.backends.kubernetes import incluster

    core = k8s.CoreV1Api(fake_api.client)
    core.create_namespace({"metadata": {"name": "locked", "labels": {"pod-security.kubernetes.io/enforce":
                                                                    "restricted"}}})
    core.create_namespaced_service_account("locked", {"metadata": {"name": "wmctl-watcher"}})
    dep = incluster.watcher_manifest("run1", "locked", "registry.example.com/wmctl:0.9", "wmctl-watcher")
    k8s.AppsV1Api(fake_api.client).create_namespaced_deployment("locked", dep, field_validation="Strict")
    template = dep["spec"]["template"]
    # as the ReplicaSet controller creates it (pkg/controller/controller_utils.go GetPodFromTemplate)
    pod = {"metadata": {**template["metadata"], "name": "wmctl-watch-run1-abc12"}, "spec": template["spec"]}
    made = core.create_namespaced_pod("locked", pod)
    assert made.metadata.name == "wmctl-watch-run1-abc12"


def test_sim_objects_are_created_strictly_a_field_the_cluster_does_not_know_is_an_error(fake_api):
    """Creates ask for fieldValidation=Strict: a field an older cluster does not know is refused
    naming it, where the default (Warn) created the Job without it. Before: created, the field
    silently gone."""
    from orchestrator.backends.kubernetes.apply import Applier
    from orchestrator.backends.kubernetes.cluster import Cluster
    from orchestrator.errors import BackendError

    from .manifests import rendered_plan

    job = next(m for m in rendered_plan("fvs", 0).resources if m["kind"] == "Job")
    job["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "1"}}   # pod-level resources: 1.32+
    fake_api.server.schema_version = "1.30"
    applier = Applier(Cluster(fake_api.client, namespace="default"))
    with pytest.raises(BackendError) as err:
        applier.create_or_adopt(job, "default", "fvs", 0)
    assert 'strict decoding error: unknown field "spec.template.spec.resources"' in str(err.value)
    assert "does not know that field" in (err.value.hint or "")
    assert not fake_api.store.list("jobs")[0]


RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("security_context", [RESTRICTED, {}], ids=["restricted", "none"])
def test_sim_kubernetes_security_context_lets_a_job_run_where_podsecurity_is_restricted(
        fake_api, tmp_path, monkeypatch, security_context):
    """kubernetes.security_context renders the container's securityContext: in a namespace that
    enforces `restricted` the job runs to its end with the four settings; without them the refusal
    ends the attempt at once, naming kubernetes.security_context."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    outcome, lines, store, _ = _run(fake_api, {
        "name": "rsc", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 1, "backoff": "0s", "pending_timeout": "1h"},
        "kubernetes": {"namespace": "team", "security_context": security_context},
    }, {"pod-security.kubernetes.io/enforce": "restricted"}, run_seconds=0.3)
    (a0,) = store.load().attempts
    if security_context:
        assert (outcome.exit_code, a0.outcome) == (0, "succeeded"), (outcome.report, lines)
    else:
        assert (outcome.exit_code, a0.outcome) == (7, "unschedulable"), outcome.report
        assert a0.evidence is not None and "kubernetes.security_context.runAsNonRoot: true" in a0.evidence
