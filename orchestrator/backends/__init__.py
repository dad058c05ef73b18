"""The backend registry: the only list of backends, and the one place their capabilities are
checked against a spec.

Each backend is a package ``orchestrator/backends/<name>/`` whose ``BACKEND`` is a
``base.Backend`` subclass (``check`` spec problems of its own, a pure ``render``, the engine's
``submit``/``poll``/``cancel``/``logs``, a pure ``classify`` module). Adding one is one package
plus one line here; ``register`` adds one at run time (tests, plugins).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import BackendError, OptionError, SpecError
from ..plan import AttemptContext, HostFacts, Plan
from ..validate import Problems
from ..storehook import set_store_resolver
from .base import LOG_OPTION_FLAGS, Backend, BackendOptions, LogQuery

# name -> module whose BACKEND is the backend class; the first is the default.
REGISTRY: dict[str, str] = {
    "local": "orchestrator.backends.local",
    "docker": "orchestrator.backends.docker",
    "kubernetes": "orchestrator.backends.kubernetes",
    "slurm": "orchestrator.backends.slurm",
}
DEFAULT = next(iter(REGISTRY))


def names() -> list[str]:
    return list(REGISTRY)


def run_store(name: str) -> tuple[str | None, list[str]]:
    """The module that keeps run state for backend ``name`` (None: it keeps none), and every
    backend that offers one: how WMCTL_RUN_STORE=<name> is resolved (state.open_store)."""
    offered = [n for n in REGISTRY if backend_class(n).run_store]
    return (backend_class(name).run_store if name in REGISTRY else None), offered


set_store_resolver(run_store)


def register(name: str, module: str) -> None:
    """Make ``module`` (whose ``BACKEND`` is a Backend subclass) the backend called ``name``."""
    REGISTRY[name] = module


def backend_class(name: str) -> type[Backend[Any]]:
    module = REGISTRY.get(name)
    if module is None:
        raise BackendError(f"unknown backend {name!r}", hint=f"use one of: {', '.join(REGISTRY)}")
    cls = importlib.import_module(module).BACKEND
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendError(f"backend {name!r} ({module}.BACKEND) is not a Backend subclass")
    return cls


def create(name: str, options: BackendOptions | None = None) -> Backend[Any]:
    """The backend object for ``name``: its class's one factory, given how to reach the engine."""
    return backend_class(name).create(options or BackendOptions())


def render_plan(spec: Any, profile: Any, name: str, ctx: AttemptContext | None = None,
                host: HostFacts | None = None) -> Plan[Any]:
    """A pure render of ``name``'s plan, for a given host (default: this machine as it is; the
    local backend's own ``plan`` also picks a free port)."""
    return backend_class(name).render(spec, profile, ctx or AttemptContext(), host or HostFacts.of_this_machine())


def check(cls: type[Backend[Any]], spec: Any, *, auto_resume: bool) -> None:
    """Spec problems that depend on where it runs, raised before anything is submitted: what the
    backend's capability flags rule out, then the backend's own checks."""
    problems: Problems = []
    if cls.runs_image:
        if not spec.image.tag:
            problems.append(("image.tag", f"the {cls.name} backend runs an image: set image.tag (and build it "
                             "with `wmctl build-image`) or pass --image"))
        if not spec.command[0:1] or spec.command[0] == "":
            problems.append(("command", "must not be empty"))
    if auto_resume and not cls.checkpoints_outlive_nodes:
        problems += _persistent_checkpoint_problems(spec)
    for i, vol in enumerate(spec.volumes):
        if vol.source not in cls.volume_sources:
            problems.append((f"volumes[{i}]", f"{vol.source} volumes cannot be mounted on the {cls.name} backend; "
                             f"use one of {', '.join(sorted(cls.volume_sources))}"))
    if spec.restart.spares and not cls.spares:
        able = [n for n in REGISTRY if backend_class(n).spares]
        problems.append(("restart.spares", f"the {cls.name} backend cannot keep spare nodes yet (spares run on "
                         f"{', '.join(able) or 'no backend'}); set restart.spares: 0 for this backend"))
    problems += cls.check(spec)
    if problems:
        raise SpecError(problems)


def _persistent_checkpoint_problems(spec: Any) -> Problems:
    from ..spec import Volume

    if not spec.checkpoint.dir:
        return [("checkpoint.dir", "auto-resume needs a checkpoint dir on a persistent volume")]
    where = spec.container_checkpoint_dir()
    vol = spec.volume_for(where)
    if vol is None or vol.source not in Volume.PERSISTENT:
        kind = "no volume" if vol is None else f"volume {vol.name!r} ({vol.source})"
        shown = spec.checkpoint.dir if where == spec.checkpoint.dir else f"{spec.checkpoint.dir} ({where})"
        return [("checkpoint.dir", f"{shown} is on {kind}, which is lost with the container: auto-resume "
                 "could never find a checkpoint; mount a pvc, nfs or host_path volume there")]
    if vol.read_only:
        return [("checkpoint.dir", f"volume {vol.name!r} holding the checkpoint dir is read_only")]
    return []


def check_logs(cls: type[Backend[Any]], query: LogQuery) -> None:
    """The log options a backend cannot serve (its ``log_options``), refused before it is asked."""
    missing = [LOG_OPTION_FLAGS[name] for name in query.asked() if name not in cls.log_options]
    if missing:
        able = [n for n in REGISTRY if all(f.lstrip("-") in backend_class(n).log_options for f in missing)]
        where = f"runs on {', '.join(able)} keep them" if able else "no backend keeps them"
        why = (" (it keeps no per-line times)" if set(missing) <= {"--since", "--timestamps"} else "")
        raise OptionError(f"{', '.join(missing)}: the {cls.name} backend's logs cannot serve this{why}; {where}",
                          hint=f"drop {', '.join(missing)}; --all-nodes and -f work on every backend")
