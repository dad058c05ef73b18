"""Every rendered Kubernetes object validates strictly against the official schemas.

kubernetes-validate bundles the upstream OpenAPI-derived JSON schemas; the strict variants
reject unknown fields, so a misspelt key in a template fails here, not on a cluster. The
Volcano PodGroup is a CRD (no bundled schema) and is checked structurally instead.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext
from orchestrator.backends.kubernetes.render import render_kubernetes
from orchestrator.vendors import available_profiles, load_profile

from .helpers import full_spec

VERSIONS = ["1.30", "1.34", "1.37"]
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "kueue": {"kubernetes.queue": "team-a"},
    "volcano": {"kubernetes.scheduler": "volcano", "kubernetes.queue": "research"},
    "no-memory-limit": {"resources.memory": None, "resources.cpu": None},
    "user-tolerations": {"kubernetes.tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute",
         "tolerationSeconds": 60},
        {"operator": "Exists"}]},
    "pod-knobs": {"kubernetes.pod_annotations": {"sidecar.istio.io/inject": "false",
                                                 "k8s.v1.cni.cncf.io/networks": "rdma-net@ib0"},
                  "kubernetes.extra_resources": {"rdma/hca_shared_devices_a": "1", "hugepages-1Gi": "8Gi"},
                  "kubernetes.host_network": True, "kubernetes.capabilities": ["IPC_LOCK", "CAP_SYS_NICE"],
                  "kubernetes.secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}}},
}


def objects_for(vendor: str, variant: str, attempt: int = 2):
    spec = full_spec(vendor, **VARIANTS[variant])
    ctx = AttemptContext(attempt=attempt, excluded_nodes=("node-a", "node-b"), resume=True, parent=attempt - 1)
    return render_kubernetes(spec, load_profile(vendor), ctx).resources


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("vendor", available_profiles())
def test_rendered_objects_pass_strict_schema(vendor, variant, version):
    for obj in objects_for(vendor, variant):
        if obj["apiVersion"].startswith("scheduling.volcano.sh/"):
            assert obj["kind"] == "PodGroup" and obj["spec"]["minMember"] == 2
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    job = next(o for o in objects_for("cuda", "plain") if o["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.34", strict=True)


def test_job_shape_for_supervised_retries():
    objs = objects_for("musa", "plain")
    job = next(o for o in objs if o["kind"] == "Job")
    svc = next(o for o in objs if o["kind"] == "Service")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"]
    # The FQDN kubelet puts first in pod 0's /etc/hosts: torch's _matches_machine_hostname
    # compares it with the canonical name, so pod 0 hosts the store without a DNS lookup.
    assert "--rdzv-endpoint=worldmodel-a2-0.worldmodel-a2.training.svc.cluster.local:29500" in c["command"]
    assert "--rdzv-id=worldmodel-a2" in c["command"] and "--max-restarts=0" in c["command"]
    assert c["command"][c["command"].index("--no-python") + 1:][:2] == ["--", "wmctl-bind"]
    rank = next(e for e in c["env"] if e["name"] == "PET_NODE_RANK")
    assert "job-completion-index" in rank["valueFrom"]["fieldRef"]["fieldPath"]
    shm = next(v for v in pod["volumes"] if v["name"] == "wmctl-dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert c["resources"]["limits"]["mthreads.com/gpu"] == "8"   # a Quantity is a string (the client refuses an int)
    assert c["resources"]["limits"]["memory"] == "512Gi"
    tol = {t["key"]: t for t in pod["tolerations"]}
    assert tol["node.kubernetes.io/unreachable"]["tolerationSeconds"] == 20
    assert tol["node.kubernetes.io/not-ready"]["effect"] == "NoExecute"
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr == {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a", "node-b"]}
    assert job["metadata"]["labels"]["wmctl.io/attempt"] == "2"
    assert job["metadata"]["annotations"]["wmctl.io/parent-attempt"] == "1"
    assert pod["terminationGracePeriodSeconds"] >= 60


def test_kueue_and_volcano():
    kueue = next(o for o in objects_for("cuda", "kueue") if o["kind"] == "Job")
    assert kueue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert kueue["spec"]["suspend"] is True
    volcano = objects_for("cuda", "volcano")
    job = next(o for o in volcano if o["kind"] == "Job")
    group = next(o for o in volcano if o["kind"] == "PodGroup")
    assert job["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["scheduling.k8s.io/group-name"] == group["metadata"]["name"]
    assert group["spec"]["queue"] == "research" and "suspend" not in job["spec"]


def test_rendezvous_endpoint_follows_cluster_domain_and_namespace():
    spec = full_spec("cuda", **{"kubernetes.cluster_domain": "k8s.corp.example", "kubernetes.namespace": "team"})
    job = next(o for o in render_kubernetes(spec, load_profile("cuda")).resources if o["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    host = next(a for a in pod["containers"][0]["command"] if a.startswith("--rdzv-endpoint="))
    # <hostname>.<subdomain>.<namespace>.svc.<domain>: exactly the name the kubelet writes.
    assert host == f"--rdzv-endpoint=worldmodel-a0-0.{pod['subdomain']}.team.svc.k8s.corp.example:29500"


@pytest.mark.parametrize("domain", ["Cluster.Local", "cluster..local", "-bad.local", "a" * 64 + ".local",
                                    "cluster.local.", "cluster local", ""])
def test_cluster_domain_must_be_a_dns_name(domain):
    with pytest.raises(SpecError) as err:
        full_spec("cuda", **{"kubernetes.cluster_domain": domain})
    assert "cluster.local" in dict(err.value.problems)["kubernetes.cluster_domain"]


def test_node_loss_timeout_rounds_up_to_a_whole_second():
    for given, want in (("0.4s", 1), ("0s", 1), ("1.2s", 2), ("20s", 20)):
        spec = full_spec("cuda", **{"restart.node_loss_timeout": given})
        job = next(o for o in render_kubernetes(spec, load_profile("cuda")).resources if o["kind"] == "Job")
        tol = {t["key"]: t for t in job["spec"]["template"]["spec"]["tolerations"]}
        assert tol["node.kubernetes.io/unreachable"]["tolerationSeconds"] == want, given
        assert tol["node.kubernetes.io/not-ready"]["tolerationSeconds"] == want, given


def test_fractional_cpu_renders_millicores():
    spec = full_spec("cuda", **{"resources.cpu": 0.001})
    job = next(o for o in render_kubernetes(spec, load_profile("cuda")).resources if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1m"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_in_cluster_watcher_deployment_passes_strict_schema(version):
    from orchestrator.backends.kubernetes.incluster import watcher_manifest

    dep = watcher_manifest("wm-run", "training", "registry.example.com/wmctl:0.9", "wmctl-watcher", ["regcred"])
    kubernetes_validate.validate(dep, version, strict=True)
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
