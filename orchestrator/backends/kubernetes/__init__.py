"""Kubernetes backend: an attempt is an Indexed Job plus a headless Service."""

from .engine import KubernetesBackend as BACKEND

__all__ = ["BACKEND"]
