"""Credentials that expire under a long watch: on a 401 the kubeconfig (or the in-cluster
service account) is loaded again and the request sent once more with what it now says.

The Python client refreshes only some credentials by itself (kubernetes-client/python
kubernetes/base/config/kube_config.py, KubeConfigLoader): ``_set_config`` installs a
``refresh_api_key_hook`` that re-runs ``_load_authentication`` only when an ``expiry`` is known,
which only an exec plugin's ``expirationTimestamp`` (``_load_from_exec_plugin``) or a GCP token
sets. A ``tokenFile`` is read once (``_load_user_token``, ``FileOrData.as_data``), an
``auth-provider: oidc`` id-token is refreshed only when the loader is built (``_load_oid_token``),
and the client certificate an exec plugin returns is written to a file the connection pool keeps
(``_load_from_exec_plugin`` then RESTClientObject's PoolManager). A run that watches for days
outlives each of them. The API server answers an expired credential 401 with no detail
(staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go).

One refresh at a time: the watch threads, the log followers and poll() may all meet the same 401;
the first reloads, the others find the generation moved on and just retry. The request is sent
again at most once per 401: a credential the reload does not fix is the caller's 401 (client.call
makes it ``CredentialsRejected``, naming where the credential comes from and the fix).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from ...adaptors.kubernetes import api_exception, kubeconfig_paths, single_try

UNAUTHORIZED = 401


def describe_source(context: str | None, kubeconfig: str | None, in_cluster: bool | None) -> tuple[str, str]:
    """Where the client's credential comes from, in words, and what a person does when it no
    longer works: (source, fix)."""
    if in_cluster or (in_cluster is None and not any(os.path.exists(p) for p in kubeconfig_paths(kubeconfig))
                      and os.environ.get("KUBERNETES_SERVICE_HOST")):
        return ("the pod's service-account token (/var/run/secrets/kubernetes.io/serviceaccount/token)",
                "check that the watcher's ServiceAccount still exists and its token is mounted "
                "(automountServiceAccountToken)")
    user, name = _kubeconfig_user(context, kubeconfig)
    where = f"kubeconfig user {name!r}" if name else "the kubeconfig"
    login = "log in again (or run the command that renews it), then `wmctl watch <run>` resumes supervising"
    if (user.get("auth-provider") or {}).get("name") == "oidc":
        return (f"{where} (auth-provider oidc id-token)", f"the id-token expired: {login}")
    if user.get("tokenFile"):
        return (f"{where} (tokenFile {user['tokenFile']})", f"write a valid token to {user['tokenFile']}")
    if user.get("exec"):
        cmd = (user.get("exec") or {}).get("command") or "?"
        return (f"{where} (exec plugin {cmd})", f"run {cmd} by hand to see why it returns a rejected credential")
    if user.get("token"):
        return (f"{where} (a token written in the kubeconfig)", f"put a valid token in the kubeconfig: {login}")
    if user.get("client-certificate") or user.get("client-certificate-data"):
        return (f"{where} (client certificate)", "the certificate expired or was revoked: get a new one")
    return (where, login)


def _kubeconfig_user(context: str | None, kubeconfig: str | None) -> tuple[dict[str, Any], str]:
    """The ``user`` entry the context points at, and its name, merged as kubectl merges files
    (the first file to name a context or user wins; the first current-context wins), as
    adaptors.kubernetes._merged_loader loads them. ({}, "") when it cannot be read."""
    import yaml

    docs = []
    for path in kubeconfig_paths(kubeconfig):
        try:
            with open(path, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            docs.append(doc)

    def first(section: str, name: str | None) -> dict[str, Any]:
        for doc in docs:
            for entry in doc.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") == name:
                    return entry
        return {}
    ctx_name = context or next((d["current-context"] for d in docs if d.get("current-context")), None)
    name = str((first("contexts", ctx_name).get("context") or {}).get("user") or "")
    user = first("users", name).get("user") or {} if name else {}
    return (user if isinstance(user, dict) else {}), name


class Credentials:
    """Installed on one ApiClient: every request that comes back 401 triggers ``refresh`` (one at
    a time) and is sent again with the reloaded credential."""

    def __init__(self, api_client: Any, reload: Callable[[], Any], source: str = "the kubeconfig"):
        self.api_client, self.reload, self.source = api_client, reload, source
        self.lock = threading.Lock()
        self.generation = 0          # bumped by each reload
        self.reloads = 0
        self._raw: Callable[..., Any] = api_client.rest_client.request

    def install(self) -> "Credentials":
        rest = self.api_client.rest_client
        original = rest.request
        if getattr(original, "_wmctl_credentials", None) is self:
            return self
        self._raw = original

        def request(*args: Any, **kw: Any) -> Any:
            return self._send(original, args, kw)

        request._wmctl_credentials = self      # type: ignore[attr-defined]
        rest.request = request
        return self

    def _send(self, original: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        seen = self.generation
        ApiException = api_exception()
        try:
            resp = original(*args, **kw)
        except ApiException as exc:
            if getattr(exc, "status", None) != UNAUTHORIZED:
                raise
        else:
            # Newer clients return the response and raise when it is read (rest.py RESTResponse).
            if getattr(resp, "status", None) != UNAUTHORIZED:
                return resp
        if not self.refresh(seen):
            return original(*args, **kw)        # the same answer again, for the caller to read
        headers = kw.get("headers")
        if isinstance(headers, dict):
            auth = self.api_client.configuration.auth_settings().get("BearerToken")
            for key in [k for k in headers if k.lower() == "authorization"]:
                del headers[key]
            if auth:
                headers[auth["key"]] = auth["value"]
        return self._raw(*args, **kw)          # once: a 401 now is the caller's

    def refresh(self, seen: int) -> bool:
        """Load the credential again (unless another thread did since ``seen``): the new token,
        client certificate and refresh hook replace the old on this ApiClient, whose typed APIs
        every watcher already holds. False when the reload itself fails."""
        from ...errors import EngineUnavailable

        with self.lock:
            if self.generation != seen:
                return True
            try:
                fresh = self.reload()
            except EngineUnavailable:
                return False
            old, new = self.api_client.configuration, fresh.configuration
            certs_changed = (getattr(old, "cert_file", None), getattr(old, "key_file", None)) != \
                (getattr(new, "cert_file", None), getattr(new, "key_file", None))
            new.retries = getattr(old, "retries", None)
            self.api_client.configuration = new
            if certs_changed:
                # the client certificate lives in the connection pool: a new pool for the new one
                self.api_client.rest_client = fresh.rest_client
                single_try(self.api_client)
                self.install()
            self.generation += 1
            self.reloads += 1
            return True
