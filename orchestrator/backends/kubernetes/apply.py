"""Apply: an attempt's objects created (or adopted), owned, patched and deleted through the kinds
table (kinds.py), one generic path for typed kinds and custom resources alike.

Objects are created in the table's order (the Service for DNS and a PodGroup before the Job's
pods); a 409 means the object is already there (a retry after a lost response, or a second
watcher) and is adopted after its run/attempt labels are checked.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ...errors import BackendError
from ...plan import Plan
from .client import call
from .cluster import ATTEMPT_LABEL, RUN_LABEL, Cluster, Obj, api_error, reason
from .kinds import KINDS, Kind, create_order
from .render import KubernetesRequest

# the custom-objects API's name for a verb where it differs from the typed APIs'
_CUSTOM_VERB = {"read": "get"}


def plan_manifests(plan: Plan[KubernetesRequest]) -> list[Obj]:
    """The manifests of a Kubernetes plan; a plan for another backend, or one without
    manifests, is refused before anything is created."""
    if not isinstance(getattr(plan, "request", None), KubernetesRequest):
        raise BackendError(f"a {getattr(plan, 'backend', '?')} plan cannot be submitted to Kubernetes",
                           hint="render the plan for the kubernetes backend")
    found = plan.resources
    if not found or not all(isinstance(m, dict) for m in found):
        raise BackendError("the plan has no Kubernetes manifests",
                           hint="render the plan for the kubernetes backend (wmctl render)")
    return found


def kind_of(kind: str | None) -> Kind:
    found = KINDS.get(kind or "")
    if found is None:
        raise BackendError(f"the Kubernetes backend cannot create a {kind}",
                           hint=f"only {', '.join(KINDS)} manifests are supported")
    return found


def _raw(fn: Callable[..., Any]) -> Callable[..., Obj]:
    """``fn`` answering the JSON dict, without the client's model deserialisation (the caller's
    call() retries)."""
    def read(*args: Any, **kw: Any) -> Obj:
        resp = fn(*args, _preload_content=False, **kw)
        try:
            body: Obj = json.loads(resp.data)
            return body
        finally:
            resp.release_conn()
    return read


# Creates and patches ask the API server to decode strictly (fieldValidation=Strict, GA in 1.27):
# a field it does not know (a misspelling, a field newer than the cluster) is a 400 naming the
# field, where the default (Warn) drops it with only a warning header nobody reads.
STRICT = "Strict"


class Applier:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def method(self, kind: Kind, verb: str, api_version: str | None = None) -> Callable[..., Any]:
        """``verb`` for a kind, called the typed APIs' way whatever serves it: create(namespace,
        body), read(name, namespace), patch(name, namespace, body), delete(name, namespace).
        Typed kinds: ``<Api>.<verb>_namespaced_<method>``; custom resources: CustomObjectsApi with
        the group/version (``api_version``, else the table's) and plural bound."""
        if kind.api is not None:
            return getattr(self.cluster.api(kind.api), f"{verb}_namespaced_{kind.method}")
        group, version = (api_version or kind.api_version or "").split("/")
        fn = getattr(self.cluster.custom(), f"{_CUSTOM_VERB.get(verb, verb)}_namespaced_custom_object")
        if verb == "create":
            return lambda ns, body, **kw: fn(group, version, ns, kind.plural, body, **kw)
        return lambda name, ns, *rest, **kw: fn(group, version, ns, kind.plural, name, *rest, **kw)

    def create_all(self, manifests: list[Obj], namespace: str, run: str, attempt: int) -> list[tuple[Obj, Obj]]:
        """Every manifest created or adopted, in the kinds table's order, then owned by the Job:
        (manifest, the object as the API has it)."""
        made = [(m, self.create_or_adopt(m, namespace, run, attempt))
                for m in sorted(manifests, key=lambda m: create_order(m.get("kind")))]
        self.own(made, namespace)
        return made

    def create_or_adopt(self, m: Obj, namespace: str, run: str, attempt: int) -> Obj:
        kind = kind_of(m.get("kind"))
        name = (m.get("metadata") or {}).get("name")
        create, read = self.method(kind, "create", m.get("apiVersion")), self.method(kind, "read", m.get("apiVersion"))
        if kind.api is not None:
            create, read = _raw(create), _raw(read)
        what = f"create {kind.kind} {namespace}/{name}"
        try:
            made: Obj = call(create, namespace, m, what=what, field_validation=STRICT)
            return made
        except api_error() as exc:
            status, why = getattr(exc, "status", None), reason(exc)
            if status == 400 and "strict decoding error" in why:
                raise BackendError(f"Kubernetes refused to {what}: {why}",
                                   hint="this cluster's API does not know that field (it is older than the field): "
                                   "drop the spec setting that renders it (wmctl render shows the manifest), or "
                                   "upgrade the cluster") from None
            if status != 409:
                raise BackendError(f"Kubernetes refused to {what}: {status} {why}",
                                   hint="check the manifest (wmctl render) and your RBAC") from None
        existing: Obj = call(read, name, namespace, what=f"read {kind.kind} {namespace}/{name}")
        meta = existing.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(RUN_LABEL) != run or labels.get(ATTEMPT_LABEL) != str(attempt) \
                or meta.get("deletionTimestamp"):
            raise BackendError(
                f"{kind.kind} {namespace}/{name} already exists and is not attempt {attempt} of run "
                f"{run!r}" + (" (it is being deleted)" if meta.get("deletionTimestamp") else ""),
                hint=f"pick another run name, or delete it: kubectl -n {namespace} delete "
                f"{kind.kind.lower()} {name}")
        return existing

    def own(self, made: list[tuple[Obj, Obj]], namespace: str) -> None:
        """Make the Job the owner of the attempt's other objects (the kinds table says which).
        They are created before the Job (DNS and the gang must exist before its pods), so the
        reference is patched in once the Job has a uid. Best effort: an object left unowned is
        still deleted by cancel; only the TTL's cleanup would miss it."""
        job = next((obj for m, obj in made if m.get("kind") == "Job"), None)
        meta = (job or {}).get("metadata") or {}
        if not meta.get("uid"):
            return
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        for m, obj in made:
            kind = KINDS.get(m.get("kind") or "")
            refs = ((obj.get("metadata") or {}).get("ownerReferences")) or []
            if kind is None or not kind.owned or any(r.get("uid") == owner["uid"] for r in refs):
                continue
            name = obj["metadata"]["name"]
            try:
                call(self.method(kind, "patch", m.get("apiVersion")), name, namespace,
                     {"metadata": {"ownerReferences": [*refs, owner]}},
                     what=f"set the owner of {kind.kind} {namespace}/{name}", field_validation=STRICT)
            except api_error():
                pass        # 403 (no patch verb) or 404 (already gone): see the docstring
