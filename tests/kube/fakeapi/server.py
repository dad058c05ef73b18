"""HTTP layer of the fake Kubernetes API server (standard library only).

Speaks the REST paths the official client uses: /api/v1/..., /apis/<group>/<version>/...,
get/list/watch/create/replace/patch/delete, pods/log (follow), status subresources. Watches
stream newline-delimited JSON events over chunked transfer encoding, like the real server.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .api import RESOURCES, Api, Resource
from .faults import Faults
from .fieldvalidation import check_strict
from .rbac import Attributes, Rbac, request_attributes
from .selectors import SelectorError, field_matcher, label_matcher
from .store import ApiError, Gone, Obj, Store

MAX_WATCH_SECONDS = 1800


class _Dropped(Exception):
    """The connection was cut on purpose (fault injection)."""


def parse_path(path: str, crds: set[str] | None = None) -> tuple[Resource, str | None, str | None, str | None]:
    """-> (resource, namespace, name, subresource); ApiError 404 for unknown paths and for a
    custom resource whose CRD is not installed (``crds``: installed <plural>.<group> names)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        gv, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    res = RESOURCES.get((gv, rest[0]))
    if res is None or (res.crd and crds is not None
                       and f"{res.plural}.{res.group_version.split('/')[0]}" not in crds):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return res, namespace, name, sub


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeApiServer"

    def log_message(self, fmt: str, *args: Any) -> None:   # keep test output quiet
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without NODELAY, Nagle + delayed ACK
        # would add ~40 ms to every request, which a real apiserver does not
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # --- plumbing ------------------------------------------------------------------
    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise ApiError(400, "BadRequest", "request body is not valid JSON") from err

    def _send(self, code: int, payload: Any, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self._entry["code"] = code
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.server.streaming.add(self.client_address)
        self._entry["code"] = 200
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stall(self) -> None:
        """A half-open stream (faults.stall_streams): send nothing more and never close; the
        handler thread idles until the server stops."""
        self.close_connection = True
        self.server.stopping.wait()

    def _drop(self) -> None:
        """Cut the connection without a proper end (what a dying server/LB does)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.server.streaming.discard(self.client_address)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # --- dispatch ------------------------------------------------------------------
    def _dispatch(self, verb: str) -> None:
        api: Api = self.server.api
        self._entry: Obj = {}
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        is_watch = verb == "GET" and query.get("watch") in ("true", "1")
        body: Any = None
        try:
            body = self._body()
        except ApiError as err:
            self._send(err.code, err.status())
            return
        self._entry = {"verb": verb, "path": url.path, "query": query, "body": body,
                            "time": time.time(), "code": None}
        api.record(self._entry)
        rule = self.server.faults.match(verb, url.path, is_watch)
        if rule is not None and rule.action == "error":
            if rule.code == 429:
                # maxinflight.go tooManyRequests: http.Error's plain text, with Retry-After
                text = (rule.message or "Too many requests, please try again later.") + "\n"
                self._send(429, text.encode(), "text/plain; charset=utf-8",
                           headers={"Retry-After": rule.retry_after or "1"})
                return
            fault = ApiError(rule.code, rule.reason, f"injected fault: {rule.code} {rule.reason}")
            self._send(rule.code, fault.status(),
                       headers={"Retry-After": rule.retry_after} if rule.retry_after else None)
            return
        if rule is not None and rule.action == "delay":
            time.sleep(rule.delay_s)     # faults.delay_next: a slow API server or kubelet
        if verb == "GET" and url.path in ("/apis", "/apis/"):
            self._send(200, self._api_groups())
            return
        if url.path in ("/version", "/version/"):      # behind the faults: an outage takes it too
            self._version()
            return
        lose = rule is not None and rule.action == "lose_response"
        try:
            self._authorize(verb, url.path, query)
            res, ns, name, sub = parse_path(url.path, api.crds)
            if verb == "GET" and sub == "log":
                if lose:
                    self._drop()
                    return
                self._logs(res, ns, name, query)
                return
            if is_watch:
                if lose:
                    self._drop()
                    return
                self._watch(res, ns, query)
                return
            code, payload = self._handle(verb, res, ns, name, sub, query, body)
        except ApiError as err:
            code, payload = err.code, err.status()
        except SelectorError as err:
            code, payload = 400, ApiError(400, "BadRequest", str(err)).status()
        except _Dropped:
            return
        if lose:
            self._drop()
            return
        self._send(code, payload)

    def _version(self) -> None:
        """GET /version (staging/src/k8s.io/apimachinery/pkg/version/types.go: Info), readable by
        anyone (system:public-info-viewer). WithAuthentication wraps every path
        (staging/src/k8s.io/apiserver/pkg/server/config.go DefaultBuildHandlerChain): a credential
        sent and rejected is 401 even here; only a request without one is anonymous."""
        if self.server.rbac is not None and self.headers.get("Authorization"):
            try:
                self.server.rbac.authenticate(self.headers.get("Authorization"))
            except ApiError as err:
                self._send(err.code, err.status())
                return
        self._send(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "gitCommit": "0" * 40,
                         "gitTreeState": "clean", "buildDate": "2025-08-27T00:00:00Z", "goVersion": "go1.24.6",
                         "compiler": "gc", "platform": "linux/amd64"})

    def _api_groups(self) -> Obj:
        """GET /apis (discovery, readable by every user: system:discovery): the APIGroupList of the
        groups served, a CRD's group only once the CRD is installed (the aggregated discovery of
        staging/src/k8s.io/apiserver/pkg/endpoints/discovery/root.go)."""
        crds = self.server.api.crds
        groups: dict[str, list[str]] = {}
        for res in RESOURCES.values():
            if "/" not in res.group_version:
                continue
            group, version = res.group_version.split("/")
            if res.crd and f"{res.plural}.{group}" not in crds:
                continue
            groups.setdefault(group, []).append(version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(set(vs))],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in sorted(groups.items())]}

    def _access_review(self, body: Any) -> Obj:
        """A SelfSubjectAccessReview, answered and not stored, as
        pkg/registry/authorization/selfsubjectaccessreview/rest.go Create does: exactly one of
        spec.resourceAttributes / spec.nonResourceAttributes (validation: 422 otherwise), the
        requesting user's attributes run through the same authorizer as a real request (here: the
        fake's RBAC; with RBAC off every request is allowed, as with AlwaysAllow)."""
        spec = (body or {}).get("spec") or {}
        res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if (res is None) == (non is None):
            raise ApiError(422, "Invalid", "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: "
                           "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes "
                           "or resourceAttributes must be specified")
        rbac: Rbac | None = self.server.rbac
        allowed, reason = True, ""
        if rbac is not None and res is not None:
            user = rbac.authenticate(self.headers.get("Authorization"))
            attrs = Attributes(res.get("verb") or "", res.get("group") or "", res.get("version") or "",
                               res.get("resource") or "", res.get("subresource") or "",
                               res.get("namespace") or "", res.get("name") or "")
            allowed = rbac.allowed(user, attrs)
            reason = "" if not allowed else "RBAC: allowed by a binding"
        out: Obj = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
               "metadata": {"creationTimestamp": None}, "spec": spec, "status": {"allowed": allowed}}
        if reason:
            out["status"]["reason"] = reason
        return out

    def _authorize(self, verb: str, path: str, query: dict[str, str]) -> None:
        """Authentication, then RBAC, before any routing (see rbac.py): a forbidden request for a
        resource that is not served is 403, not 404."""
        rbac: Rbac | None = self.server.rbac
        attrs = request_attributes(verb, path, query)
        if rbac is None or attrs is None:
            return
        user = rbac.authenticate(self.headers.get("Authorization"))
        self._entry["user"] = user.name
        rbac.authorize(user, attrs)

    def _handle(self, verb: str, res: Resource, ns: str | None, name: str | None,
                sub: str | None, query: dict[str, str], body: Any) -> tuple[int, Obj]:
        api: Api = self.server.api
        if res.namespaced and name is None and verb == "POST" and ns is None:
            raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
        if verb == "POST" and name is None and query.get("fieldValidation") == "Strict":
            check_strict(res.kind, res.group_version, body, res.crd, self.server.schema_version)
        if verb == "GET" and name is None:
            return 200, self._list(res, ns, query)
        if verb == "POST" and res.plural == "selfsubjectaccessreviews":
            return 201, self._access_review(body)
        if verb == "POST":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a JSON object body is required")
            return 201, api.create(res, ns, body)
        if name is None:        # PUT, PATCH and DELETE name their object (no deletecollection here)
            raise ApiError(405, "MethodNotAllowed", f"{verb} needs an object's name in the path")
        if verb == "GET" and res.plural == "namespaces":
            try:
                return 200, api.store.get("namespaces", None, name)
            except ApiError:    # namespaces exist implicitly
                return 200, {"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": name}, "status": {"phase": "Active"}}
        if verb == "GET":
            return 200, api.store.get(res.plural, ns, name)
        if verb == "PUT":
            return 200, api.replace(res, ns, name, body or {}, sub)
        if verb == "PATCH":
            return 200, api.patch(res, ns, name, body, self.headers.get("Content-Type", ""), sub)
        if verb == "DELETE":
            opts = body if isinstance(body, dict) else {}
            grace = opts.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
            prop = opts.get("propagationPolicy", query.get("propagationPolicy"))
            if opts.get("orphanDependents") is True and prop is None:
                prop = "Orphan"
            obj = api.delete(res, ns, name, None if grace is None else int(grace), prop)
            # deletion pending (finalizers, foreground GC): 202 Accepted with the object
            pending = obj.get("kind") != "Status" and res.plural != "pods" \
                and bool((obj.get("metadata") or {}).get("deletionTimestamp"))
            return (202 if pending else 200), obj
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported")

    def _matcher(self, res: Resource, query: dict[str, str]):
        lm = label_matcher(query.get("labelSelector"))
        fm = field_matcher(res.plural, query.get("fieldSelector"))
        return lambda o: lm(o) and fm(o)

    def _list(self, res: Resource, ns: str | None, query: dict[str, str]) -> Obj:
        store: Store = self.server.api.store
        match = self._matcher(res, query)
        rv = query.get("resourceVersion")
        # resourceVersionMatch=NotOlderThan / Exact on a compacted RV is 410 like the real server
        if rv not in (None, "", "0") and query.get("resourceVersionMatch") == "Exact" \
                and int(rv) < store.oldest_rv:
            raise Gone(int(rv), store.oldest_rv)
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        if limit < 0:
            raise ApiError(400, "BadRequest", f"limit: must be non-negative, got {limit}")
        if not limit and not token:
            items, cur = store.list(res.plural, ns if res.namespaced else None, match)
            return {"apiVersion": res.api_version, "kind": res.kind + "List",
                    "metadata": {"resourceVersion": str(cur)}, "items": items}
        return self._list_page(res, ns, query, match, limit, token)

    def _list_page(self, res: Resource, ns: str | None, query: dict[str, str], match, limit: int,
                   token: str | None) -> Obj:
        """One page of a chunked list (apimachinery pkg/apis/meta/v1/types.go ListOptions
        ``limit``/``continue``; KEP-365 API list chunking). The first page fixes a revision; each
        page ends with a ``continue`` token naming that revision and the last key served (what
        staging/src/k8s.io/apiserver/pkg/storage/continue.go EncodeContinue holds), and the
        last page has none. A token whose revision was compacted away is 410 Expired with the
        message of staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go (continueExpired):
        the client lists again from the start. Differences, said here: etcd serves every page
        at the first page's revision; this fake serves the remainder from the current objects
        (a consumer that diffs, or watches from the list's resourceVersion, sees the same end
        state). A token with a ``resourceVersion`` other than 0 is 400, as storage ValidateListOptions says."""
        store: Store = self.server.api.store
        start, snap = "", None
        if token:
            if query.get("resourceVersion") not in (None, "", "0"):
                raise ApiError(400, "BadRequest", "specifying resource version is not allowed "
                               "when using continue")
            try:
                data = json.loads(base64.b64decode(token.encode(), validate=True))
                start, snap = str(data["start"]), int(data["rv"])
                if data.get("v") != "meta.k8s.io/v1":
                    raise ValueError(data.get("v"))
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid: incorrect encoded "
                               "start resourceVersion (version meta.k8s.io/v1)") from None
            if snap < store.oldest_rv:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                               "consistent list result. You can start a new list without the continue "
                               "parameter.")
        with store.cond:
            items, cur = store.list(res.plural, ns if res.namespaced else None, match)
        keyed = sorted(((_list_key(o), o) for o in items), key=lambda kv: kv[0])
        rest = [(k, o) for k, o in keyed if k > start]
        page = rest[:limit] if limit else rest
        meta: Obj = {"resourceVersion": str(snap if snap is not None else cur)}
        if limit and len(rest) > limit:
            meta["continue"] = base64.b64encode(json.dumps(
                {"v": "meta.k8s.io/v1", "rv": snap if snap is not None else cur,
                 "start": page[-1][0]}).encode()).decode()
        return {"apiVersion": res.api_version, "kind": res.kind + "List", "metadata": meta,
                "items": [o for _, o in page]}

    # --- watch -------------------------------------------------------------------
    def _watch(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        store: Store = self.server.api.store
        faults: Faults = self.server.faults
        match = self._matcher(res, query)   # raises SelectorError before headers go out
        timeout = min(float(query.get("timeoutSeconds") or MAX_WATCH_SECONDS), MAX_WATCH_SECONDS)
        deadline = time.monotonic() + timeout
        generation, stall = faults.watch_generation, faults.stall_generation
        rv_param = query.get("resourceVersion")
        # Watch bookmarks (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks,
        # KEP-956): asked for with allowWatchBookmarks, sent at the server's discretion, a BOOKMARK
        # event whose object is the watched kind with only metadata.resourceVersion set: every
        # change up to it was delivered (the watch cache's bookmark, staging/src/k8s.io/apiserver/
        # pkg/storage/cacher/cacher.go). A client resuming from it is not sent back into 410.
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        next_bookmark = time.monotonic() + self.server.bookmark_interval_s
        self._start_stream("application/json")

        def send(kind: str, obj: Obj) -> None:
            self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        def in_ns(change_ns: str) -> bool:
            return not res.namespaced or ns is None or change_ns == ns

        try:
            with store.cond:
                if rv_param in (None, "", "0"):
                    items, cursor = store.list(res.plural, ns if res.namespaced else None, match)
                    initial = items
                else:
                    cursor, initial = int(rv_param), []
            for obj in initial:
                send("ADDED", obj)
            while not self.server.stopping.is_set():
                if self._faulted(generation, stall):
                    return
                try:
                    with store.cond:
                        changes = store.changes_since(cursor, res.plural)
                        seen = store.rv
                except Gone as err:
                    send("ERROR", err.status())
                    break
                for c in changes:
                    cursor = c.rv
                    if not in_ns(c.namespace):
                        continue
                    kind = _watch_event(c.type, c.old is not None and match(c.old), match(c.obj))
                    if kind:
                        send(kind, c.obj)
                if bookmarks and time.monotonic() >= next_bookmark:
                    send("BOOKMARK", {"apiVersion": res.api_version, "kind": res.kind,
                                      "metadata": {"resourceVersion": str(seen)}})
                    next_bookmark = time.monotonic() + self.server.bookmark_interval_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                store.wait(seen, min(0.05, remaining))
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _faulted(self, watch_generation: int, stall_generation: int) -> bool:
        """A stream's fault check: a fault injected since the stream began drops (or stalls) the
        connection; True when it did, and the stream must return."""
        faults: Faults = self.server.faults
        if faults.watch_generation != watch_generation:
            self._drop()
            return True
        if faults.stall_generation != stall_generation:
            self._stall()
            return True
        return False

    # --- logs --------------------------------------------------------------------
    def _logs(self, res: Resource, ns: str | None, name: str | None, query: dict[str, str]) -> None:
        api: Api = self.server.api
        pod = api.store.get("pods", ns, name or "")
        container = _log_container(pod, name, query)
        key = (ns or "default", name or "", container)
        since_ns = _log_since_ns(query)
        stamps = query.get("timestamps") in ("true", "1")

        def render(entries: list[tuple[int, str]]) -> bytes:
            # logs.go: drop lines before `since`; with timestamps, prefix RFC3339Nano and a space
            return b"".join(((rfc3339nano(t) + " " if stamps else "") + line + "\n").encode()
                            for t, line in entries if since_ns is None or t >= since_ns)

        generation, snapshot = api.log_file(*key)
        tail = query.get("tailLines")
        entries = snapshot if tail is None else snapshot[-int(tail):] if int(tail) else []
        if query.get("follow") not in ("true", "1"):
            self._send(200, render(entries), "text/plain")
            return
        self._start_stream("text/plain")
        sent = len(snapshot) - len(entries)      # the loop sends from here on
        faults_generation, stall = self.server.faults.watch_generation, self.server.faults.stall_generation
        try:
            while not self.server.stopping.is_set():
                if self._faulted(faults_generation, stall):
                    return
                with api.store.cond:
                    current, now_entries = api.log_file(*key)
                    try:
                        cur = api.store.get("pods", ns, name or "")
                        done = _container_terminated(cur, container)
                    except ApiError:
                        done = True
                    seen = api.store.rv
                if current != generation:          # rotated: reopen, read the new file from its start
                    generation, sent = current, 0
                data = render(now_entries[sent:])
                if data:
                    self._chunk(data)
                sent = len(now_entries)
                if done:
                    break
                with api.store.cond:
                    if api.log_file(*key) == (generation, now_entries):
                        api.store.cond.wait(0.05) if api.store.rv == seen else None
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


def _watch_event(change: str, old_ok: bool, new_ok: bool) -> str | None:
    """The event a watch with a selector sends for a change: what it saw before (old_ok) and after
    (new_ok) decides; None for a change it does not see."""
    if change == "DELETED":
        return "DELETED" if old_ok else None
    if change == "ADDED":
        return "ADDED" if new_ok else None
    return "MODIFIED" if old_ok and new_ok else "ADDED" if new_ok else "DELETED" if old_ok else None


def _log_container(pod: Obj, name: str | None, query: dict[str, str]) -> str:
    """The container a log request names (or the pod's only one), refused as the API server does."""
    containers = [c["name"] for c in pod["spec"]["containers"]]
    container = query.get("container")
    if not container:
        if len(containers) != 1:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod "
                           f"{name}, choose one of: [{' '.join(containers)}]")
        container = containers[0]
    if container not in containers:
        raise ApiError(400, "BadRequest",
                       f"container {container} is not valid for pod {name}")
    if not _container_started(pod, container):
        raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is '
                       "waiting to start: ContainerCreating")
    return container


def _log_since_ns(query: dict[str, str]) -> int | None:
    """sinceSeconds/sinceTime as a unix time in ns (None: from the start).
    pkg/apis/core/validation ValidatePodLogOptions: sinceSeconds >= 1, not with sinceTime."""
    since_s, since_t = query.get("sinceSeconds"), query.get("sinceTime")
    if since_s is not None and int(since_s) < 1:
        raise ApiError(422, "Invalid", "PodLogOptions \"\" is invalid: sinceSeconds: Invalid value: "
                       f"{since_s}: must be greater than 0")
    if since_s is not None and since_t is not None:
        raise ApiError(422, "Invalid", "PodLogOptions \"\" is invalid: : Forbidden: at most one of "
                       "`sinceTime` or `sinceSeconds` may be specified")
    return (time.time_ns() - int(since_s) * 1_000_000_000 if since_s is not None
            else _parse_rfc3339_ns(since_t) if since_t else None)


def _list_key(obj: Obj) -> str:
    """The object's key in the store's order (namespace, then name), as etcd orders keys."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def rfc3339nano(unix_ns: int) -> str:
    """Go's time.RFC3339Nano in UTC: trailing zeros of the fraction dropped."""
    secs, frac = divmod(unix_ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def _parse_rfc3339_ns(text: str) -> int:
    import datetime as dt

    head, _, frac = text.rstrip("Z").partition(".")
    secs = int(dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc).timestamp())
    return secs * 1_000_000_000 + int((frac + "000000000")[:9] if frac else 0)


def _container_status(pod: Obj, container: str) -> Obj | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return cs
    return None


def _container_started(pod: Obj, container: str) -> bool:
    cs = _container_status(pod, container)
    state = (cs or {}).get("state") or {}
    return "running" in state or "terminated" in state


def _container_terminated(pod: Obj, container: str) -> bool:
    cs = _container_status(pod, container)
    return "terminated" in ((cs or {}).get("state") or {})


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, history_limit: int = 10_000,
                 tls: tuple[str, str] | None = None):
        """``tls``: (certificate, key) PEM files: serve HTTPS, as a real API server does (an
        in-cluster client only speaks HTTPS: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)."""
        super().__init__((host, port), Handler)
        self.tls = tls is not None
        if tls is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.socket = ctx.wrap_socket(self.socket, server_side=True)
        self.api = Api(Store(history_limit=history_limit))
        self.faults = Faults()
        self.rbac: Rbac | None = None      # None: no authentication or authorisation at all
        self.schema_version = "1.34"       # the API's schemas for fieldValidation=Strict (fieldvalidation.py)
        self.stopping = threading.Event()
        # client (host, port) of every connection whose handler is streaming a watch or a followed
        # log right now. Such a connection reads no new request until the stream ends, as the
        # API server's HTTP/1.1 does: golang/go src/net/http/server.go, (*conn).serve reads the
        # next request only after ServeHTTP returns ("HTTP cannot have multiple simultaneous
        # active requests"); BaseHTTPRequestHandler.handle loops the same way. A client must
        # never send a request on one (test_backend_sim._pooled_streams asks).
        self.streaming: set[tuple[str, int]] = set()
        # how often a watch that allows bookmarks gets one: the watch cache's is about a minute
        # (cacher.go); tests that exercise bookmarks shorten it
        self.bookmark_interval_s = 60.0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)            # an AF_INET server's address
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> "FakeApiServer":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-kube-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.api.store.close()
        self.shutdown()
        self.server_close()
        if self._thread:
            self._thread.join(timeout=5)
