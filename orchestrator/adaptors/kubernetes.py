"""The Kubernetes client, loaded on first use: configuration (kubeconfig + context, or
in-cluster), and the error types wmctl tells apart."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from ..errors import EngineUnavailable


def sdk() -> ModuleType:
    """``kubernetes.client``: the typed API classes (CoreV1Api, BatchV1Api, ...)."""
    from kubernetes import client

    return client


def api_exception() -> Any:
    """The client's ``ApiException`` (its ``status`` is the HTTP status)."""
    from kubernetes.client.exceptions import ApiException

    return ApiException


def watch() -> Any:
    """A ``kubernetes.watch.Watch``: list+watch streams of one resource kind."""
    from kubernetes import watch as w

    return w.Watch()


def iter_resp_lines(resp: Any) -> Any:
    """Lines of a streamed response (pod logs), as the client's watch splits them."""
    from kubernetes.watch.watch import iter_resp_lines as lines

    return lines(resp)


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
    return getattr(exc, "status", None) if isinstance(exc, api_exception()) else None


def connection_errors() -> tuple[type[BaseException], ...]:
    import urllib3.exceptions as u3

    return (u3.ProtocolError, u3.MaxRetryError, u3.TimeoutError, u3.NewConnectionError,
            ConnectionError, TimeoutError)
