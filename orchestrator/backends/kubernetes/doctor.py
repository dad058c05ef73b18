"""``wmctl doctor --kubernetes``: a cluster preflight a user runs before the first submit.

Each check asks the API server, as this user, one question and says what a "no" means:
- SelfSubjectAccessReview for every verb wmctl uses (``ACCESS``, kept equal to
  manifests/rbac-watcher.yaml by a test), and which features degrade without Node access;
- the vendor's device resource allocatable on the nodes the spec can use;
- the Volcano / Kueue API groups (discovery) when the spec asks for them;
- the spec's PriorityClass, ServiceAccount and PVCs;
- the namespace's PodSecurity level against the spec's hostPath volumes (the vendor's driver
  mounts included), hostNetwork and capabilities;
- the cluster DNS domain the rendezvous host is built from (kubernetes.cluster_domain).
A check this user may not run is a warning, never a silent pass.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from typing import Any

from ... import labels as L
from ...adaptors import kubernetes as sdk
from ...runtime.preflight import Finding
from ...spec import JobSpec
from ...vendors import VendorProfile
from .check import BASELINE_CAPABILITIES, capabilities
from .client import call_json

Obj = dict[str, Any]


@dataclass(frozen=True)
class Access:
    group: str
    resource: str                 # "pods/log": resource/subresource
    verbs: tuple[str, ...]
    why: str
    cluster: bool = False         # cluster-scoped (Nodes)
    degrades: str = ""            # optional: what works less well without it
    only_for: str = ""            # only for specs that ask for this queue or scheduler (a GROUPS key), or "spares"


# Every verb wmctl uses; tests/kube/test_doctor.py keeps this equal to manifests/rbac-watcher.yaml.
ACCESS: tuple[Access, ...] = (
    Access("batch", "jobs", ("get", "list", "watch", "create", "delete", "patch"),
           "each attempt is a Job; patch writes cancel's intent"),
    Access("", "pods", ("get", "list", "watch", "delete"), "pods are watched, and force-deleted on lost nodes"),
    Access("", "pods", ("create", "patch"), "the spare nodes' c10d store runs in a pod of its own", only_for="spares"),
    Access("rbac.authorization.k8s.io", "roles", ("get", "create", "delete", "patch"),
           "the spare nodes' keepers read their rounds ConfigMap", only_for="spares"),
    Access("rbac.authorization.k8s.io", "rolebindings", ("get", "create", "delete", "patch"),
           "the spare nodes' keepers read their rounds ConfigMap", only_for="spares"),
    Access("", "pods/log", ("get",), "progress and heartbeats are read from rank 0's log, "
           "a dead rank 0's node from index 1's (its witness)"),
    Access("", "services", ("get", "list", "create", "delete", "patch"), "the rendezvous host's headless Service"),
    Access("", "configmaps", ("get", "list", "create", "delete", "patch"), "attempt configuration"),
    Access("", "configmaps", ("update",), "the run's state in the cluster",
           degrades="the run's state cannot be kept in the cluster (WMCTL_RUN_STORE=kubernetes, submit --in-cluster)"),
    Access("", "events", ("list",), "how a Job the TTL removed had ended"),
    Access("apps", "deployments", ("get", "delete"), "the in-cluster watcher's Deployment",
           degrades="a watcher started by submit --in-cluster cannot remove its own Deployment when the run ends"),
    Access("scheduling.volcano.sh", "podgroups", ("get", "create", "delete", "patch"), "the Volcano gang",
           only_for="volcano"),
    Access(L.KUEUE_GROUP, "workloads", ("get", "list"), "why Kueue holds the Job", only_for="kueue",
           degrades="a Job Kueue holds is said to wait, without Kueue's reason (a full queue, a missing LocalQueue)"),
    Access(L.KUEUE_GROUP, "workloads", ("patch",), "cancel --graceful through Kueue", only_for="kueue",
           degrades="cancel --graceful suspends the Job instead, which Kueue may start again while its pods save"),
    Access("", "nodes", ("get", "list", "watch"), "node conditions", cluster=True,
           degrades="node loss is judged from the pods' own conditions instead, up to 5 s later (a deleted "
           "Node: up to a minute later), and cancel finds pods on lost nodes from their pods"),
)

# pod-security.kubernetes.io/enforce levels (Pod Security Standards): baseline forbids hostPath
# volumes, hostNetwork and capabilities beyond its list (pod-security-admission policy
# check_hostPathVolumes.go, check_hostNamespaces.go, check_capabilities_baseline.go); restricted
# forbids those and asks for runAsNonRoot, a seccomp profile and dropping ALL capabilities,
# which a training image's pod does not declare.
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
GROUPS = {"volcano": "scheduling.volcano.sh", "kueue": L.KUEUE_GROUP}
# CoreDNS's kubernetes plugin names the zones it serves: "kubernetes cluster.local in-addr.arpa ..."
COREDNS_ZONES = re.compile(r"^\s*kubernetes\s+([^{\n]+)", re.MULTILINE)


def check_cluster(api_client: Any, namespace: str, spec: JobSpec | None = None,
                  profile: VendorProfile | None = None) -> list[Finding]:
    """Every check, in order; an unreachable API raises EngineUnavailable (exit 5)."""
    findings = access_findings(api_client, namespace, wanted_groups(spec))
    findings += device_findings(api_client, spec, profile)
    if spec is not None:
        findings += scheduler_findings(api_client, spec)
        findings += reference_findings(api_client, namespace, spec)
        findings += pod_security_findings(api_client, namespace, spec, profile)
    findings.append(dns_finding(api_client, spec.kubernetes.cluster_domain if spec else "cluster.local"))
    return findings


def _get(api_client: Any, api: str, method: str, *args: str) -> Obj:
    """``<api>.<method>(*args)`` as raw JSON (no model deserialisation); ApiException propagates."""
    fn = getattr(getattr(sdk.sdk(), api)(api_client), method)
    return call_json(fn, *args, what=f"{method} {' '.join(args)}".strip())


def _allowed(api_client: Any, namespace: str, a: Access, verb: str) -> bool:
    resource, _, sub = a.resource.partition("/")
    attrs = {"verb": verb, "group": a.group, "resource": resource}
    if sub:
        attrs["subresource"] = sub
    if not a.cluster:
        attrs["namespace"] = namespace
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}}
    api = sdk.sdk().AuthorizationV1Api(api_client)
    review = call_json(api.create_self_subject_access_review, body, what="create a SelfSubjectAccessReview")
    return bool((review.get("status") or {}).get("allowed"))


def wanted_groups(spec: JobSpec | None) -> list[str]:
    """The GROUPS (queue or gang scheduler) the spec asks for, and "spares" (restart.spares)."""
    if spec is None:
        return []
    k = spec.kubernetes
    return [name for name, on in (("volcano", k.scheduler == "volcano"),
                                  ("kueue", bool(k.queue) and k.scheduler != "volcano"),
                                  ("spares", spec.restart.spares > 0)) if on]


def access_findings(api_client: Any, namespace: str, wanted: list[str]) -> list[Finding]:
    out: list[Finding] = []
    for a in ACCESS:
        if a.only_for and a.only_for not in wanted:
            continue
        missing = [v for v in a.verbs if not _allowed(api_client, namespace, a, v)]
        where = "cluster-wide" if a.cluster else f"in namespace {namespace}"
        check = f"access {a.resource}"
        if not missing:
            out.append(Finding("ok", check, f"{', '.join(a.verbs)} {where}"))
        elif a.degrades:
            out.append(Finding("warn", check, f"cannot {', '.join(missing)} {a.resource} {where}: {a.degrades}",
                               "grant the ClusterRole wmctl-watcher-nodes of manifests/rbac-watcher.yaml" if a.cluster
                               else "grant the Role of manifests/rbac-watcher.yaml in this namespace"))
        else:
            out.append(Finding("error", check, f"cannot {', '.join(missing)} {a.resource} {where} ({a.why})",
                               "grant the Role of manifests/rbac-watcher.yaml in this namespace"))
    return out


def _nodes(api_client: Any) -> list[Obj] | None:
    ApiException = sdk.api_exception()
    try:
        return call_json(sdk.sdk().CoreV1Api(api_client).list_node, what="list nodes")["items"]
    except ApiException as exc:
        if exc.status == 403:
            return None
        raise


def device_findings(api_client: Any, spec: JobSpec | None, profile: VendorProfile | None) -> list[Finding]:
    if profile is None or not profile.resource:
        return []
    resource = profile.resource
    nodes = _nodes(api_client)
    if nodes is None:
        return [Finding("warn", "devices", f"cannot list Nodes to count {resource}",
                        "ask an admin, or run: kubectl describe nodes | grep " + resource)]
    want = 1
    need_nodes = 1
    selector: dict[str, str] = {}
    if spec is not None:
        from ...launch import accelerators_per_node
        want = accelerators_per_node(spec, profile) or 1
        need_nodes = spec.nodes
        selector = dict(spec.kubernetes.node_selector)
    fit = []
    for n in nodes:
        labels = (n.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        have = str(((n.get("status") or {}).get("allocatable") or {}).get(resource, "0"))
        if have.isdigit() and int(have) >= want:
            fit.append(n["metadata"]["name"])
    if len(fit) >= need_nodes:
        return [Finding("ok", "devices", f"{len(fit)} node(s) with {want} allocatable {resource}")]
    return [Finding("error", "devices", f"{len(fit)} node(s) have {want} allocatable {resource}"
                    f"{' and match node_selector' if selector else ''}; the job needs {need_nodes}",
                    "check the device plugin on the nodes (kubectl describe node), node_selector and "
                    "accelerators_per_node")]


def scheduler_findings(api_client: Any, spec: JobSpec) -> list[Finding]:
    wanted = [name for name in wanted_groups(spec) if name in GROUPS]
    if not wanted:
        return []
    served = {g.get("name") for g in _get(api_client, "ApisApi", "get_api_versions").get("groups") or []}
    out = []
    for name in wanted:
        group = GROUPS[name]
        if group in served:
            out.append(Finding("ok", name, f"API group {group} is served"))
        else:
            out.append(Finding("error", name, f"the spec asks for {name.capitalize()}, but the cluster serves no "
                               f"{group} API (its CRDs are not installed)",
                               f"install {name.capitalize()}, or drop kubernetes."
                               f"{'scheduler' if name == 'volcano' else 'queue'}"))
    return out


def reference_findings(api_client: Any, namespace: str, spec: JobSpec) -> list[Finding]:
    k = spec.kubernetes
    refs: list[tuple[str, str, str, tuple[str, ...]]] = []       # (check, field, method, args)
    if k.priority_class:
        refs.append(("priority class", "kubernetes.priority_class", "SchedulingV1Api.read_priority_class",
                     (k.priority_class,)))
    if k.service_account:
        refs.append(("service account", "kubernetes.service_account", "CoreV1Api.read_namespaced_service_account",
                     (k.service_account, namespace)))
    for i, vol in enumerate(spec.volumes):
        if vol.pvc:
            refs.append((f"pvc {vol.pvc}", f"volumes[{i}].pvc",
                         "CoreV1Api.read_namespaced_persistent_volume_claim", (vol.pvc, namespace)))
    ApiException = sdk.api_exception()
    out = []
    for check, fld, method, args in refs:
        name = args[0]
        try:
            _get(api_client, *method.split("."), *args)
        except ApiException as exc:
            if exc.status == 404:
                # the Job controller's pods would fail creation (FailedCreate) and the run sit Pending
                out.append(Finding("error", check, f"{fld} names {name!r}, which does not exist",
                                   f"create it, or fix {fld}"))
            else:
                out.append(Finding("warn", check, f"cannot read {name!r} ({exc.status}); not checked"))
            continue
        out.append(Finding("ok", check, f"{name!r} exists"))
    return out


def pod_security_findings(api_client: Any, namespace: str, spec: JobSpec,
                          profile: VendorProfile | None) -> list[Finding]:
    ApiException = sdk.api_exception()
    try:
        ns = _get(api_client, "CoreV1Api", "read_namespace", namespace)
    except ApiException as exc:
        return [Finding("warn", "pod security", f"cannot read namespace {namespace} ({exc.status}); its "
                        "PodSecurity level was not checked")]
    level = ((ns.get("metadata") or {}).get("labels") or {}).get(PSA_ENFORCE, "privileged")
    needs = [f"hostPath volume {v.name!r}" for v in spec.volumes if v.host_path]
    if profile is not None:
        needs += [f"the {profile.name} driver mount {p}" for p in profile.kubernetes.host_mounts]
    if spec.kubernetes.host_network:
        needs.append("hostNetwork")
    needs += [f"capability {c}" for c in capabilities(spec) if c not in BASELINE_CAPABILITIES]
    if level == "privileged" or (not needs and level == "baseline"):
        return [Finding("ok", "pod security", f"namespace {namespace} enforces {level}")]
    if level == "restricted" and not needs:
        needs = ["a pod without runAsNonRoot, a seccomp profile and dropped capabilities"]
    return [Finding("error", "pod security", f"namespace {namespace} enforces PodSecurity {level!r}, which "
                    f"refuses {', '.join(needs)}: the Job's pods would never be created",
                    f"label the namespace {PSA_ENFORCE}=privileged (or baseline without those), or drop them "
                    "from the spec")]


def dns_finding(api_client: Any, domain: str) -> Finding:
    """The cluster's DNS domain, from CoreDNS's Corefile (kube-system/coredns, as kubeadm and most
    distributions deploy it), else by resolving the API Service's name from inside the cluster."""
    ApiException = sdk.api_exception()
    zones: list[str] | None = None
    try:
        cm = _get(api_client, "CoreV1Api", "read_namespaced_config_map", "coredns", "kube-system")
        found = COREDNS_ZONES.findall(((cm.get("data") or {}).get("Corefile")) or "")
        zones = [z.rstrip(".") for line in found for z in line.split()
                 if not z.endswith(".arpa") and not z.endswith(".arpa.")] or None
    except ApiException:
        zones = None
    if zones is not None:
        if domain in zones:
            return Finding("ok", "cluster domain", f"{domain} (CoreDNS serves {', '.join(zones)})")
        return Finding("error", "cluster domain", f"kubernetes.cluster_domain is {domain}, but the cluster's DNS "
                       f"serves {', '.join(zones)}: every pod would fail to reach the rendezvous host",
                       f"set kubernetes.cluster_domain: {zones[0]}")
    try:
        socket.getaddrinfo(f"kubernetes.default.svc.{domain}", 443)
        return Finding("ok", "cluster domain", f"kubernetes.default.svc.{domain} resolves")
    except (OSError, UnicodeError):
        return Finding("warn", "cluster domain", f"could not verify {domain} (no readable CoreDNS ConfigMap, and "
                       f"kubernetes.default.svc.{domain} does not resolve from here)",
                       "ask an admin for the kubelet's --cluster-domain")


def report_json(findings: list[Finding], namespace: str) -> str:
    errors = sum(f.level == "error" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    return json.dumps({"namespace": namespace, "findings": [f.to_dict() for f in findings],
                       "errors": errors, "warnings": warns}, indent=2)
