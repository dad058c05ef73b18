"""Pure renderers: spec + vendor profile + attempt -> exactly what a backend will submit."""

from __future__ import annotations


from typing import Any

BACKENDS = ("local", "docker", "kubernetes")


def render_plan(spec: Any, profile: Any, backend: str, ctx: Any = None, **kwargs: Any):
    """Dispatch to the backend's renderer. Import cost stays per backend."""
    if backend == "kubernetes":
        from .kubernetes import render_kubernetes
        return render_kubernetes(spec, profile, ctx, **kwargs)
    if backend == "docker":
        from .docker import render_docker
        return render_docker(spec, profile, ctx, **kwargs)
    if backend == "local":
        from .local import render_local
        return render_local(spec, profile, ctx, **kwargs)
    raise ValueError(f"unknown backend {backend!r}")
