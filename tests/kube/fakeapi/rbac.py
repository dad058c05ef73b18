"""Authentication (bearer tokens) and RBAC authorisation for the fake API server.

Off by default (every request allowed, as the fake always was); a test turns it on with
``server.rbac = Rbac()`` and gives users their roles, either the built-in aggregated roles
(``view``/``edit``/``admin``/``cluster-admin``) or the Role/ClusterRole/binding documents of a
manifest such as manifests/rbac-watcher.yaml.

What it follows upstream (kubernetes/kubernetes):
- request attributes (verb, API group, resource, subresource, namespace, name) are resolved
  from the path alone, without knowing which resources exist:
  staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go (RequestInfoFactory).
- authorisation runs before routing: DefaultBuildHandlerChain in
  staging/src/k8s.io/apiserver/pkg/server/config.go wraps the API mux in WithAuthorization
  (staging/src/k8s.io/apiserver/pkg/endpoints/filters/authorization.go), so a user who may not
  touch a resource gets 403 even when no such resource is served (a CRD not installed); only an
  authorised request reaches the mux and its 404.
- rule matching: plugin/pkg/auth/authorizer/rbac/rbac.go with pkg/apis/rbac/v1/evaluation_helpers.go
  (VerbMatches, APIGroupMatches, ResourceMatches with "*", "resource/subresource" and
  "*/subresource", ResourceNameMatches); a RoleBinding grants only in its own namespace, a
  ClusterRoleBinding everywhere.
- the 403 body: staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go
  (forbiddenMessage) inside apierrors.NewForbidden (staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go).
- the built-in roles: plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go as expanded in
  plugin/pkg/auth/authorizer/rbac/bootstrappolicy/testdata/cluster-roles.yaml: ``view``,
  ``edit`` and ``admin`` aggregate system:aggregate-to-view / -edit / -admin (edit also takes
  view, admin also takes edit). None of them grants anything on Nodes (cluster-scoped) or on
  any CRD such as Volcano's podgroups.
- service-account users: system:serviceaccount:<ns>:<name> in groups system:serviceaccounts,
  system:serviceaccounts:<ns> and system:authenticated
  (staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .store import ApiError

READ = ("get", "list", "watch")
WRITE = ("create", "delete", "deletecollection", "patch", "update")


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()

    @classmethod
    def of(cls, doc: dict[str, Any]) -> "Rule":
        return cls(tuple(doc.get("apiGroups") or ()), tuple(doc.get("resources") or ()),
                   tuple(doc.get("verbs") or ()), tuple(doc.get("resourceNames") or ()))

    def allows(self, a: "Attributes") -> bool:
        # evaluation_helpers.go: VerbMatches, APIGroupMatches, ResourceMatches, ResourceNameMatches
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        if "*" not in self.api_groups and a.group not in self.api_groups:
            return False
        combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        if not any(r == "*" or r == combined or (a.subresource and r == f"*/{a.subresource}")
                   for r in self.resources):
            return False
        return not self.resource_names or a.name in self.resource_names


def _rules(*specs: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]) -> tuple[Rule, ...]:
    return tuple(Rule(g, r, v) for g, r, v in specs)


# bootstrappolicy/testdata/cluster-roles.yaml, the rules of the three aggregation sources
# (only API groups wmctl could ever touch are transcribed; the rest grant nothing it uses).
AGGREGATE_TO_VIEW = _rules(
    (("",), ("configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
             "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
             "services/status"), READ),
    (("",), ("bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
             "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"), READ),
    (("",), ("namespaces",), READ),
    (("batch",), ("cronjobs", "cronjobs/status", "jobs", "jobs/status"), READ),
    (("apps",), ("deployments", "deployments/scale", "deployments/status"), READ),
)
AGGREGATE_TO_EDIT = _rules(
    (("",), ("pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"), READ),
    (("",), ("serviceaccounts",), ("impersonate",)),
    (("",), ("pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"), WRITE),
    (("",), ("pods/eviction",), ("create",)),
    (("",), ("configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
             "replicationcontrollers/scale", "secrets", "serviceaccounts", "services", "services/proxy"), WRITE),
    (("",), ("serviceaccounts/token",), ("create",)),
    (("batch",), ("cronjobs", "jobs"), WRITE),
    (("apps",), ("deployments", "deployments/rollback", "deployments/scale"), WRITE),
    (("coordination.k8s.io",), ("leases",), READ + WRITE),
)
AGGREGATE_TO_ADMIN = _rules(
    (("authorization.k8s.io",), ("localsubjectaccessreviews",), ("create",)),
    (("rbac.authorization.k8s.io",), ("rolebindings", "roles"), READ + WRITE),
)
# system:basic-user, bound to the group system:authenticated by the bootstrap policy
# (bootstrappolicy/policy.go, ClusterRoleBindings): every user may ask what it may do.
BASIC_USER = _rules((("authorization.k8s.io",), ("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
                     ("create",)))
BUILTIN_CLUSTER_ROLES: dict[str, tuple[Rule, ...]] = {
    "view": AGGREGATE_TO_VIEW,
    "edit": AGGREGATE_TO_EDIT + AGGREGATE_TO_VIEW,
    "admin": AGGREGATE_TO_ADMIN + AGGREGATE_TO_EDIT + AGGREGATE_TO_VIEW,
    "cluster-admin": _rules((("*",), ("*",), ("*",))),
}


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ("system:authenticated",)

    @classmethod
    def service_account(cls, namespace: str, name: str) -> "User":
        return cls(f"system:serviceaccount:{namespace}:{name}",
                   ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str


def request_attributes(method: str, path: str, query: dict[str, str]) -> Attributes | None:
    """requestinfo.go's resolution, from the path alone; None for a non-resource path."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 2:
        namespace = rest[1]
        if len(rest) > 2:
            rest = rest[2:]
        else:
            rest = ["namespaces", rest[1]]      # GET /api/v1/namespaces/x: the namespace itself
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "GET": "get", "DELETE": "delete"}[method]
    if method == "GET" and query.get("watch") in ("true", "1"):
        verb = "watch"
    elif method == "GET" and not name:
        verb = "list"
    elif method == "DELETE" and not name:
        verb = "deletecollection"
    if verb in ("list", "watch") and not name:
        # requestinfo.go: a list or watch whose field selector requires metadata.name exactly is
        # a request for that one object, so a rule's resourceNames can allow it
        for part in (query.get("fieldSelector") or "").split(","):
            key, sep, value = part.partition("==") if "==" in part else part.partition("=")
            if sep and key.strip() == "metadata.name" and not key.endswith("!"):
                name = value.strip()
    return Attributes(verb, group, version, resource, sub, namespace, name)


@dataclass
class Binding:
    subjects: tuple[str, ...]            # user names, or "group:<name>"
    rules: tuple[Rule, ...]
    namespace: str | None                # None: a ClusterRoleBinding


@dataclass
class Rbac:
    tokens: dict[str, User] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=lambda: [
        Binding(("group:system:authenticated",), BASIC_USER, None)])
    cluster_roles: dict[str, tuple[Rule, ...]] = field(default_factory=lambda: dict(BUILTIN_CLUSTER_ROLES))
    roles: dict[tuple[str, str], tuple[Rule, ...]] = field(default_factory=dict)

    # --- set-up ------------------------------------------------------------------------------
    def add_user(self, token: str, user: User) -> User:
        self.tokens[token] = user
        return user

    def rotate(self, old: str, new: str) -> None:
        """A credential that expires and is renewed: ``old`` is refused from now on (401, as the
        token authenticator refuses an expired or revoked token: authentication.go answers
        Unauthorized for every failed authenticator) and ``new`` is the same user's. What
        renews it (a tokenFile rewritten by a sidecar, a fresh OIDC login) is the client's side."""
        user = self.tokens.pop(old)
        self.tokens[new] = user

    def expire(self, token: str) -> None:
        """``token`` is refused from now on, and nothing renews it."""
        self.tokens.pop(token, None)

    def bind(self, user: User, cluster_role: str, namespace: str | None = None) -> None:
        """A RoleBinding of ``cluster_role`` in ``namespace`` (None: a ClusterRoleBinding)."""
        self.bindings.append(Binding((user.name,), self.cluster_roles[cluster_role], namespace))

    def load(self, docs: list[dict[str, Any]]) -> None:
        """Role, ClusterRole, RoleBinding and ClusterRoleBinding documents (other kinds ignored)."""
        for d in docs:
            meta = d.get("metadata") or {}
            if d.get("kind") == "ClusterRole":
                self.cluster_roles[meta["name"]] = tuple(Rule.of(r) for r in d.get("rules") or [])
            elif d.get("kind") == "Role":
                self.roles[(meta["namespace"], meta["name"])] = tuple(Rule.of(r) for r in d.get("rules") or [])
        for d in docs:
            if d.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            meta, ref = d.get("metadata") or {}, d["roleRef"]
            ns = meta.get("namespace") if d["kind"] == "RoleBinding" else None
            rules = (self.cluster_roles[ref["name"]] if ref["kind"] == "ClusterRole"
                     else self.roles[(ns or "", ref["name"])])
            subjects = []
            for s in d.get("subjects") or []:
                if s["kind"] == "ServiceAccount":
                    subjects.append(User.service_account(s.get("namespace") or ns or "", s["name"]).name)
                elif s["kind"] == "Group":
                    subjects.append(f"group:{s['name']}")
                else:
                    subjects.append(s["name"])
            self.bindings.append(Binding(tuple(subjects), rules, ns))

    # --- requests ------------------------------------------------------------------------------
    def authenticate(self, authorization: str | None) -> User:
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        user = self.tokens.get(token) if scheme.lower() == "bearer" else None
        if user is None:
            # staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go: 401, no detail
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def allowed(self, user: User, a: Attributes) -> bool:
        names = {user.name, *(f"group:{g}" for g in user.groups)}
        for b in self.bindings:
            if not names.intersection(b.subjects):
                continue
            if b.namespace is not None and b.namespace != a.namespace:
                continue
            if any(r.allows(a) for r in b.rules):
                return True
        return False

    def authorize(self, user: User, a: Attributes) -> None:
        if self.allowed(user, a):
            return
        raise forbidden(user, a)


def forbidden(user: User, a: Attributes) -> ApiError:
    """errors.go forbiddenMessage inside apierrors.NewForbidden."""
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    why = f'User "{user.name}" cannot {a.verb} resource "{resource}" in API group "{a.group}" {scope}'
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    message = f'{qualified} "{a.name}" is forbidden: {why}' if a.name else f"{qualified} is forbidden: {why}"
    return ApiError(403, "Forbidden", message, {"name": a.name, "group": a.group, "kind": a.resource})
