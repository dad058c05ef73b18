"""`wmctl doctor --kubernetes`: the cluster preflight, against the fake API server with RBAC on.

The fake answers SelfSubjectAccessReview from its RBAC rules (server.py _access_review, after
pkg/registry/authorization/selfsubjectaccessreview/rest.go), serves discovery (/apis) with a CRD's
group only once installed, and keeps namespaces, PriorityClasses, ServiceAccounts and PVCs."""

from __future__ import annotations

import json

import pytest
import yaml
from .sdk import client
from kubernetes.client.exceptions import ApiException

from orchestrator.backends.kubernetes.doctor import ACCESS
from tests.unit.test_cli import run_main

from .fakeapi.api import RESOURCES
from .fakeapi.rbac import User
from .manifests import watcher_rbac

SA = User.service_account("training", "wmctl-watcher")


def _review(api_client, **attrs):
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    return client.AuthorizationV1Api(api_client).create_self_subject_access_review(body).status.allowed


# --- the fake's contract ------------------------------------------------------------------------
def test_contract_access_reviews_follow_the_rbac_rules(fake_api):
    editor = fake_api.as_user("ed", role="edit", namespace="training")
    assert _review(editor, verb="create", group="batch", resource="jobs", namespace="training") is True
    assert _review(editor, verb="create", group="batch", resource="jobs", namespace="other") is False
    assert _review(editor, verb="list", group="", resource="nodes") is False
    assert _review(editor, verb="get", group="", resource="pods", subresource="log", namespace="training") is True
    # nothing is stored, and asking is itself allowed to every authenticated user (system:basic-user)
    assert not fake_api.refused()
    with pytest.raises(ApiException) as err:
        client.AuthorizationV1Api(editor).create_self_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {}})
    assert err.value.body is not None
    assert err.value.status == 422 and "exactly one of" in err.value.body


def test_contract_discovery_lists_a_crds_group_only_once_installed(fake_api):
    groups = lambda: {g.name for g in client.ApisApi(fake_api.client).get_api_versions().groups}  # noqa: E731
    assert "batch" in groups() and "scheduling.volcano.sh" not in groups()
    fake_api.api.crds.add("podgroups.scheduling.volcano.sh")
    assert "scheduling.volcano.sh" in groups()


def test_the_access_table_is_manifests_rbac_watcher():
    """One fact in two places, kept equal: what doctor asks is what the manifest grants."""
    granted = set()
    for doc in watcher_rbac():
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        granted |= {(group, res, v) for v in rule["verbs"]}
    asked = {(a.group, a.resource, v) for a in ACCESS for v in a.verbs}
    # the manifest grants services and configmaps in one rule; only ConfigMaps are ever updated
    assert asked <= granted and granted - asked <= {("", "services", "update")}


# --- the product ------------------------------------------------------------------------------
def _kubeconfig(tmp_path, url, token):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "u"}}]}))
    return str(path)


def _cluster(fake_api, *, enforce="privileged", dns="cluster.local", gpus="8"):
    store_api = fake_api.api
    store_api.create(RESOURCES[("v1", "namespaces")], None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "training", "labels": {"pod-security.kubernetes.io/enforce": enforce}}})
    store_api.create(RESOURCES[("v1", "configmaps")], "kube-system", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
        "data": {"Corefile": ".:53 {\n    errors\n    kubernetes %s in-addr.arpa ip6.arpa {\n"
                             "       pods insecure\n    }\n    forward . /etc/resolv.conf\n}\n" % dns}})
    for name in ("gpu-1", "gpu-2"):
        fake_api.cluster.add_node(name, capacity={"nvidia.com/gpu": gpus})


def _spec(tmp_path, restart=None, **kube):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        **({"restart": restart} if restart else {}),
        "name": "wm", "nodes": 2, "accelerators_per_node": 8,
        "image": {"vendor": "cuda", "tag": "registry.example.com/wm:v1"}, "command": ["python", "train.py"],
        "resources": {"cpu": 8, "memory": "64Gi", "shm": "8Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"},
                    {"name": "data", "mount": "/data", "host_path": "/mnt/data"}],
        "kubernetes": {"namespace": "training", **kube}}))
    return str(path)


def test_sim_doctor_passes_a_ready_cluster_for_the_watcher_service_account(fake_api, tmp_path, monkeypatch, capsys):
    _cluster(fake_api)
    fake_api.api.create(RESOURCES[("v1", "persistentvolumeclaims")], "training", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "wm-ckpt", "namespace": "training"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}})
    fake_api.as_user("sa-token", SA, manifests=watcher_rbac())
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, fake_api.server.url, "sa-token"))
    code, out, err = run_main(["doctor", "--kubernetes", "--spec", _spec(tmp_path), "-o", "json"], capsys)
    report = json.loads(out)
    assert code == 0, (out, err)
    assert report["errors"] == 0 and report["namespace"] == "training"
    assert {f["check"] for f in report["findings"]} >= {"access jobs", "access nodes", "devices", "pvc wm-ckpt",
                                                        "pod security", "cluster domain"}
    # the watcher's Role grants no read of PVCs, its namespace or kube-system: those checks say so
    refused = {r["path"].rsplit("/", 2)[-2] for r in fake_api.refused()}
    assert refused <= {"persistentvolumeclaims", "namespaces", "configmaps"}
    levels = {f["check"]: f["level"] for f in report["findings"]}
    assert levels["access jobs"] == levels["access nodes"] == levels["devices"] == "ok"
    assert levels["pvc wm-ckpt"] == "warn" and levels["pod security"] == "warn"


def test_sim_doctor_names_every_reason_a_cluster_would_fail_the_job(fake_api, tmp_path, monkeypatch, capsys):
    """A namespace `edit` user, a baseline namespace, no Volcano, no PriorityClass, no PVC, a
    wrong cluster domain and nodes with too few GPUs: exit 9, each reason named with its fix."""
    _cluster(fake_api, enforce="baseline", dns="corp.internal", gpus="4")
    fake_api.as_user("ed", role="edit", namespace="training")
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, fake_api.server.url, "ed"))
    spec = _spec(tmp_path, scheduler="volcano", priority_class="train-high")
    code, out, err = run_main(["doctor", "--kubernetes", "--spec", spec], capsys)
    assert code == 9, (out, err)
    assert "[error] access podgroups: cannot get, create, delete, patch podgroups in namespace training" in out
    assert "[warn ] access nodes: cannot get, list, watch nodes" in out
    assert "node loss is judged from the pods' own conditions" in out
    assert "serves no scheduling.volcano.sh API" in out
    assert "'wm-ckpt', which does not exist" in out
    assert "cannot read 'train-high' (403); not checked" in out          # cluster-scoped: edit may not read it
    assert "refuses hostPath volume 'data'" in out
    assert "Traceback" not in out + err
    # a cluster admin sees what the namespace user could not: the PriorityClass and the DNS domain
    fake_api.as_user("root", role="cluster-admin")
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, fake_api.server.url, "root"))
    code, out, err = run_main(["doctor", "--kubernetes", "--spec", spec], capsys)
    assert code == 9, (out, err)
    assert "'train-high', which does not exist" in out
    assert "serves corp.internal" in out and "set kubernetes.cluster_domain: corp.internal" in out
    assert "0 node(s) have 8 allocatable nvidia.com/gpu; the job needs 2" in out


def test_sim_doctor_asks_what_spare_nodes_need_only_for_a_spec_with_spares(fake_api, tmp_path, monkeypatch, capsys):
    """restart.spares: the store's pod is created and the keepers get a Role: a namespace `edit`
    user may do neither (the built-in edit role has no Roles), and doctor says so; a spec without
    spares does not ask."""
    _cluster(fake_api)
    fake_api.as_user("ed", role="edit", namespace="training")
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, fake_api.server.url, "ed"))
    _, out, err = run_main(["doctor", "--kubernetes", "--spec", _spec(tmp_path, restart={"spares": 1})], capsys)
    assert "[error] access roles: cannot get, create, delete, patch roles in namespace training" in out, out
    assert "[error] access rolebindings" in out and "Traceback" not in out + err
    _, out, _ = run_main(["doctor", "--kubernetes", "--spec", _spec(tmp_path)], capsys)
    assert "access roles" not in out


def test_sim_doctor_counts_devices_when_it_may_list_nodes(fake_api, tmp_path, monkeypatch, capsys):
    _cluster(fake_api, gpus="4")
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, fake_api.server.url, "anyone"))
    code, out, _ = run_main(["doctor", "--kubernetes", "--vendor", "cuda", "-n", "training"], capsys)
    assert code == 0 and "node(s) with 1 allocatable nvidia.com/gpu" in out
    code, out, _ = run_main(["doctor", "--kubernetes", "--spec", _spec(tmp_path)], capsys)
    assert code == 9 and "0 node(s) have 8 allocatable nvidia.com/gpu; the job needs 2" in out


def test_doctor_kubernetes_options_need_the_flag(capsys):
    code, _, err = run_main(["doctor", "-n", "training"], capsys)
    assert code == 2 and "--kubernetes" in err
