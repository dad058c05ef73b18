"""The Kubernetes API as the engine's rooms reach it: the client (loaded on first use, so the CLI's
--help and dry runs never load it), the namespace an attempt's objects live in, the listings more
than one room makes (the attempt's pods, its Job's Events), and the one place where an API
exception becomes wmctl's words.
"""

from __future__ import annotations

import json
from typing import Any

from ... import labels as L
from ...adaptors import kubernetes as sdk
from ...errors import BackendError, CredentialsRejected
from ..base import AttemptRef
from .client import call_json
from .credentials import Credentials, describe_source

Obj = dict[str, Any]
MANAGED_BY, RUN_LABEL, ATTEMPT_LABEL = L.MANAGED_BY, L.RUN, L.ATTEMPT


def attempt_selector(run: str, attempt: int) -> str:
    return f"{RUN_LABEL}={run},{ATTEMPT_LABEL}={attempt}"


def api_error() -> type[Exception]:
    """The client's ApiException (the SDK is loaded by then: only a call through it raises one)."""
    found: type[Exception] = sdk.api_exception()
    return found


def reason(exc: BaseException) -> str:
    """The message of a Status body, else the HTTP reason."""
    try:
        body = json.loads(getattr(exc, "body", "") or "{}")
        return body.get("message") or str(getattr(exc, "reason", ""))
    except ValueError:
        return str(getattr(exc, "reason", ""))


def failure(exc: BaseException, what: str) -> str:
    """What an API exception says about the step ``what``: its status and the server's message."""
    return f"cannot {what}: {sdk.api_status(exc)} {reason(exc)}"


def refused(exc: BaseException, what: str, hint: str | None = None) -> BackendError:
    """An API exception as wmctl's error: the step, the status and the server's message."""
    return BackendError(failure(exc, what), hint=hint)


class Cluster:
    """One cluster's API client and default namespace, shared by the engine's rooms."""

    def __init__(self, api_client: Any = None, *, context: str | None = None, kubeconfig: str | None = None,
                 in_cluster: bool | None = None, namespace: str = "default"):
        self._api_client = api_client
        self._single_try = False
        self.context, self.kubeconfig, self.in_cluster = context, kubeconfig, in_cluster
        self.namespace = namespace
        self.credentials: Credentials | None = None

    def load(self) -> Any:
        """A new ApiClient from the kubeconfig (or the in-cluster service account), read now."""
        return sdk.load_api_client(self.context, self.kubeconfig, self.in_cluster)

    @property
    def api_client(self) -> Any:
        if self._api_client is None:
            self._api_client = self.load()
            # credentials.py: a 401 reloads what was loaded here and sends the request again
            source, _ = describe_source(self.context, self.kubeconfig, self.in_cluster)
            self.credentials = Credentials(self._api_client, self.load, source).install()
        if not self._single_try:
            sdk.single_try(self._api_client)     # retries are client.call's and the watchers' alone
            self._single_try = True
        return self._api_client

    def named(self, exc: CredentialsRejected) -> CredentialsRejected:
        """``exc`` naming where this cluster's credential comes from and how to renew it."""
        source, fix = describe_source(self.context, self.kubeconfig, self.in_cluster)
        return CredentialsRejected(f"{exc.message}; the credential comes from {source}", hint=fix)

    def api(self, name: str) -> Any:
        """The typed API class ``name`` (CoreV1Api, BatchV1Api, ...) on this cluster's client."""
        return getattr(sdk.sdk(), name)(self.api_client)

    def core(self) -> Any:
        return self.api("CoreV1Api")

    def batch(self) -> Any:
        return self.api("BatchV1Api")

    def custom(self) -> Any:
        return self.api("CustomObjectsApi")

    def ns(self, ref: AttemptRef) -> str:
        """Where the attempt's objects live: its own namespace, else this backend's default."""
        return ref.namespace or self.namespace

    def attempt_pods(self, ref: AttemptRef) -> list[Obj]:
        """Every pod of the attempt, as the API lists them now (raises its errors)."""
        return list(call_json(self.core().list_namespaced_pod, namespace=self.ns(ref),
                              label_selector=attempt_selector(ref.run, ref.attempt),
                              what=f"list pods of {ref.attempt_name}")["items"])

    def job_events(self, ref: AttemptRef) -> list[Obj]:
        """The Events about the attempt's Job (the Job controller's FailedCreate, and how it ended);
        raises the API's errors (a user who may not list Events gets a 403)."""
        ns, name = self.ns(ref), ref.attempt_name
        return list(call_json(self.core().list_namespaced_event, namespace=ns,
                              field_selector=f"involvedObject.kind=Job,involvedObject.name={name}",
                              what=f"list the Events of Job {ns}/{name}")["items"])
