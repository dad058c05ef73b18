"""The Docker SDK, loaded on first use, and its failures as wmctl errors."""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any, Iterator

from ..errors import EngineUnavailable

ENGINE_HINT = ("start the Docker engine (`systemctl start docker`, or `dockerd &`) or point DOCKER_HOST "
               "at a running one")


def errors() -> tuple[ModuleType, ModuleType]:
    """``(docker.errors, requests.exceptions)``: the SDK's errors and its transport's."""
    import docker.errors
    import requests.exceptions

    return docker.errors, requests.exceptions


def where() -> str:
    """The engine the environment points at, for messages."""
    return os.environ.get("DOCKER_HOST") or "the local socket (unix:///var/run/docker.sock)"


def engine_is_local() -> bool:
    """Does the environment's engine run on this machine, so a bind mount's source is a folder
    here? The local socket, or TCP/SSH to this very host; a remote engine's folders are its own."""
    from urllib.parse import urlparse

    host = os.environ.get("DOCKER_HOST", "")
    if not host or host.startswith(("unix://", "npipe://")):
        return True
    return urlparse(host).hostname in ("localhost", "127.0.0.1", "::1")


def engine_remaps_users(daemon_json: str = "/etc/docker/daemon.json") -> bool:
    """Does the local engine map container uids to other host uids? Rootless Docker runs as its
    user (its socket is theirs), so the container's root is that user on the host; userns-remap
    (daemon.json) shifts every container uid into a subordinate range. Either way a container
    uid:gid is not the same user on the host. Read from files, without the SDK or the engine, so
    a dry run stays light."""
    import json
    from urllib.parse import urlparse

    host = os.environ.get("DOCKER_HOST", "")
    socket = urlparse(host).path if host.startswith("unix://") else "/var/run/docker.sock"
    try:
        if os.stat(socket).st_uid != 0:
            return True
    except OSError:
        pass
    try:
        with open(daemon_json, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("userns-remap"))


def client(timeout: int | None = None) -> Any:
    """A client for the engine the Docker environment names (DOCKER_HOST, ...), or
    EngineUnavailable with a hint when there is none."""
    try:
        import docker
    except ImportError:
        raise EngineUnavailable("the docker Python package is not installed",
                                hint="pip install docker (it is a wmctl dependency)") from None
    errs, rexc = errors()
    try:
        if timeout is None:
            return docker.from_env()
        return docker.from_env(timeout=timeout)
    except (errs.DockerException, rexc.ConnectionError) as exc:
        raise EngineUnavailable(f"cannot reach the Docker engine at {where()}: {exc}", hint=ENGINE_HINT) from None


@contextlib.contextmanager
def engine(what: str) -> Iterator[None]:
    """Connection failures -> EngineUnavailable with a hint; API errors pass through."""
    errs, rexc = errors()
    try:
        yield
    except rexc.ConnectionError as exc:
        raise EngineUnavailable(f"the Docker engine did not answer while {what}: {exc}", hint=ENGINE_HINT) from None
    except errs.DockerException as exc:
        if isinstance(exc, errs.APIError):
            raise
        raise EngineUnavailable(f"cannot use the Docker engine while {what}: {exc}", hint=ENGINE_HINT) from None


def explain(exc: BaseException) -> str:
    """The engine's own words for an API error."""
    return getattr(exc, "explanation", None) or str(exc)
