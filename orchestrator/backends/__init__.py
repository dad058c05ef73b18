"""Backends: local processes, Docker containers, Kubernetes Jobs. Imported lazily by name."""

from __future__ import annotations

from typing import Any


def get_backend(name: str, *, kube_context: str | None = None, namespace: str | None = None) -> Any:
    if name == "local":
        from .local import LocalBackend
        return LocalBackend()
    if name == "docker":
        from .docker import DockerBackend
        return DockerBackend()
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend
        return KubernetesBackend(context=kube_context, namespace=namespace or "default")
    raise ValueError(f"unknown backend {name!r}")


def plan_function(backend: Any):
    """The backend's own planner when it has one (local picks a free port), else the renderer."""
    own = getattr(backend, "plan", None)
    if own is not None:
        return own

    def render(spec, profile, ctx):
        from ..render import render_plan
        return render_plan(spec, profile, backend.name, ctx)

    return render
