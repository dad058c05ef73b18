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
    """A ``kubernetes.watch.Watch``: list+watch streams of one resource kind. Events carry the
    parsed JSON only (``raw_object``): the client's model deserialisation of every object, which
    wmctl never reads, cost most of a watcher's CPU at thousands of Nodes."""
    from kubernetes import watch as w

    class RawWatch(w.Watch):
        def get_return_type(self, func: Any) -> None:
            return None

    return RawWatch()


def iter_resp_lines(resp: Any) -> Any:
    """Lines of a streamed response (pod logs), as the client's watch splits them."""
    from kubernetes.watch.watch import iter_resp_lines as lines

    return lines(resp)


def kubeconfig_paths(kubeconfig: str | None = None) -> list[str]:
    """The kubeconfig files, in kubectl's order: ``kubeconfig`` (one path, or several joined
    with the OS path separator), else every path of $KUBECONFIG, else ~/.kube/config."""
    raw = kubeconfig or os.environ.get("KUBECONFIG", "")
    paths = [os.path.expanduser(p) for p in raw.split(os.pathsep) if p]
    return paths or [os.path.expanduser("~/.kube/config")]


def kubeconfig_server(context: str | None = None, kubeconfig: str | None = None) -> str | None:
    """The API server of ``context`` (else the current context) in the kubeconfig files, merged as
    kubectl merges them (``_merged_loader``), read without the SDK (a dry run asks); None when
    there is no such file, context or cluster."""
    import yaml

    first: dict[str, dict[str, Any]] = {"contexts": {}, "clusters": {}}
    current = None
    for path in kubeconfig_paths(kubeconfig):
        try:
            with open(path, encoding="utf-8") as fh:    # libyaml's loader where PyYAML has it: a dry run reads this
                data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(data, dict):
            continue
        current = current or data.get("current-context")
        for kind in ("contexts", "clusters"):
            for item in data.get(kind) or []:
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    first[kind].setdefault(item["name"], item.get(kind[:-1]) or {})
    ctx = first["contexts"].get(context or current or "")
    cluster = first["clusters"].get(ctx.get("cluster") or "") if isinstance(ctx, dict) else None
    server = cluster.get("server") if isinstance(cluster, dict) else None
    return server if isinstance(server, str) and server else None


def _merged_loader(paths: list[str], context: str | None) -> Any:
    """One KubeConfigLoader over every file, merged as kubectl merges them (client-go
    tools/clientcmd/loader.go, ClientConfigLoadingRules.Load; the kubeconfig documentation's
    "Merging kubeconfig files"): missing files are skipped, the first file to define a cluster,
    user or context by name wins, and the first file that sets current-context sets it. The
    client's own merger gets the names right but lets the last current-context win; that is
    corrected here."""
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    merger = KubeConfigMerger(os.pathsep.join(paths))
    if merger.config is None:
        raise EngineUnavailable(f"no kubeconfig found at {os.pathsep.join(paths)}",
                                hint="set KUBECONFIG or --kubeconfig, or run inside a pod with a service account")
    first = next((merger.config_files[p].get("current-context") for p in merger.paths
                  if (merger.config_files[p] or {}).get("current-context")), None)
    if first:
        merger.config.value["current-context"] = first
    return KubeConfigLoader(config_dict=merger.config, config_base_path=None, active_context=context,
                            config_persister=merger.save_changes)


def load_api_client(context: str | None = None, kubeconfig: str | None = None,
                    in_cluster: bool | None = None) -> Any:
    """An ``ApiClient`` from kubeconfig (optionally a named context) or in-cluster config.

    in_cluster None = auto: kubeconfig if one exists (or a context/kubeconfig was named),
    else the in-cluster service account when running in a pod. Several kubeconfig files
    ($KUBECONFIG=a:b) are merged as kubectl merges them (_merged_loader)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    paths = kubeconfig_paths(kubeconfig)
    path = os.pathsep.join(paths)
    have_kubeconfig = any(os.path.exists(p) for p in paths)
    if in_cluster is None:
        # A context (or `submit --kubeconfig` file) named without that file here, inside a pod: both
        # are what the machine that submitted the run recorded, and the pod's service account is the
        # way in. (`submit --kubeconfig` itself refuses a file that does not exist.)
        in_cluster = not have_kubeconfig and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        if not have_kubeconfig:
            raise EngineUnavailable(
                f"no kubeconfig found at {path}",
                hint="set KUBECONFIG or --kubeconfig, or run inside a pod with a service account")
        cfg = client.Configuration()
        _merged_loader(paths, context).load_and_set(cfg)
        return client.ApiClient(cfg)
    except ConfigException as exc:
        what = f"context {context!r} of {path}" if context else ("in-cluster config" if in_cluster else path)
        raise EngineUnavailable(f"cannot load Kubernetes {what}: {exc}",
                                hint="check --context (kubectl config get-contexts) and the kubeconfig") from None


def single_try(api_client: Any) -> Any:
    """Make ``api_client`` send each request once. urllib3's default Retry (3 tries) silently
    re-sends a GET that a 429 or 503 answered with Retry-After, and re-connects after a refused
    connection: a second retry layer under wmctl's own (backends/kubernetes/client.py), which
    would hide an outage and multiply every delay. Returns the same client."""
    import urllib3

    no_retry = urllib3.Retry(0, respect_retry_after_header=False)
    api_client.configuration.retries = no_retry
    pool_manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool_manager is not None:
        pool_manager.connection_pool_kw["retries"] = no_retry
        pool_manager.clear()          # pools made before this keep their own Retry
    return api_client


def api_status(exc: BaseException) -> int | None:
    """HTTP status of a client ApiException, else None."""
    return getattr(exc, "status", None) if isinstance(exc, api_exception()) else None


def connection_errors() -> tuple[type[BaseException], ...]:
    import urllib3.exceptions as u3

    return (u3.ProtocolError, u3.MaxRetryError, u3.TimeoutError, u3.NewConnectionError,
            ConnectionError, TimeoutError)
