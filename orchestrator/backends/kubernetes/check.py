"""Spec problems only Kubernetes has."""

from __future__ import annotations

import re

from ...spec import ANNOTATIONS_MAX_BYTES, ANNOTATIONS_WMCTL_RESERVE, JobSpec
from ...names import is_dns_subdomain, is_env_name
from ...validate import Problems

# Patterns as text: re compiles (and keeps) each one when a check first uses it.
# A qualified name (label and annotation keys, resource names): an optional DNS-subdomain prefix
# and '/', then a name of at most 63 characters (apimachinery/pkg/util/validation IsQualifiedName).
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# A resource.Quantity without sign or exponent (what a user writes: 1, 8Gi, 500m, 1.5G).
QUANTITY = r"^(\d+(\.\d+)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
# Native resources a spec may add beside cpu/memory (resources.cpu/.memory set those).
NATIVE_EXTRA = r"^(hugepages-\d+(Ki|Mi|Gi)|ephemeral-storage)$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"        # core/v1 validation: IsConfigMapKey
CAPABILITY = r"^[A-Z][A-Z0-9_]*$"
# PodSecurity "baseline" allows adding only these (pod-security-admission policy
# check_capabilities_baseline.go); anything else needs a privileged namespace.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def volume_problems(spec: JobSpec) -> Problems:
    """Docker resolves a relative host_path against the spec folder and local maps it; a
    Kubernetes hostPath is a path on whichever node runs the pod, so it must be absolute."""
    return [(f"volumes[{i}].host_path", f"{vol.host_path!r} is relative; Kubernetes needs an absolute path "
             "on the node, e.g. /mnt/ckpt (or use a pvc or nfs volume)")
            for i, vol in enumerate(spec.volumes)
            if vol.host_path is not None and not vol.host_path.startswith("/")]


def pod_problems(spec: JobSpec, device_resource: str | None = None) -> Problems:
    """kubernetes.pod_annotations, extra_resources, capabilities and secret_env, checked as the API
    server would (so a bad one fails at render, not at submit) and against what wmctl sets itself."""
    out = _annotation_problems(spec) + _resource_problems(spec, device_resource)
    for i, cap in enumerate(spec.kubernetes.capabilities):
        bare = cap[4:] if isinstance(cap, str) and cap.startswith("CAP_") else cap
        if not isinstance(bare, str) or not re.fullmatch(CAPABILITY, bare):
            out.append((f"kubernetes.capabilities[{i}]", f"{cap!r} is not a Linux capability name like IPC_LOCK"))
    if spec.kubernetes.runtime_class is not None and not is_dns_subdomain(spec.kubernetes.runtime_class):
        out.append(("kubernetes.runtime_class", f"{spec.kubernetes.runtime_class!r} is not a RuntimeClass name: "
                    "lowercase letters, digits, '-' and '.', e.g. nvidia or kata-qemu"))
    return out + _secret_env_problems(spec) + security_problems(spec.kubernetes.security_context)


def _annotation_problems(spec: JobSpec) -> Problems:
    k = spec.kubernetes
    out: Problems = []
    for key in k.pod_annotations:
        if not re.fullmatch(QUALIFIED_NAME, key):
            out.append((f"kubernetes.pod_annotations.{key}", "not a valid annotation key (an optional DNS prefix "
                        "and '/', then letters, digits, - _ .), e.g. sidecar.istio.io/inject"))
        elif key.startswith("wmctl.io/"):
            out.append((f"kubernetes.pod_annotations.{key}", "wmctl.io/ annotations are wmctl's own; use another key"))
    size = sum(len(key.encode()) + len((v or "").encode()) for key, v in k.pod_annotations.items())
    if size > ANNOTATIONS_MAX_BYTES - ANNOTATIONS_WMCTL_RESERVE:
        out.append(("kubernetes.pod_annotations", f"{size:,} bytes in all; the API server refuses more than "
                    f"{ANNOTATIONS_MAX_BYTES:,} per object"))
    return out


def _resource_problems(spec: JobSpec, device_resource: str | None) -> Problems:
    k = spec.kubernetes
    out: Problems = []
    hugepages = False
    for name, qty in k.extra_resources.items():
        path = f"kubernetes.extra_resources.{name}"
        if name in ("cpu", "memory"):
            out.append((path, f"set resources.{name} instead"))
            continue
        if device_resource and name == device_resource:
            out.append((path, "this is the vendor's device resource; set accelerators_per_node instead"))
            continue
        native = bool(re.fullmatch(NATIVE_EXTRA, name))
        if not native and ("/" not in name or not re.fullmatch(QUALIFIED_NAME, name)):
            out.append((path, "not a resource name: an extended resource has a domain, e.g. "
                        "rdma/hca_shared_devices_a or nvidia.com/mig-1g.10gb; native ones are hugepages-2Mi, "
                        "hugepages-1Gi, ephemeral-storage"))
            continue
        if not re.fullmatch(QUANTITY, qty or ""):
            out.append((path, f"{qty!r} is not a quantity like 1, 8Gi or 500m"))
        elif not native and not name.endswith(".kubernetes.io") and not qty.isdigit():
            # core/v1 validation: extended resources must be whole numbers
            out.append((path, f"{qty!r}: an extended resource is counted in whole units, e.g. 1"))
        elif qty.isdigit() and int(qty) == 0:
            out.append((path, "0 asks for nothing; remove the entry"))
        hugepages = hugepages or name.startswith("hugepages-")
    if hugepages and spec.resources.cpu is None and spec.resources.memory is None:
        # core/v1 validation ValidateResourceRequirements: "HugePages require cpu or memory"
        out.append(("kubernetes.extra_resources", "hugepages need resources.memory (or resources.cpu) set too; "
                    "the API server refuses a pod asking for hugepages alone"))
    return out


def _secret_env_problems(spec: JobSpec) -> Problems:
    out: Problems = []
    for var, ref in spec.kubernetes.secret_env.items():
        path = f"kubernetes.secret_env.{var}"
        if not is_env_name(var):
            out.append((path, "not an environment variable name (letters, digits, _; not starting with a digit)"))
        elif var.startswith("WMCTL_"):
            out.append((path, "WMCTL_* variables are set by wmctl"))
        elif var in spec.env:
            out.append((path, f"env.{var} sets it too; keep one"))
        if not is_dns_subdomain(ref.secret or ""):
            out.append((f"{path}.secret", f"{ref.secret!r} is not a Secret name: lowercase letters, digits, '-' "
                        "and '.'"))
        if not re.fullmatch(SECRET_KEY, ref.key or "") or len(ref.key) > 253:
            out.append((f"{path}.key", f"{ref.key!r} is not a Secret key: letters, digits, '-', '_' and '.'"))
    return out


def capabilities(spec: JobSpec) -> list[str]:
    """The capabilities to add, as Kubernetes names them (without CAP_), in order, once each."""
    seen: list[str] = []
    for cap in spec.kubernetes.capabilities:
        bare = cap[4:] if cap.startswith("CAP_") else cap
        if bare not in seen:
            seen.append(bare)
    return seen


# core/v1 SecurityContext (k8s.io/api/core/v1 types.go): the fields a container may set, and the
# kinds of their values ("profile": {type, localhostProfile}). windowsOptions is left out: the
# pods run Linux.
_SECURITY_FIELDS = {"runAsUser": "id", "runAsGroup": "id", "runAsNonRoot": "bool", "allowPrivilegeEscalation": "bool",
                    "readOnlyRootFilesystem": "bool", "privileged": "bool", "procMount": "procMount",
                    "seccompProfile": "profile", "appArmorProfile": "profile", "capabilities": "capabilities",
                    "seLinuxOptions": "seLinux"}
_PROFILE_TYPES = ("RuntimeDefault", "Localhost", "Unconfined")


def security_problems(sc: dict[str, object]) -> Problems:
    """kubernetes.security_context, checked as the API server's ValidateSecurityContext would (and
    against the kubelet's runAsNonRoot check): a wrong one fails at render, not as a pod that never
    starts."""
    out: Problems = []
    if not isinstance(sc, dict):
        return [("kubernetes.security_context", "a mapping of securityContext fields, e.g. {runAsNonRoot: true}")]
    for key, value in sc.items():
        path = f"kubernetes.security_context.{key}"
        kind = _SECURITY_FIELDS.get(key)
        if kind is None:
            out.append((path, f"not a container securityContext field; known: {', '.join(sorted(_SECURITY_FIELDS))}"))
        elif kind == "bool" and not isinstance(value, bool):
            out.append((path, f"{value!r}: true or false"))
        elif kind == "id" and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1):
            out.append((path, f"{value!r}: a user or group id, 0 to 2147483647"))
        elif kind == "procMount" and value not in ("Default", "Unmasked"):
            out.append((path, f"{value!r}: Default or Unmasked"))
        elif kind == "profile":
            out += _profile_problems(path, value)
        elif kind == "capabilities":
            if not isinstance(value, dict) or set(value) - {"drop", "add"}:
                out.append((path, "{drop: [ALL]}: capabilities to drop"))
            elif "add" in value:
                out.append((f"{path}.add", "add capabilities with kubernetes.capabilities (checked against "
                            "PodSecurity there)"))
            elif not isinstance(value.get("drop"), list) or not all(
                    isinstance(c, str) and re.fullmatch(CAPABILITY, c) for c in value["drop"]):
                out.append((f"{path}.drop", f"{value.get('drop')!r}: a list of capability names, e.g. [ALL]"))
        elif kind == "seLinux" and (not isinstance(value, dict) or set(value) - {"user", "role", "type", "level"}):
            out.append((path, "{user, role, type, level}: SELinux labels"))
    if sc.get("privileged") is True and sc.get("allowPrivilegeEscalation") is False:
        # core/v1 validation ValidateSecurityContext: a privileged container always may escalate
        out.append(("kubernetes.security_context", "privileged: true with allowPrivilegeEscalation: false is "
                    "refused by the API server; drop one"))
    if sc.get("runAsNonRoot") is True and sc.get("runAsUser") == 0:
        # the kubelet's verifyRunAsNonRoot: the container would never start (CreateContainerConfigError)
        out.append(("kubernetes.security_context", "runAsNonRoot: true with runAsUser: 0 never starts; give a "
                    "non-zero runAsUser"))
    return out


def _profile_problems(path: str, value: object) -> Problems:
    if not isinstance(value, dict) or value.get("type") not in _PROFILE_TYPES or set(value) - {"type",
                                                                                              "localhostProfile"}:
        return [(path, f"{value!r}: {{type: RuntimeDefault}} (or Localhost with localhostProfile, or Unconfined)")]
    if (value["type"] == "Localhost") != bool(value.get("localhostProfile")):
        return [(f"{path}.localhostProfile", "set it with type Localhost only (the profile's file on the node)")]
    return []
