"""The Plan: everything a backend will submit for one attempt, fully resolved.

It is the seam between "what will happen" and "make it happen" (TorchX's dryrun/schedule
split): ``wmctl submit --dry-run`` prints it, ``wmctl submit`` hands it to the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .backends.base import attempt_name


@dataclass(frozen=True)
class AttemptContext:
    """What differs between attempts of one run."""

    attempt: int = 0
    excluded_nodes: tuple[str, ...] = ()
    resume: bool = False           # resume from the latest complete checkpoint if one exists
    parent: int | None = None      # the attempt this one replaces


@dataclass
class Plan:
    backend: str
    run: str
    attempt: int
    spec_hash: str
    # kubernetes: manifests (dicts); docker: network + containers; local: agent processes
    resources: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # decisions a reader should know about
    context: AttemptContext = field(default_factory=AttemptContext)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def attempt_name(self) -> str:
        return attempt_name(self.run, self.attempt)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "run": self.run, "attempt": self.attempt,
            "attemptName": self.attempt_name, "specHash": self.spec_hash,
            "resources": self.resources, "notes": self.notes, **({"extra": self.extra} if self.extra else {}),
        }
