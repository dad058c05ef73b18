"""The library face of wmctl: load a job, plan it, submit it, and choose and start where its
watcher runs (here, detached, in the cluster). What a run is and what can be asked of it
(status, list, cancel, delete, metrics) is orchestrator.runs; its logs, orchestrator.logview.

Nothing here prints: lines go to the ``view`` a caller passes, notes come back as values. The
CLI (``orchestrator/commands``) parses options and calls the functions of this module.
``submit`` is ``schedule(dryrun(...))`` (TorchX's split): ``dryrun`` resolves the job and plans
attempt 0 exactly as ``schedule`` then submits it.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import backends
from .backends.base import Backend, BackendOptions
from .imagebuild.record import RECORD_FILE, pinned_ref
from .errors import OptionError, RunCancelled, RunExists, RunFailed, SpecError, WmctlError
from .plan import AttemptContext, Plan
from .runtime.protocol import ENV_RUN_STORE, ENV_WATCHER_OBJECT
from .runtime.records import record
from .spec import JobSpec
from .speccheck import profile_problems
from .speccheck import warnings as spec_warnings
from .specload import from_dict, load_spec
from .vendors import VendorProfile, load_profile

# Run state (state, runs) and watching (watchview, supervisor) load in the functions that record,
# watch or supervise a run: load_job and dryrun, all a dry run calls, need none of them.
if TYPE_CHECKING:
    from .state import RunRecord, RunStore
    from .supervisor import Supervisor  # noqa: F401
    from .watchview import WatchView

Echo = Callable[[str], None]



@record
class Job:
    """A job spec resolved for submission: overrides applied, image pinned, profile loaded."""

    spec: JobSpec
    profile: VendorProfile
    spec_path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # what a user should know (the image pin)


def _run_id() -> str:
    import secrets

    return secrets.token_hex(8)


def load_job(spec_path: Path, overrides: dict[str, Any] | None = None) -> Job:
    """Read and validate the spec with ``overrides``, pin its image to the digest the build
    record holds for its tag (see ``pin_image``), and load its vendor profile."""
    overrides = dict(overrides or {})
    spec = load_spec(spec_path, overrides)
    profile = load_profile(spec.image.vendor)
    problems = profile_problems(spec, profile)
    if problems:
        raise SpecError(problems)
    note = pin_image(spec_path, spec)
    return Job(spec, profile, Path(spec_path), overrides, [*spec_warnings(spec), *([note] if note else [])])


def job_of(record: RunRecord) -> tuple[Job, list[str]]:
    """The job as it was submitted (its resolved spec in the record), with a note when the YAML
    on disk has changed since. A record from before resolved specs were kept loads the file."""
    notes: list[str] = []
    if record.spec is not None:
        spec = from_dict(record.spec, source_dir=Path(record.source_dir or "."))
        on_disk = _spec_on_disk(record)
        if on_disk is not None and on_disk != record.spec_hash:
            notes.append(f"{record.spec_path} changed since submission; running the spec as submitted "
                         "(submit again to use the new file)")
        return Job(spec, load_profile(spec.image.vendor), Path(record.spec_path), record.overrides), notes
    job = load_job(Path(record.spec_path), record.overrides)
    if job.spec.spec_hash() != record.spec_hash:
        notes.append(f"{record.spec_path} changed since submission; this record predates resolved specs, so "
                     "the file is used as it is now")
    return job, notes


def _spec_on_disk(record: RunRecord) -> str | None:
    try:
        spec = load_spec(record.spec_path, record.overrides)
    except WmctlError:
        return None
    pin_image(Path(record.spec_path), spec)
    return spec.spec_hash()


def pin_image(spec_path: Path, spec: JobSpec) -> str | None:
    """Replace ``spec.image.tag`` with the ``repo@sha256:...`` that `wmctl build-image --push`
    recorded for that very tag next to the spec, so every node of every attempt runs the same
    bytes even if the tag is moved later. Returns the note to show, or None when nothing was
    pinned. A tag that already holds a digest (``--image repo@sha256:...``) is used as is: that
    is also how to run a tag as it stands on the registry instead of the recorded push."""
    tag = spec.image.tag
    if not tag or "@" in tag:
        return None
    record = Path(spec_path).resolve().parent / RECORD_FILE
    if not record.is_file():
        return None
    ref = pinned_ref(Path(spec_path), spec.name, tag)
    if ref is None:
        return None
    spec.image.tag = ref
    return (f"image {tag} pinned to digest {ref} from the build record {record}; "
            "pass --image with a repo@sha256:... reference to run another")


# ---- planning and submitting -----------------------------------------------------------------

def _resume_source(engine: Backend[Any], value: str, run: str) -> tuple[str | None, str | None]:
    """``--resume-from RUN|PATH`` as the job will see it: a run recorded here resolves to its own
    checkpoint folder; anything else is a path. Returns (path, problem)."""
    if value == run:
        return None, "a run resumes from its own checkpoints already; name another run or a folder"
    from .state import list_runs, open_store

    store = open_store(value)
    if store.exists():
        other, _ = job_of(store.load())
        path, here = engine.checkpoint_root(other.spec)
    else:
        path, here = (str(Path(value).resolve()), True) if value.startswith((".", "/", "~")) or "/" in value \
            else (value, False)
        if not here:
            known = ", ".join(list_runs()) or "none"
            return None, (f"no run named {value!r} here (known runs: {known}) and not a path; give a run name "
                          "or a checkpoint folder (./ckpt/other-run, /ckpt/other-run)")
    if here and not Path(path).is_dir():
        return None, f"{path} is not a folder on this machine; give a run name or an existing checkpoint folder"
    return path, None


@record
class SubmitRequest:
    """What ``schedule`` will do: the job, the backend, and attempt 0's plan."""

    job: Job
    backend: Backend[Any]
    plan: Plan[Any]
    auto_resume: bool
    options: BackendOptions


def backend_for(name: str, job: Job | None = None, *, context: str | None = None, kubeconfig: str | None = None,
                namespace: str | None = None) -> tuple[Backend[Any], BackendOptions]:
    ns = namespace or (job.spec.kubernetes.namespace if job else None)
    options = BackendOptions(context=context, namespace=ns, kubeconfig=_kubeconfig_files(kubeconfig))
    return backends.create(name, options), options


def _kubeconfig_files(value: str | None) -> str | None:
    """``--kubeconfig`` as the record keeps it: each file (':'-separated, as $KUBECONFIG) made
    absolute, so a later command from another folder reads the same ones; a missing one is refused."""
    if not value:
        return None
    files = [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise OptionError(f"--kubeconfig: no such file {', '.join(missing)}",
                          hint="give existing kubeconfig file(s), e.g. --kubeconfig ~/.kube/config")
    return os.pathsep.join(str(p.resolve()) for p in files)


def dryrun(job: Job, backend: str, *, auto_resume: bool = False, context: str | None = None,
           kubeconfig: str | None = None, attempt: int = 0, exclude: tuple[str, ...] = (),
           resume_from: str | None = None) -> SubmitRequest:
    """Check the job for ``backend`` and plan one attempt of it, exactly as submitting would.
    ``resume_from``: another run's name, or a checkpoint folder, to start from on purpose."""
    auto_resume = auto_resume or job.spec.restart.auto_resume
    engine, options = backend_for(backend, job, context=context, kubeconfig=kubeconfig)
    backends.check(type(engine), job.spec, auto_resume=auto_resume)
    problems = engine.check_host(job.spec)     # a missing read-only host folder, on this machine
    source = None
    if resume_from is not None:
        source, problem = _resume_source(engine, resume_from, job.spec.name)
        if problem:
            problems.append(("--resume-from", problem))
    if problems:
        engine.close()
        raise SpecError(problems)
    # the nodes earlier runs on this cluster left (restart.remember_exclusions), as attempt 0 will
    from .exclusions import for_attempt

    applied = for_attempt(exclude, remembers=engine.remembers_exclusions, cluster=engine.cluster_key,
                          ttl_s=job.spec.restart.remember_exclusions_s)
    ctx = AttemptContext(attempt=attempt, excluded_nodes=applied.nodes,
                         remembered_nodes=tuple(e.node for e in applied.remembered), resume=auto_resume or attempt > 0
                         or source is not None, parent=attempt - 1 if attempt > 0 else None, resume_from=source)
    plan = engine.plan(job.spec, job.profile, ctx)
    plan.notes.extend(applied.notes)
    return SubmitRequest(job, engine, plan, auto_resume, options)


def schedule(request: SubmitRequest, *, watch: bool, view: WatchView, replace: bool = False) -> int:
    """Record the run and submit its planned attempt 0; with ``watch``, supervise it to the end.
    Returns the exit code (0, or RunFailed's when the run failed)."""
    from .state import RunRecord, open_store

    job, engine = request.job, request.backend
    store = open_store(job.spec.name)
    try:
        _clear_the_name(store, engine, view.line, replace=replace)
        # Before anything of the run is written: a host it cannot run on (a missing image, a
        # folder it cannot create) leaves no run behind that holds the name.
        for note in engine.prepare_host(job.spec):     # missing writable host folders, created
            view.line(f"note: {note}")
        # Leased before the record exists: `status` never takes a run being submitted for one
        # whose submitter died.
        store.acquire_watcher()
        spec = job.spec
        overrides = dict(job.overrides)
        if spec.image.tag and "@sha256:" in spec.image.tag:
            overrides["image.tag"] = spec.image.tag
        record = RunRecord(run=spec.name, backend=engine.name,
                           spec_path=str(job.spec_path.resolve()) if job.spec_path else "",
                           overrides=overrides, spec_hash=spec.spec_hash(), auto_resume=request.auto_resume,
                           kube_context=request.options.context, kubeconfig=request.options.kubeconfig,
                           namespace=engine.namespace_of(spec),
                           spec=spec.to_dict(), source_dir=str(spec.source_dir), run_id=_run_id(),
                           resume_from=request.plan.context.resume_from)
        store.save(record)
    except BaseException:
        store.release_watcher()
        engine.close()
        raise
    return _supervise(store, record, job, engine, watch=watch, view=view, first_plan=request.plan)


def submit(job: Job, backend: str, *, auto_resume: bool = False, watch: bool = False, view: WatchView,
           context: str | None = None, replace: bool = False) -> int:
    """``schedule(dryrun(...))``."""
    return schedule(dryrun(job, backend, auto_resume=auto_resume, context=context), watch=watch, view=view,
                    replace=replace)


# ---- where the watcher runs -----------------------------------------------------------------------

HERE = "here"                # this process, in the foreground, to the run's end (``schedule(watch=True)``)
DETACHED = "detached"        # a process of its own on this machine, its lines in the run folder
IN_CLUSTER = "in-cluster"    # a watcher the backend runs (a watcher pod), the run's state kept there
NOWHERE = "nowhere"          # none: nothing resumes the run; `wmctl watch RUN` attaches one later


@record(frozen=True)
class WatcherPlace:
    """Where a submitted run's watcher runs; in the cluster, also the settings that reach the
    run's state from this machine."""

    where: str
    environment: dict[str, str] = field(default_factory=dict)


def place_watcher(request: SubmitRequest, *, watch: bool | None = None, detach: bool = False,
                  in_cluster: bool = False) -> WatcherPlace:
    """Where ``request``'s watcher will run, chosen before anything is submitted. ``in_cluster``:
    the backend runs it (``check_in_cluster``: this process's run state then goes where that
    watcher reads it). Otherwise here, in the foreground, when watching (``watch``, by default
    the run's auto-resume) and not ``detach``; a run with auto-resume not watched here gets a
    detached watcher; else none. A refused choice closes the request's backend."""
    if in_cluster:
        try:
            return WatcherPlace(IN_CLUSTER, check_in_cluster(request))
        except BaseException:
            request.backend.close()
            raise
    if (request.auto_resume if watch is None else watch) and not detach:
        return WatcherPlace(HERE)
    return WatcherPlace(DETACHED if request.auto_resume else NOWHERE)


def start_watcher(run: str, place: WatcherPlace) -> list[str]:
    """Once ``run`` is submitted without watching it here, start its watcher where ``place``
    says. Returns what its user should know: who watches the run now, and how to reach it."""
    if place.where == IN_CLUSTER:
        reach = " ".join(f"{k}={shlex.quote(v)}" for k, v in place.environment.items())
        return [start_cluster_watcher(run), f"its state is in the cluster: {reach} wmctl status {run}"]
    if place.where == DETACHED:
        pid = spawn_watcher(run, auto_resume=True)
        return [f"watcher {pid} supervises {run} with auto-resume; its lines: `wmctl logs {run} --watcher`"]
    if place.where == NOWHERE:
        return [f"nothing will resume {run} if it fails (no watcher runs): `wmctl watch {run} --auto-resume` "
                f"starts one; `wmctl status {run}` shows where it stands"]
    return []       # HERE: the watcher was this process, and the run has ended


def check_in_cluster(request: SubmitRequest) -> dict[str, str]:
    """Before anything is submitted: can ``request``'s backend run the run's watcher itself
    (``submit --in-cluster``)? Its run state then goes to that backend's store for this process
    and its children (WMCTL_RUN_STORE and the store's own settings), where the watcher will look.
    Returns those settings, for reaching the run from this machine later."""
    cls = type(request.backend)
    if not (cls.cluster_watcher and cls.run_store):
        able = [n for n in backends.names() if backends.backend_class(n).cluster_watcher]
        raise OptionError(f"--in-cluster: the {cls.name} backend runs no watcher of its own",
                          hint=f"use -b {' or -b '.join(able)}, or drop --in-cluster")
    problems = cls.watcher_problems(request.job.spec)
    if problems:
        raise SpecError(problems)
    chosen = (os.environ.get(ENV_RUN_STORE) or "").strip().lower()     # as state.open_store reads it
    if chosen and chosen != cls.name:
        raise OptionError(f"--in-cluster keeps the run's state in {cls.name}, but {ENV_RUN_STORE}={chosen}",
                          hint=f"unset {ENV_RUN_STORE} or set it to {cls.name}")
    wanted = {ENV_RUN_STORE: cls.name, **request.backend.store_environment(request.job.spec)}
    for key, value in wanted.items():
        if key == ENV_RUN_STORE:
            continue
        if os.environ.get(key) and os.environ[key] != value:
            raise OptionError(f"--in-cluster keeps the run's state where its watcher reads it ({key}={value}), "
                              f"but {key}={os.environ[key]}", hint=f"unset {key} or set it to {value}")
    os.environ.update(wanted)
    return wanted


def start_cluster_watcher(run: str) -> str:
    """Start ``run``'s watcher where the run lives (after ``check_in_cluster`` and ``schedule``)."""
    from .runs import engine_of
    from .state import open_store

    record = open_store(run).load()
    job, _ = job_of(record)
    engine = engine_of(record)
    try:
        return engine.start_watcher(run, job.spec)
    finally:
        engine.close()


def in_cluster_watcher() -> bool:
    """Is this process a watcher that ``start_cluster_watcher`` started (a watcher pod)?"""
    return bool(os.environ.get(ENV_WATCHER_OBJECT))


def retire_cluster_watcher(run: str) -> str | None:
    """Inside a watcher ``start_cluster_watcher`` started, once ``run`` has ended: remove what would
    restart it (a note saying so), else None."""
    if not in_cluster_watcher():
        return None
    from .runs import engine_of
    from .state import open_store

    record = open_store(run).load()
    if record.status == "running":
        return None
    engine = engine_of(record)
    try:
        return engine.retire_watcher(run)
    finally:
        engine.close()


def spawn_watcher(run: str, *, auto_resume: bool, wait_s: float = 20.0) -> int:
    """Start a watcher of ``run`` that outlives this process (its own session, its lines in the
    run folder's watcher log), and wait until it holds the lease. Returns its pid."""
    import subprocess
    import sys

    from .state import open_store

    store = open_store(run)
    log = store.watcher_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "orchestrator.watcher", run] + (["--auto-resume"] if auto_resume else [])
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        lease = store.lease()
        if lease is not None and lease.pid == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
            raise WmctlError(f"the watcher of {run} exited at once (exit {proc.returncode}): " + " | ".join(tail),
                             hint=f"see {log}; `wmctl watch {run} --auto-resume` watches in the foreground")
        time.sleep(0.05)
    return proc.pid


def _clear_the_name(store: RunStore, engine: Backend[Any], echo: Echo, *, replace: bool) -> None:
    """A run name belongs to one run. A name an ended run holds is refused, unless ``replace``:
    then that run is deleted first (its record and what it left on the backend; never its
    checkpoints). A run that has not ended is never replaced. Objects of that name that no record
    here knows are someone else's: refused, never adopted and never deleted."""
    from .runs import remove, status

    if store.exists():
        view = status(store.run)
        old = view.record
        assert old is not None
        if never_submitted(old):
            # A submission refused before anything ran (its attempt 0 not_submitted): nothing of
            # it exists anywhere, so its record holds no name.
            echo(f"note: run {store.run}'s earlier submission never started; its record is replaced")
            remove(store, engine, old, echo)
            return
        if old.status == "running":
            # a run another watcher holds cannot be watched from here: look at it instead
            look = (f"see it with `wmctl status {store.run}`" if view.lease
                    else f"watch it with `wmctl watch {store.run}`")
            raise RunExists(f"run {store.run!r} already exists and has not ended ({view.watcher})",
                            hint=f"{look}, `wmctl cancel {store.run}` it first, "
                                 "or give this run another name (name: or --set name=...)")
        if not replace:
            ago = _ago(old.created_at)
            raise RunExists(f"a run named {store.run!r} already exists ({old.status}, submitted {ago} ago)",
                            hint=f"--replace replaces it, `wmctl delete {store.run}` removes it, or give this run "
                                 "another name (name: or --set name=...)")
        echo(f"replacing run {store.run} ({old.status})")
        remove(store, engine, old, echo)
        return
    left = engine.attempts(store.run)
    if left:
        raise RunExists(f"{engine.name} already has attempts of a run named {store.run!r} "
                        f"({', '.join(ref.attempt_name for ref in left)}) that no run record here knows",
                        hint="another machine or WMCTL_HOME may be watching it: rename this run (name: or "
                             "--set name=...), or remove those objects if they are stale")


def never_submitted(record: RunRecord) -> bool:
    """Did the run end without any attempt reaching its backend (every attempt ``not_submitted``)?"""
    return record.status == "failed" and all(a.outcome == "not_submitted" for a in record.attempts)


def _ago(then: float) -> str:
    seconds = max(0, int(time.time() - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _supervise(store: RunStore, record: RunRecord, job: Job, engine: Backend[Any], *, watch: bool, view: WatchView,
               first_plan: Plan[Any] | None = None) -> int:
    try:
        note = store.acquire_watcher()
        if note:
            view.line(f"note: {note}")
        try:
            from .supervisor import Supervisor, SupervisorOptions

            sup = Supervisor(job.spec, job.profile, engine, store, record, view,
                             SupervisorOptions(auto_resume=record.auto_resume), first_plan=first_plan)
            if not watch:
                rec = sup.current_or_new_attempt()
                view.line(f"submitted {job.spec.name} attempt {rec.attempt}")
                return 0
            return sup.run().exit_code
        finally:
            store.release_watcher()
    finally:
        # Daemon threads still reading a watch stream when the interpreter exits abort it
        # (SIGABRT while they hold stderr's lock): stop them before returning.
        engine.close()


# ---- watching a recorded run ------------------------------------------------------------------

def watch(run: str, *, auto_resume: bool | None, view: WatchView) -> int:
    """Supervise a recorded run from where it is (adopting a running attempt)."""
    from .runs import engine_of
    from .state import open_store

    store = open_store(run)
    store.load()                        # no such run: said before the lease is taken
    # Leased before the record is read: a reader reconciling the run is waited for, and what it
    # recorded is what this watcher takes up.
    taken = store.acquire_watcher()
    try:
        record = store.load()
        if taken:
            view.line(f"note: {taken}")
        from .reconcile import (resumable_unwatched, take_up_unstarted, take_up_unwatched,  # not for a dry run
                                unstarted_unwatched)

        if unstarted_unwatched(record):
            take_up_unstarted(record)
            view.line(f"run {run}: attempt {record.attempts[-1].attempt} was recorded but never started; submitting it")
            store.save(record)
        elif auto_resume and resumable_unwatched(record):
            job, notes = job_of(record)
            take_up_unwatched(record, job.spec, backends.backend_class(record.backend).places_nodes)
            view.line(f"run {run} failed while nobody watched it ({record.attempts[-1].outcome}); resuming it")
            store.save(record)
        if record.status != "running":
            view.line(record.final_report or f"run {run} already {record.status}")
            store.release_watcher()
            return {"succeeded": 0, "cancelled": RunCancelled.exit_code}.get(record.status, RunFailed.exit_code)
        if auto_resume is not None:
            record.auto_resume = auto_resume
        job, notes = job_of(record)
        for note in notes:
            view.line(f"note: {note}")
        engine = engine_of(record)
    except BaseException:
        store.release_watcher()
        raise
    return _supervise(store, record, job, engine, watch=True, view=view)


