"""Manifests for simulations: the lead's real renderer (``rendered_plan``), and a small
hand-written Indexed Job + headless Service pair (``attempt_manifests``) for tests of the fake
server itself and of plans given as plain manifest lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends.base import attempt_name

PORT = 29500


def attempt_manifests(run: str, attempt: int, *, nodes: int = 2, namespace: str = "default",
                      image: str = "registry.example.com/team/worldmodel:v3",
                      excluded_nodes: list[str] | None = None, parent: int | None = None,
                      spec_hash: str = "0123abcd", shm: str = "1Gi") -> list[dict[str, Any]]:
    name = attempt_name(run, attempt)
    labels = {"app.kubernetes.io/managed-by": "wmctl", "wmctl.io/run": run,
              "wmctl.io/attempt": str(attempt)}
    annotations = {"wmctl.io/spec-hash": spec_hash,
                   "wmctl.io/parent-attempt": "" if parent is None else str(parent),
                   "wmctl.io/excluded-nodes": ",".join(excluded_nodes or [])}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "trainer",
            "image": image,
            "command": ["torchrun", f"--nnodes={nodes}", "--nproc-per-node=1",
                        "--node-rank=$(JOB_COMPLETION_INDEX)", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={name}-0.{name}:{PORT}", f"--rdzv-id={name}",
                        "train.py"],
            "env": [{"name": "WMCTL_RUN", "value": run},
                    {"name": "WMCTL_ATTEMPT", "value": str(attempt)},
                    {"name": "WMCTL_RESUME", "value": "1" if attempt else "0"}],
            "ports": [{"name": "c10d", "containerPort": PORT}],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                          "limits": {"memory": "4Gi"}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}],
    }
    if excluded_nodes:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "NotIn",
                "values": list(excluded_nodes)}]}]}}}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"wmctl.io/run": run, "wmctl.io/attempt": str(attempt)},
                 "ports": [{"name": "c10d", "port": PORT, "targetPort": PORT}]},
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {"completions": nodes, "parallelism": nodes, "completionMode": "Indexed",
                 "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                 "template": {"metadata": {"labels": labels, "annotations": annotations},
                              "spec": pod_spec}},
    }
    return [service, job]




def rendered_plan(run: str, attempt: int, *, nodes: int = 2, excluded_nodes: tuple[str, ...] = (),
                  parent: int | None = None, image: str = "registry.example.com/team/wm:v3",
                  namespace: str | None = None, kube: dict[str, Any] | None = None,
                  restart: dict[str, Any] | None = None):
    """The lead's real renderer (orchestrator/backends/kubernetes/render.py) for a small CPU job."""
    from orchestrator.plan import AttemptContext
    from orchestrator.backends.kubernetes.render import render_kubernetes
    from orchestrator.specload import from_dict
    from orchestrator.vendors import load_profile

    data: dict[str, Any] = {"name": run, "image": {"vendor": "cpu", "tag": image}, "nodes": nodes,
                            "command": ["python", "train.py"],
                            "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"}}
    data["kubernetes"] = {**({"namespace": namespace} if namespace else {}), **(kube or {})}
    if restart:
        data["restart"] = restart
    spec = from_dict(data)
    ctx = AttemptContext(attempt=attempt, excluded_nodes=tuple(excluded_nodes),
                         resume=attempt > 0, parent=parent)
    return render_kubernetes(spec, load_profile("cpu"), ctx)


def manifest_plan(manifests: list[dict[str, Any]], namespace: str = "default"):
    """Hand-written manifests as the Plan a Kubernetes backend submits."""
    from orchestrator.backends.kubernetes.render import KubernetesRequest
    from orchestrator.plan import Plan

    labels = manifests[-1]["metadata"]["labels"]
    return Plan(backend="kubernetes", run=labels.get("wmctl.io/run", "?"),
                attempt=int(labels.get("wmctl.io/attempt", 0)),
                spec_hash="hand", request=KubernetesRequest(namespace=namespace), resources=manifests)


REPO = Path(__file__).resolve().parents[2]


def watcher_rbac() -> list[dict[str, Any]]:
    """manifests/rbac-watcher.yaml, the permissions docs/kubernetes.md tells a cluster admin to grant."""
    return [d for d in yaml.safe_load_all((REPO / "manifests" / "rbac-watcher.yaml").read_text()) if d]


def without_nodes(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same, less the ClusterRole on Nodes: what a namespace-only admin can grant."""
    return [d for d in docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
