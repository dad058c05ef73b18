"""Why the API server refused the attempt's pods, in wmctl's words (pure).

A pod the Job controller may not create is refused by an admission plugin; the user sees it only
as the controller's FailedCreate Event on the Job (classify.failed_create reads it). Two refusals
are told apart here:

- PodSecurity (staging/src/k8s.io/pod-security-admission/admission/admission.go; the checks of
  staging/src/k8s.io/pod-security-admission/policy/check_*.go): 'violates PodSecurity
  "restricted:latest": allowPrivilegeEscalation != false (container "c" must set ...), ...'. The
  namespace's level refuses the pod as rendered, every time: no wait cures it, so the attempt ends
  at once (failures.REFUSED_FOR_GOOD), naming the spec field that changes what was refused.
- ResourceQuota (staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go):
  'exceeded quota: NAME, requested: ..., used: ..., limited: ...'. The quota frees up as other
  pods end: the attempt waits, within restart.pending_timeout, naming the quota.
"""

from __future__ import annotations

import re

# The check names PodSecurity's refusal lists (policy/check_*.go, each check's ForbiddenReason),
# and what in the spec renders the field it refuses.
POD_SECURITY_FIELDS = (
    ("hostPath volumes", "volumes[].host_path (use a pvc or nfs volume)"),
    ("host namespaces", "kubernetes.host_network"),
    ("hostPort", "kubernetes.host_network"),
    ("privileged", "the vendor profile's privileged device access"),
    ("non-default capabilities", "kubernetes.capabilities"),
    ("unrestricted capabilities", "kubernetes.capabilities (restricted allows only NET_BIND_SERVICE) and "
                                  "kubernetes.security_context.capabilities.drop: [ALL]"),
    ("allowPrivilegeEscalation != false", "kubernetes.security_context.allowPrivilegeEscalation: false"),
    ("runAsNonRoot != true", "kubernetes.security_context.runAsNonRoot: true (with a non-zero runAsUser, or an "
                             "image whose USER is not root)"),
    ("runAsUser=0", "kubernetes.security_context.runAsUser"),
    ("seccompProfile", "kubernetes.security_context.seccompProfile: {type: RuntimeDefault}"),
    ("restricted volume types", "volumes[] (restricted allows pvc, emptyDir, configMap, secret, projected)"),
)
PODSECURITY, QUOTA = "PodSecurity", "ResourceQuota"
_LEVEL = re.compile(r'violates PodSecurity "([^"]+)"')
_QUOTA = re.compile(r"exceeded quota: ([^,]+),")


def explain(refusal: str) -> tuple[str, str]:
    """(reason, message) of a FailedCreate refusal: PodSecurity (with the fields to change),
    ResourceQuota (with the quota's name), else FailedCreate as the controller said it."""
    level = _LEVEL.search(refusal)
    if level is not None:
        fields = [f for check, f in POD_SECURITY_FIELDS if check in refusal[level.end():]]
        change = ("; change " + "; ".join(dict.fromkeys(fields))) if fields else ""
        namespace_level = level.group(1).split(":")[0]
        return PODSECURITY, (f"{refusal}: the namespace enforces PodSecurity {namespace_level!r}, which refuses "
                             f"these pods every time{change}, or run in a namespace whose "
                             "pod-security.kubernetes.io/enforce level allows them")
    quota = _QUOTA.search(refusal)
    if quota is not None:
        return QUOTA, (f"ResourceQuota {quota.group(1).strip()!r} is full ({refusal}); waiting for room "
                       "(kubectl describe resourcequota)")
    return "FailedCreate", refusal
