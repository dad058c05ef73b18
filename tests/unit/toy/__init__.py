"""A toy backend that lives in the test folder: each node is one real Python process that prints
the job's progress lines and exits. It proves that a backend is one package plus one registry
line: nothing in orchestrator/ knows its name."""

from .engine import ToyBackend as BACKEND

__all__ = ["BACKEND"]
