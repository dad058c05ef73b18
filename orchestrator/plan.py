"""The Plan: everything a backend will submit for one attempt, fully resolved.

It is the seam between "what will happen" and "make it happen" (TorchX's dryrun/schedule
split): ``wmctl submit --dry-run`` prints it, ``wmctl submit`` hands it to the backend. The
same ``Backend.plan`` makes both, so what a dry run prints is what a submit creates.
``Plan.request`` is the backend's own typed request (paths, network, namespace); the
``resources`` are the objects it will create, as plain data.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from .layout import attempt_name, wmctl_home
from .runtime.records import record


@record(frozen=True)
class AttemptContext:
    """What differs between attempts of one run."""

    attempt: int = 0
    excluded_nodes: tuple[str, ...] = ()
    # of those, the ones remembered from earlier runs on the cluster (restart.remember_exclusions)
    remembered_nodes: tuple[str, ...] = ()
    resume: bool = False           # resume from the latest complete checkpoint if one exists
    parent: int | None = None      # the attempt this one replaces
    # A checkpoint root or step folder (as the job sees it) to start from when the run has no
    # checkpoint of its own yet: another run's checkpoints, taken on purpose (WMCTL_RESUME_FROM).
    resume_from: str | None = None


@record(frozen=True)
class HostFacts:
    """What a renderer needs to know about the machine it plans on. Renderers read nothing from
    the host themselves: these come in, so a render is a pure function and a golden file is the
    same on every machine."""

    cpus: tuple[int, ...]          # CPUs this process may use (split between nodes sharing a host)
    python: str                    # the interpreter local agents run with
    home: Path                     # $WMCTL_HOME: run folders live under it
    port: int | None = None        # local: the free rendezvous port chosen for this attempt
    # docker: the submitting user's (uid, gid) when containers should run as them (docker.user:
    # auto); None for root, a remote engine, or rootless Docker / userns-remap (see the Docker backend)
    user: tuple[int, int] | None = None

    @classmethod
    def of_this_machine(cls, port: int | None = None) -> "HostFacts":
        try:
            cpus = tuple(sorted(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            cpus = tuple(range(os.cpu_count() or 1))
        return cls(cpus=cpus, python=sys.executable, home=wmctl_home(), port=port)


@record(frozen=True)
class Request:
    """A backend's typed request; each backend subclasses it with its own fields."""

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


R = TypeVar("R", bound=Request)


@record
class Plan(Generic[R]):
    """What one attempt submits on one backend: the request and its resources, printable as they are."""

    backend: str
    run: str
    attempt: int
    spec_hash: str
    request: R
    # kubernetes: manifests (dicts); docker: network + containers; local: agent processes
    resources: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # decisions a reader should know about
    context: AttemptContext = field(default_factory=AttemptContext)

    @property
    def attempt_name(self) -> str:
        return attempt_name(self.run, self.attempt)

    def to_dict(self) -> dict[str, Any]:
        extra = self.request.as_dict()
        return {
            "backend": self.backend, "run": self.run, "attempt": self.attempt,
            "attemptName": self.attempt_name, "specHash": self.spec_hash,
            "resources": self.resources, "notes": self.notes, **({"extra": extra} if extra else {}),
        }
