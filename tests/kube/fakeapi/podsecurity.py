"""PodSecurity admission's checks of a pod, as the fake models them: baseline's hostPath volumes and
restricted's four container checks.

Upstream (staging/src/k8s.io/pod-security-admission/policy/), each check a CheckPod function:

- check_hostPathVolumes.go (baseline): no hostPath volume; reason "hostPath volumes", detail
  'volume "a"' ("volumes" for several);
- check_allowPrivilegeEscalation.go allowPrivilegeEscalation_1_8 (restricted): every container
  sets securityContext.allowPrivilegeEscalation=false;
- check_capabilities_restricted.go capabilitiesRestricted_1_22: every container drops "ALL" and
  adds nothing but NET_BIND_SERVICE;
- check_runAsNonRoot.go runAsNonRoot_1_34: runAsNonRoot=true on the pod, or on every container
  (none sets it false);
- check_seccompProfile_restricted.go seccompProfileRestricted_1_19: seccompProfile.type
  RuntimeDefault or Localhost on the pod, or on every container (none sets another type).

admission.go refuses the pod with 'violates PodSecurity "<level>:latest": ' and each failed
check's "reason (detail)", joined by ", " in the checks' ID order. The restricted level runs the
baseline checks too. Only these checks are modelled (not baseline's privileged, hostNetwork,
capabilities beyond the baseline set, ...); init containers are visited like containers.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _named(noun: str, names: list[str]) -> str:
    return f"{noun if len(names) == 1 else noun + 's'} {_quote(names)}"


def _host_path(spec: Obj) -> tuple[str, str] | None:
    host = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    if not host:
        return None
    return "hostPath volumes", _named("volume", host)


def _allow_privilege_escalation(spec: Obj) -> tuple[str, str] | None:
    bad = [c["name"] for c in _all_containers(spec)
           if ((c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False)]
    if not bad:
        return None
    return ("allowPrivilegeEscalation != false",
            f"{_named('container', bad)} must set securityContext.allowPrivilegeEscalation=false")


def _capabilities(spec: Obj) -> tuple[str, str] | None:
    missing, adding, added = [], [], set()
    for c in _all_containers(spec):
        caps = (c.get("securityContext") or {}).get("capabilities")
        if caps is None:
            missing.append(c["name"])
            continue
        if "ALL" not in (caps.get("drop") or []):
            missing.append(c["name"])
        extra = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c["name"])
            added.update(extra)
    details = []
    if missing:
        details.append(f'{_named("container", missing)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_named('container', adding)} must not include {_quote(sorted(added))} in "
                       "securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _pod_or_containers(spec: Obj, key: str, ok: Any) -> tuple[list[str], bool, list[str], list[str]]:
    """(bad setters, pod level ok, explicitly bad containers, implicitly bad containers) for a
    setting the pod may set for all its containers (runAsNonRoot, seccompProfile)."""
    setters, pod_ok = [], False
    pod_value = (spec.get("securityContext") or {}).get(key)
    if pod_value is not None:
        if ok(pod_value):
            pod_ok = True
        else:
            setters.append("pod")
    explicit, implicit = [], []
    for c in _all_containers(spec):
        value = (c.get("securityContext") or {}).get(key)
        if value is not None:
            if not ok(value):
                explicit.append(c["name"])
        elif not pod_ok:
            implicit.append(c["name"])
    return setters, pod_ok, explicit, implicit


def _run_as_non_root(spec: Obj) -> tuple[str, str] | None:
    setters, _, explicit, implicit = _pod_or_containers(spec, "runAsNonRoot", lambda v: v is True)
    if explicit:
        setters.append(_named("container", explicit))
    if setters:
        return "runAsNonRoot != true", f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return ("runAsNonRoot != true",
                f"pod or {_named('container', implicit)} must set securityContext.runAsNonRoot=true")
    return None


def _seccomp(spec: Obj) -> tuple[str, str] | None:
    def ok(profile: Any) -> bool:
        return isinstance(profile, dict) and profile.get("type") in ("RuntimeDefault", "Localhost")
    setters, _, explicit, implicit = _pod_or_containers(spec, "seccompProfile", ok)
    if explicit:
        setters.append(_named("container", explicit))
    if setters:
        values = sorted({str((p or {}).get("type")) for p in
                         [(spec.get("securityContext") or {}).get("seccompProfile")]
                         + [(c.get("securityContext") or {}).get("seccompProfile") for c in _all_containers(spec)]
                         if p is not None and not ok(p)})
        return "seccompProfile", f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to " \
                                 f"{_quote(values)}"
    if implicit:
        return ("seccompProfile", f'pod or {_named("container", implicit)} must set '
                'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return None


def _all_containers(spec: Obj) -> list[Obj]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


# (check ID, level, check): evaluated in ID order, as the registry orders them
CHECKS = sorted([
    ("allowPrivilegeEscalation", "restricted", _allow_privilege_escalation),
    ("capabilities_restricted", "restricted", _capabilities),
    ("hostPathVolumes", "baseline", _host_path),
    ("runAsNonRoot", "restricted", _run_as_non_root),
    ("seccompProfile_restricted", "restricted", _seccomp),
], key=lambda c: c[0])


def violations(level: str, spec: Obj) -> str | None:
    """What PodSecurity at ``level`` says of a pod with ``spec``: None when it is allowed, else the
    refusal after 'violates PodSecurity "<level>:latest": '."""
    if level not in ("baseline", "restricted"):
        return None
    failed = [check(spec) for _, lvl, check in CHECKS if level == "restricted" or lvl == "baseline"]
    found = [f"{reason} ({detail})" for reason, detail in (f for f in failed if f is not None)]
    return ", ".join(found) or None
