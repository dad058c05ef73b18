"""Options and steps shared by the commands that take a job spec."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from ..backends import DEFAULT as DEFAULT_BACKEND
from ..backends import names as backend_names
from ..errors import OptionError, SpecError
from ..serialize import dump


class _BackendChoice(click.Choice):
    """The registry's backends, read when the option is parsed: a backend registered at run time
    (a plugin, a test) is a valid choice too."""

    def __init__(self) -> None:
        super().__init__(backend_names())

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        return backend_names()

    @choices.setter
    def choices(self, value: Any) -> None:
        pass


BACKEND_CHOICE = _BackendChoice()


def backend_option(func: Callable) -> Callable:
    return click.option("-b", "--backend", type=BACKEND_CHOICE, default=DEFAULT_BACKEND, show_default=True,
                        help="Where the run goes.")(func)


def spec_options(func: Callable) -> Callable:
    """SPEC plus the flags that override spec fields."""
    decorators = [
        click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--set", "set_flags", multiple=True, metavar="KEY=VALUE",
                     help="Override a spec field, e.g. --set resources.shm=32Gi (repeatable)."),
        click.option("--nodes", type=int, default=None, help="Override `nodes`."),
        click.option("--image", "image_tag", default=None, help="Override `image.tag` (the image to run)."),
        click.option("--vendor", default=None, help="Override `image.vendor`."),
        click.option("-n", "--namespace", default=None, help="Override `kubernetes.namespace`."),
    ]
    for deco in reversed(decorators):
        func = deco(func)
    return func


def overrides_from(set_flags: tuple[str, ...], nodes: int | None, image_tag: str | None,
                   vendor: str | None, namespace: str | None) -> dict[str, Any]:
    from ..specload import parse_set_flags

    overrides = parse_set_flags(set_flags)
    for key, value in (("nodes", nodes), ("image.tag", image_tag), ("image.vendor", vendor),
                       ("kubernetes.namespace", namespace)):
        if value is not None:
            overrides[key] = value
    return overrides


def load(spec_path: Path, overrides: dict[str, Any]) -> Any:
    """The job, with any note (the image pin) on stderr, so a plan piped into kubectl stays clean."""
    from ..api import load_job

    job = load_job(spec_path, overrides)
    for note in job.notes:
        click.echo(f"note: {note}", err=True)
    return job


def plan_document(plan: Any, output: str) -> str:
    """What `render` and `submit --dry-run` print: the backend's own document of its plan."""
    from ..backends import backend_class

    return backend_class(plan.backend).document(plan, output)


def echo_line(line: str) -> None:
    from ..display import iso_stamp

    click.echo(f"{iso_stamp()} {line}")


def write_out_dir(plan: Any, out_dir: Path, output: str) -> list[Path]:
    written = []
    ext = "json" if output == "json" else "yaml"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, res in enumerate(plan.resources):
            kind = str(res.get("kind", "resource")).lower()
            name = ((res.get("metadata") or {}).get("name") or res.get("name")
                    or (res.get("create") or {}).get("name") or str(i))
            path = out_dir / f"{i:02d}-{kind}-{name}.{ext}"
            path.write_text(dump(res, output), encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise OptionError(f"--out: cannot write the plan into {str(out_dir)[:200]}: {exc.strerror or exc}",
                          hint="give a folder you can write, e.g. --out ./manifests") from None
    return written


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise SpecError([(field, message)])




def plain_option(func: Callable) -> Callable:
    return click.option("--plain", is_flag=True,
                        help="Timestamped lines only, no live panel (the default when stdout is not a terminal, "
                             "or TERM=dumb).")(func)


@contextlib.contextmanager
def interrupted_watch(run: str, *, submitted_here: bool = False, watching: bool = True) -> Iterator[None]:
    """Ctrl-C stops the watcher, never the run (its processes, containers or pods are in sessions
    of their own): say which watcher stopped, that the run goes on, and how to re-attach or cancel
    it (exit 130). ``submitted_here``: the watcher is the one `submit` ran in the foreground;
    ``watching``: false for a `submit` that starts no watcher in this process."""
    import signal
    import threading

    from ..watchview import INTERRUPTED

    def on_int(signum: int, frame: object) -> None:
        INTERRUPTED.set()           # kept even if the exception below is swallowed (watchview)
        raise KeyboardInterrupt

    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if ours:
        signal.signal(signal.SIGINT, on_int)
    try:
        yield
    except KeyboardInterrupt:
        from ..state import open_store

        if submitted_here and not open_store(run).exists():
            click.echo(f"\ninterrupted before {run} was recorded: nothing was submitted", err=True)
            raise SystemExit(130) from None
        who = (f"stopped the watcher that `wmctl submit` ran in the foreground (no --detach) for {run}"
               if submitted_here else f"stopped watching {run}")
        if not watching:
            who = f"interrupted after {run} was submitted; no watcher was started"
        between = _between_attempts(run)
        if between is not None:
            click.echo(f"\n{who}; nothing of it runs now: {between}.\n"
                       f"  go on:  wmctl watch {run} --auto-resume   (submits the next attempt, "
                       "resuming from the newest checkpoint)\n"
                       f"  end it: wmctl cancel {run}", err=True)
            raise SystemExit(130) from None
        click.echo(f"\n{who}; the run goes on, and nothing will resume it if it fails.\n"
                   f"  re-attach: wmctl watch {run} --auto-resume\n"
                   f"  cancel:    wmctl cancel {run}", err=True)
        raise SystemExit(130) from None
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        INTERRUPTED.clear()


def _between_attempts(run: str) -> str | None:
    """What a run stopped between attempts (its watcher in the backoff, or deciding) is waiting
    for; None while an attempt runs (or the run ended, or its record cannot be read)."""
    from ..errors import RecordDamaged, RunNotFound
    from ..state import open_store

    try:
        record = open_store(run).load()
    except (RunNotFound, RecordDamaged):
        return None
    last = record.attempts[-1] if record.attempts else None
    if record.status != "running" or last is None or last.outcome is None:
        return None
    return (f"attempt {last.attempt} ended ({last.outcome}) and attempt {last.attempt + 1} was not submitted "
            "(the watcher was waiting out its backoff)")


@contextlib.contextmanager
def display_for(watching: bool, plain: bool = False) -> Iterator[Any]:
    """The watcher's display: a live panel on a terminal while it watches, plain lines otherwise."""
    from ..display import make_display

    display = make_display(plain=plain or not watching)
    try:
        yield display
    finally:
        display.close()
