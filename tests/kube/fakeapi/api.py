"""The API server's logic (admission, defaulting, validation, deletion semantics), no HTTP.

Both the HTTP layer (server.py) and the scripted cluster's controllers (cluster.py) go
through this, so a controller's delete behaves exactly like a client's.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import podsecurity
from .store import ApiError, Obj, Store, now_rfc3339, random_suffix

DEFAULT_TOLERATION_SECONDS = 300
DEFAULT_GRACE_SECONDS = 30


@dataclass(frozen=True)
class Resource:
    group_version: str        # "v1", "batch/v1", "scheduling.volcano.sh/v1beta1"
    plural: str
    kind: str
    namespaced: bool = True
    crd: bool = False          # served only once its CustomResourceDefinition is installed

    @property
    def api_version(self) -> str:
        return self.group_version


RESOURCES: dict[tuple[str, str], Resource] = {
    (r.group_version, r.plural): r for r in [
        Resource("v1", "pods", "Pod"),
        Resource("v1", "services", "Service"),
        Resource("v1", "events", "Event"),
        Resource("v1", "configmaps", "ConfigMap"),
        Resource("v1", "nodes", "Node", namespaced=False),
        Resource("v1", "namespaces", "Namespace", namespaced=False),
        Resource("v1", "resourcequotas", "ResourceQuota"),
        Resource("batch/v1", "jobs", "Job"),
        # Stored only: no Deployment controller runs here (the watcher a Deployment would run is
        # started by the test itself, as a host process with a pod's in-cluster environment).
        Resource("apps/v1", "deployments", "Deployment"),
        Resource("scheduling.volcano.sh/v1beta1", "podgroups", "PodGroup", crd=True),
        Resource("v1", "serviceaccounts", "ServiceAccount"),
        # Stored only: what the API server's RBAC authorizer grants is rbac.py's (tests load it)
        Resource("rbac.authorization.k8s.io/v1", "roles", "Role"),
        Resource("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding"),
        Resource("v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
        Resource("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", namespaced=False),
        Resource("kueue.x-k8s.io/v1beta1", "localqueues", "LocalQueue", crd=True),
        Resource("kueue.x-k8s.io/v1beta1", "workloads", "Workload", crd=True),
        # create-only and never stored: answered from RBAC (server.py _access_review)
        Resource("authorization.k8s.io/v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview",
                 namespaced=False),
    ]
}


def _invalid(kind: str, name: str, fld: str, msg: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {fld}: {msg}',
                    {"name": name, "kind": kind,
                     "causes": [{"field": fld, "reason": "FieldValueInvalid", "message": msg}]})


# pkg/apis/core/validation/validation.go ValidateConfigMap: the values of data and binaryData
# together (`totalSize += len(value)`: Go's len, bytes, so a UTF-8 string counts its encoded
# bytes; keys are not counted) may not exceed MaxSecretSize (1 MiB, pkg/apis/core/types.go),
# checked on create and on every update (ValidateConfigMapUpdate calls ValidateConfigMap).
CONFIGMAP_MAX_BYTES = 1 * 1024 * 1024
MAX_INT32 = 2**31 - 1


def _check_job_update(old: Obj, new: Obj) -> None:
    """pkg/apis/batch/validation/validation.go validateCompletions (ValidateJobSpecUpdate): a
    Job's completions is immutable, except in an Indexed Job whose completions and parallelism
    change together and stay equal (elastic Indexed Jobs, GA in 1.31)."""
    before, after = old.get("spec") or {}, new.get("spec") or {}
    if before.get("completions") == after.get("completions"):
        return
    name = (old.get("metadata") or {}).get("name") or ""
    if after.get("completionMode") != "Indexed":
        raise _invalid("Job", name, "spec.completions", "field is immutable")
    if after.get("completions") != after.get("parallelism"):
        raise _invalid("Job", name, "spec.completions",
                       "can only be modified in tandem with spec.parallelism")


def _check_configmap(obj: Obj) -> None:
    total = 0
    for value in (obj.get("data") or {}).values():
        total += len(str(value).encode("utf-8"))
    for value in (obj.get("binaryData") or {}).values():
        total += len(str(value)) * 3 // 4      # base64 on the wire, bytes in the limit
    if total > CONFIGMAP_MAX_BYTES:
        name = (obj.get("metadata") or {}).get("name", "")
        raise _invalid("ConfigMap", name, "[]",
                       f"Too long: may not be more than {CONFIGMAP_MAX_BYTES} bytes")


def merge_patch(target: Any, patch: Any) -> Any:
    """JSON merge patch, with strategic-merge style merging of lists keyed by name/type."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and isinstance(out.get(k), list) and k in _LIST_KEYS:
            key = _LIST_KEYS[k]
            merged = [copy.deepcopy(x) for x in out[k]]
            for item in v:
                idx = next((i for i, x in enumerate(merged)
                            if isinstance(x, dict) and isinstance(item, dict)
                            and x.get(key) == item.get(key)), None)
                if idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = merge_patch(merged[idx], item)
            out[k] = merged
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


_LIST_KEYS = {"conditions": "type", "containers": "name", "containerStatuses": "name",
              "env": "name", "ports": "containerPort", "taints": "key"}


def json_patch(obj: Obj, ops: list[Obj]) -> Obj:
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = obj
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last, None)
        else:
            raise ApiError(422, "Invalid", f"unsupported json patch op {op['op']!r}")
    return obj


@dataclass
class Api:
    store: Store
    # pod logs: (namespace, pod, container) -> files, oldest first, of (unix ns, line without newline)
    logs: dict[tuple[str, str, str], list[list[tuple[int, str]]]] = field(default_factory=dict)
    requests: list[Obj] = field(default_factory=list)
    requests_lock: threading.Lock = field(default_factory=threading.Lock)
    # installed CustomResourceDefinitions, by name (<plural>.<group>): a cluster without Volcano
    # serves no podgroups (the apiextensions-apiserver registers a CRD's paths when it is created)
    crds: set[str] = field(default_factory=set)

    # --- admission and defaulting ------------------------------------------------
    def _admit(self, res: Resource, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name") or meta.get("generateName") or ""
        if not isinstance(obj.get("metadata"), dict) or not (meta.get("name") or meta.get("generateName")):
            raise _invalid(res.kind, "", "metadata.name",
                           "Required value: name or generateName is required")
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if res.plural == "pods":
            spec = obj.get("spec") or {}
            if not spec.get("containers"):
                raise _invalid("Pod", name, "spec.containers", "Required value")
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            # DefaultTolerationSeconds admission plugin
            tols = spec.setdefault("tolerations", [])
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == key and t.get("effect", "NoExecute") == "NoExecute"
                           or (t.get("operator") == "Exists" and not t.get("key")) for t in tols):
                    tols.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
            obj["spec"] = spec
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif res.plural == "jobs":
            spec = obj.get("spec") or {}
            tmpl = spec.get("template")
            if not tmpl or not (tmpl.get("spec") or {}).get("containers"):
                raise _invalid("Job", name, "spec.template.spec.containers", "Required value")
            rp = tmpl["spec"].get("restartPolicy")
            if rp not in ("Never", "OnFailure"):
                raise _invalid("Job", name, "spec.template.spec.restartPolicy",
                               f'Unsupported value: "{rp}": supported values: "OnFailure", "Never"')
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", spec["completions"])
            # pkg/apis/batch/v1/defaults.go SetDefaults_Job: MaxInt32 with backoffLimitPerIndex
            # (each index then has its own limit), else 6
            spec.setdefault("backoffLimit", MAX_INT32 if spec.get("backoffLimitPerIndex") is not None else 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            obj["spec"] = spec
            obj["status"] = {}
        elif res.plural == "services":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("clusterIP", "10.96.0.10")
        elif res.plural == "nodes":
            obj.setdefault("spec", {})
            obj.setdefault("status", {})
        elif res.plural == "configmaps":
            _check_configmap(obj)

    def _admit_pod(self, namespace: str, pod: Obj) -> None:
        """The validating admission plugins that refuse a pod the Job controller creates; the
        refusal reaches the user only as the controller's FailedCreate Event on the Job.

        PodSecurity (staging/src/k8s.io/pod-security-admission/admission/admission.go): a namespace
        labelled pod-security.kubernetes.io/enforce baseline refuses hostPath volumes, restricted
        also a container that may escalate privileges, keeps capabilities, may run as root or has
        no seccomp profile (podsecurity.py): 403 'pods "x" is forbidden: violates PodSecurity
        "baseline:latest": hostPath volumes (volume "a")'.

        ResourceQuota (staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
        controller.go): a pod that would take the namespace's pods count past a quota's
        spec.hard.pods is refused: 403 'pods "x" is forbidden: exceeded quota: NAME, requested:
        pods=1, used: pods=N, limited: pods=N'. (Only the pods count is modelled.)"""
        meta = pod.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', '')}{random_suffix()}"
        spec = pod.get("spec") or {}
        # plugin/pkg/admission/priority/admission.go: an unknown priorityClassName is refused (the
        # two system classes always exist: pkg/apis/scheduling SystemPriorityClasses).
        pc = spec.get("priorityClassName")
        if pc and pc not in ("system-cluster-critical", "system-node-critical") \
                and not self.store.exists("priorityclasses", None, pc):
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: no PriorityClass with name {pc} was found')
        # plugin/pkg/admission/serviceaccount/admission.go: the pod's ServiceAccount must exist
        # (each namespace's "default" is made by the serviceaccounts controller).
        sa = spec.get("serviceAccountName")
        if sa and sa != "default" and not self.store.exists("serviceaccounts", namespace, sa):
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: error looking up service account '
                           f'{namespace}/{sa}: serviceaccount "{sa}" not found')
        ns_obj = self.store.get("namespaces", None, namespace) if self.store.exists("namespaces", None, namespace) \
            else None
        level = (((ns_obj or {}).get("metadata") or {}).get("labels") or {}).get(
            "pod-security.kubernetes.io/enforce", "privileged")
        refused = podsecurity.violations(level, pod.get("spec") or {})     # podsecurity.py: the checks modelled
        if refused:
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity '
                           f'"{level}:latest": {refused}')
        quotas, _ = self.store.list("resourcequotas", namespace)
        for q in quotas:
            hard = ((q.get("spec") or {}).get("hard") or {}).get("pods")
            if hard is None:
                continue
            pods, _ = self.store.list("pods", namespace, lambda p: (p.get("status") or {}).get("phase")
                                      not in ("Succeeded", "Failed"))
            if len(pods) + 1 > int(hard):
                raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: '
                               f"{q['metadata']['name']}, requested: pods=1, used: pods={len(pods)}, "
                               f"limited: pods={hard}")

    def create(self, res: Resource, namespace: str | None, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        self._admit(res, obj)
        body_ns = (obj.get("metadata") or {}).get("namespace")
        if res.namespaced and body_ns and namespace and body_ns != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                           "not match the namespace sent on the request")
        if res.plural == "pods":
            self._admit_pod(namespace or body_ns or "default", obj)
        def add_selector(j: Obj) -> None:
            # The Job's selector and its template's labels keyed by the Job's uid (manualSelector
            # off), set before the Job is stored: pkg/registry/batch/job/strategy.go
            # PrepareForCreate -> generateSelector. (Set by an update after the create, the Job
            # controller could see the Job without them and make pods without `job-name`: they
            # then ran no script of the test's, exited 0 and the attempt "succeeded" without one
            # line of its log.)
            uid, jname = j["metadata"]["uid"], j["metadata"]["name"]
            labels = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                      "batch.kubernetes.io/job-name": jname, "job-name": jname}
            j["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tm = j["spec"]["template"].setdefault("metadata", {})
            tm.setdefault("labels", {}).update(labels)
        return self.store.create(res.plural, namespace if res.namespaced else None, obj,
                                 prepare=add_selector if res.plural == "jobs" else None)

    # --- updates -----------------------------------------------------------------
    def replace(self, res: Resource, namespace: str | None, name: str, body: Obj,
                subresource: str | None) -> Obj:
        expect = (body.get("metadata") or {}).get("resourceVersion") or None

        if res.plural == "configmaps":
            _check_configmap(body)

        def apply(cur: Obj) -> None:
            if subresource == "status":
                cur["status"] = copy.deepcopy(body.get("status") or {})
            else:
                if res.plural == "jobs":
                    _check_job_update(cur, body)
                status = cur.get("status")
                cur.clear()
                cur.update(copy.deepcopy(body))
                if status is not None and res.plural in ("pods", "jobs", "nodes"):
                    cur["status"] = status
        return self.store.update(res.plural, namespace, name, apply, expect_rv=expect)

    def patch(self, res: Resource, namespace: str | None, name: str, body: Any,
              content_type: str, subresource: str | None) -> Obj:
        def apply(cur: Obj) -> None:
            new = json_patch(cur, body) if "json-patch" in content_type else merge_patch(cur, body)
            if res.plural == "configmaps":
                _check_configmap(new)
            if res.plural == "jobs" and subresource != "status":
                _check_job_update(cur, new)
            if subresource == "status":
                cur["status"] = new.get("status", {})
            else:
                status = cur.get("status")
                cur.clear()
                cur.update(new)
                if status is not None and res.plural in ("pods", "jobs"):
                    cur["status"] = status
        return self.store.update(res.plural, namespace, name, apply)

    # --- deletion ----------------------------------------------------------------
    def delete(self, res: Resource, namespace: str | None, name: str,
               grace: int | None = None, propagation: str | None = None) -> Obj:
        """Returns the object (still there, with deletionTimestamp) or a Success Status."""
        cur = self.store.get(res.plural, namespace, name)
        if res.plural == "pods":
            return self.delete_pod(namespace, name, grace)
        if propagation is None:
            # batch/v1 Jobs default to orphaning their pods (a legacy REST default)
            propagation = "Orphan" if res.plural == "jobs" else "Background"
        if propagation == "Foreground":
            def mark(o: Obj) -> None:
                m = o["metadata"]
                m.setdefault("deletionTimestamp", now_rfc3339())
                m.setdefault("deletionGracePeriodSeconds", 0)
                fins = m.setdefault("finalizers", [])
                if "foregroundDeletion" not in fins:
                    fins.append("foregroundDeletion")
            return self.store.update(res.plural, namespace, name, mark)
        if propagation == "Orphan":
            self._orphan_dependents(cur["metadata"]["uid"])
        gone = self.store.remove(res.plural, namespace, name)
        if res.plural == "services":
            return gone         # services return the deleted object, like pods
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": res.group_version.rpartition("/")[0],
                            "kind": res.plural, "uid": gone["metadata"]["uid"]}}

    def _orphan_dependents(self, owner_uid: str) -> None:
        pods, _ = self.store.list("pods", None, lambda p: any(
            r.get("uid") == owner_uid for r in p["metadata"].get("ownerReferences") or []))
        for p in pods:
            def strip(o: Obj) -> None:
                o["metadata"]["ownerReferences"] = [
                    r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
            self.store.update("pods", p["metadata"]["namespace"], p["metadata"]["name"], strip)

    def delete_pod(self, namespace: str | None, name: str, grace: int | None) -> Obj:
        with self.store.cond:
            pod = self.store.get("pods", namespace, name)
            spec, status = pod.get("spec") or {}, pod.get("status") or {}
            if grace is None:
                grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
            # unscheduled or terminal pods need no kubelet confirmation
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0
            if grace <= 0:
                return self.store.remove("pods", namespace, name)
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 1e9) <= grace:
                return pod      # already terminating with a shorter or equal grace period

            def mark(o: Obj) -> None:
                when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace)
                o["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                o["metadata"]["deletionGracePeriodSeconds"] = grace
            return self.store.update("pods", namespace, name, mark)

    # --- logs ----------------------------------------------------------------------
    # A container's log is a series of files, as the kubelet keeps it: the runtime writes every
    # line with its timestamp (CRI log format) to the current file; rotation
    # (pkg/kubelet/logs/container_log_manager.go rotateLatestLog: rename 0.log to
    # 0.log.<time>, ReopenContainerLog) starts a new one. pods/log serves the current file only
    # (pkg/kubelet/kuberuntime/logs/logs.go ReadLogs opens the container's LogPath); a stream
    # that follows it reopens the new file after a rotation and reads it from its start.
    # The runtime stamps a line when the copier of its stream reads it, then writes it through the
    # writer stdout and stderr share (containerd internal/cri/io/logger.go redirectLogs: a
    # goroutine per stream, time.Now() then w.Write), so the file is not in stamp order: a line
    # can follow one stamped after it. ``stamp_lag_s``: how long before its write this line was
    # stamped (its copier waited on the shared writer or for the CPU).
    def append_log(self, namespace: str, pod: str, container: str, line: str, stamp_lag_s: float = 0.0) -> None:
        with self.store.cond:
            files = self.logs.setdefault((namespace, pod, container), [[]])
            files[-1].append((time.time_ns() - int(stamp_lag_s * 1e9), line))
            self.store.cond.notify_all()

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        with self.store.cond:
            self.logs.setdefault((namespace, pod, container), [[]]).append([])
            self.store.cond.notify_all()

    def log_file(self, namespace: str, pod: str, container: str) -> tuple[int, list[tuple[int, str]]]:
        """(generation, entries) of the current file: what pods/log can read."""
        with self.store.cond:
            files = self.logs.get((namespace, pod, container)) or [[]]
            return len(files) - 1, list(files[-1])

    def log_lines(self, namespace: str, pod: str, container: str) -> list[str]:
        return [line for _, line in self.log_file(namespace, pod, container)[1]]

    def record(self, entry: Obj) -> None:
        with self.requests_lock:
            self.requests.append(entry)

    def sent(self, verb: str | None = None, path_contains: str = "") -> list[Obj]:
        with self.requests_lock:
            return [r for r in self.requests
                    if (verb is None or r["verb"] == verb) and path_contains in r["path"]]
