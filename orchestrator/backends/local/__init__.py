"""Local backend: one torchrun agent per node on this machine, the default that runs anywhere."""

from .engine import LocalBackend as BACKEND

__all__ = ["BACKEND"]
