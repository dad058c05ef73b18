"""Loading a Kubernetes API client (kubeconfig + --context, or in-cluster) and calling it with
bounded retries of transient failures.

``kubernetes`` is imported inside functions only. Retries of 429/5xx/connection errors happen
here, per API call and bounded; retrying a failed *attempt* is the supervisor's job.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, TypeVar

from ..errors import BackendError, EngineUnavailable

T = TypeVar("T")

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


def load_api_client(context: str | None = None, kubeconfig: str | None = None,
                    in_cluster: bool | None = None) -> Any:
    """An ``ApiClient`` from kubeconfig (optionally a named context) or in-cluster config.

    in_cluster None = auto: kubeconfig if one exists (or a context/kubeconfig was named),
    else the in-cluster service account when running in a pod."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or \
        os.path.expanduser("~/.kube/config")
    have_kubeconfig = bool(path) and os.path.exists(path)
    if in_cluster is None:
        in_cluster = not have_kubeconfig and context is None and kubeconfig is None \
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        if not have_kubeconfig:
            raise EngineUnavailable(
                f"no kubeconfig found at {path}",
                hint="set KUBECONFIG or --kubeconfig, or run inside a pod with a service account")
        return config.new_client_from_config(config_file=path, context=context)
    except ConfigException as exc:
        what = f"context {context!r} of {path}" if context else ("in-cluster config" if in_cluster else path)
        raise EngineUnavailable(f"cannot load Kubernetes {what}: {exc}",
                                hint="check --context (kubectl config get-contexts) and the kubeconfig") from None


def api_status(exc: BaseException) -> int | None:
    """HTTP status of a client ApiException, else None."""
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


def connection_errors() -> tuple[type[BaseException], ...]:
    import urllib3.exceptions as u3

    return (u3.ProtocolError, u3.MaxRetryError, u3.TimeoutError, u3.NewConnectionError,
            ConnectionError, TimeoutError)


def is_transient(exc: BaseException) -> bool:
    status = api_status(exc)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(exc, connection_errors())


def call(fn: Callable[..., T], *args: Any, what: str = "", attempts: int = 5,
         backoff: float = 0.1, max_backoff: float = 2.0, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retrying transient failures (429, 5xx, dropped connections).

    Non-transient ApiExceptions (404, 409, 422, 403 ...) propagate at once for the caller to
    interpret. When the retries are spent, a BackendError/EngineUnavailable names ``what``."""
    from kubernetes.client.exceptions import ApiException

    delay = backoff
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status not in RETRYABLE_STATUS:
                raise
            if i == attempts - 1:
                raise BackendError(f"Kubernetes API kept failing for {what or fn.__name__}: "
                                   f"{exc.status} {exc.reason}",
                                   hint="check the API server's health; wmctl retried "
                                   f"{attempts} times") from None
        except connection_errors() as exc:
            if i == attempts - 1:
                raise EngineUnavailable(f"cannot reach the Kubernetes API for "
                                        f"{what or fn.__name__}: {exc}",
                                        hint="check the cluster address and your network") from None
        time.sleep(delay)
        delay = min(delay * 2, max_backoff)
    raise AssertionError("unreachable")


def call_json(fn: Callable[..., Any], *args: Any, what: str = "", **kwargs: Any) -> Any:
    """``call`` without the client's model deserialisation: the parsed JSON body.

    Raw dicts are what the pure classifiers take, and they sidestep model mismatches (a
    Foreground delete answers 202 with the Job itself where the client's model says Status)."""
    resp = call(fn, *args, what=what, _preload_content=False, **kwargs)
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return json.loads(data) if data else {}
