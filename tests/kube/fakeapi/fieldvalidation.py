"""Server-side field validation of a create (``?fieldValidation=Strict``).

The API server decodes a create's body strictly when asked: a field the kind's schema does not
know is 400 BadRequest, '<Kind> in version "<v>" cannot be handled as a <Kind>: strict decoding
error: unknown field "spec.template.spec.containers[0].imagePullPolicyy"'
(staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go createHandler, the decode error
through transformDecodeError; the strict serializer of
staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go). Without it (the default
since 1.27 is Warn) the field is dropped with only a warning: an older cluster silently loses
what it does not know. Upstream lists every unknown field; the fake names the first.

wmctl's creates and patches ask for it (backends/kubernetes/apply.py STRICT). When they first did,
the supervisor simulation test_sim_supervisor_replaces_an_attempt_that_lost_a_node lost rank 0's
log lines in 3-4 runs of 10 (5 of 20 when measured again): the check's load widened a race in the
fake itself, whose Job controller could make pods from a Job stored without its job-name labels
(they then ran no script of the test's). The Job is now stored complete (api.py add_selector).

The schemas are kubernetes-validate's offline copies of the API's OpenAPI documents (built-in
kinds only; a custom resource is not checked here), of the fake server's ``schema_version``
(1.34, what its /version says; a test sets an older one to play an older cluster).
"""

from __future__ import annotations

from typing import Any

from .store import ApiError

def _path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def check_strict(res_kind: str, group_version: str, body: Any, crd: bool, schema_version: str) -> None:
    """Raise the API server's 400 for the first unknown field of ``body`` (see the docstring)."""
    if crd or not isinstance(body, dict):
        return
    import kubernetes_validate      # only a strict create asks

    doc = {"apiVersion": group_version, "kind": res_kind, **body}
    try:
        kubernetes_validate.validate(doc, schema_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        if err.validator != "additionalProperties":
            return          # only unknown fields are the strict decoder's; the rest is validation's
        extra = sorted(set((err.instance or {}).keys()) - set((err.schema or {}).get("properties") or {}))
        field = _path([*err.path, extra[0]]) if extra else _path(list(err.path))
        version = group_version.split("/")[-1]
        raise ApiError(400, "BadRequest", f'{res_kind} in version "{version}" cannot be handled as a {res_kind}: '
                       f'strict decoding error: unknown field "{field}"') from None
