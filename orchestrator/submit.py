"""Submit a spec as a run and, optionally, supervise it: the glue behind `submit` and `watch`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

import click

from .display import make_display, stamp
from .errors import WmctlError
from .state import RunRecord, RunStore


def _echo(line: str) -> None:
    click.echo(stamp(line))


def submit_and_maybe_watch(spec_path: Path, overrides: dict[str, Any], *, backend: str, auto_resume: bool,
                           watch: bool, kube_context: str | None = None,
                           echo: Callable[[str], None] | None = None) -> int:
    from .commands._common import load
    from .spec import check_backend

    spec, profile = load(spec_path, overrides)
    auto_resume = auto_resume or spec.restart.auto_resume
    check_backend(spec, backend, auto_resume=auto_resume)
    store = RunStore(spec.name)
    engine = _backend(backend, kube_context, spec.kubernetes.namespace)
    _clear_the_name(store, engine, echo or _echo)
    if spec.image.tag and "@sha256:" in spec.image.tag:
        # Pinned from the build record: every attempt, and a watcher started again after a
        # rebuild, must run these bytes, not what the tag or the record says by then.
        overrides = {**overrides, "image.tag": spec.image.tag}
    record = RunRecord(run=spec.name, backend=backend, spec_path=str(Path(spec_path).resolve()),
                       overrides=overrides, spec_hash=spec.spec_hash(), auto_resume=auto_resume,
                       kube_context=kube_context,
                       namespace=spec.kubernetes.namespace if backend == "kubernetes" else None)
    store.save(record)
    return supervise(store, record, spec, profile, watch=watch, echo=echo, backend=engine)


def _backend(name: str, kube_context: str | None, namespace: str | None):
    from .backends import get_backend

    return get_backend(name, kube_context=kube_context, namespace=namespace)


def _clear_the_name(store: RunStore, engine, echo: Callable[[str], None]) -> None:
    """A new run takes over its name: an ended run of that name is archived and what it left on
    the backend (finished containers, Jobs kept for their TTL) removed, so the new attempt 0 is
    created, not adopted from the old run. Objects of that name that no record here knows are
    someone else's: refused, never adopted and never deleted."""
    left = engine.attempts(store.run)
    if store.exists():
        old = store.load()
        if old.status == "running":
            raise WmctlError(f"run {store.run!r} already exists and has not ended",
                             hint=f"watch it with `wmctl watch {store.run}`, or `wmctl cancel {store.run}` first")
        if left:
            echo(f"removing what the previous run {store.run} ({old.status}) left on {engine.name}: "
                 + ", ".join(ref.attempt_name for ref in left))
        for ref in left:
            engine.cancel(ref)
        _archive(store)
    elif left:
        raise WmctlError(f"{engine.name} already has attempts of a run named {store.run!r} "
                         f"({', '.join(ref.attempt_name for ref in left)}) that no run record under "
                         f"{store.dir.parent} knows",
                         hint="another machine or WMCTL_HOME may be watching it: rename this run (name: or "
                              "--set name=...), or remove those objects if they are stale")


def _archive(store: RunStore) -> None:
    """A finished run of the same name: keep its folder, out of the way of the new run."""
    dest = store.dir.parent / ".archive" / f"{store.run}-{int(time.time())}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(store.dir), str(dest))


def supervise(store: RunStore, record: RunRecord, spec, profile, *, watch: bool,
              echo: Callable[[str], None] | None = None, backend=None) -> int:
    from .backends import plan_function
    from .supervisor import Supervisor

    backend = backend or _backend(record.backend, record.kube_context, spec.kubernetes.namespace)
    store.lock_watcher()
    # A caller's own echo (tests, embedding) gets lines only; the CLI gets the live panel too.
    display = make_display(force_plain=not watch) if echo is None else None
    try:
        sup = Supervisor(spec, profile, backend, store, record, auto_resume=record.auto_resume,
                         plan_fn=plan_function(backend), echo=echo or display,
                         show_state=display.state if display else None)
        echo = echo or display
        if not watch:
            rec = sup._current_or_new_attempt()
            echo(f"submitted {spec.name} attempt {rec.attempt}; follow it with `wmctl watch {spec.name}`")
            return 0
        return sup.run().exit_code
    finally:
        # Daemon threads still reading a watch stream when the interpreter exits abort it
        # (SIGABRT while they hold stderr's lock): stop them before returning.
        backend.close()
        if display:
            display.close()
        store.unlock_watcher()


def watch_run(run: str, *, auto_resume: bool | None, echo: Callable[[str], None] | None = None) -> int:
    from .commands._common import load

    store = RunStore(run)
    record = store.load()
    if record.status != "running":
        (echo or _echo)(record.final_report or f"run {run} already {record.status}")
        return 0 if record.status == "succeeded" else 7
    if auto_resume is not None:
        record.auto_resume = auto_resume
    spec, profile = load(Path(record.spec_path), record.overrides)
    if spec.spec_hash() != record.spec_hash:
        (echo or _echo)(f"note: {record.spec_path} changed since submission; using the file as it is now")
    return supervise(store, record, spec, profile, watch=True, echo=echo)


