"""Docker backend: one container per node on a private network on one Docker host."""

from .engine import DockerBackend as BACKEND

__all__ = ["BACKEND"]
