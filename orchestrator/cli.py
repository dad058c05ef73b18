"""The ``wmctl`` command line: a thin Click group.

Each command lives in ``orchestrator/commands/<name>.py``, parses its options and calls one
function. Heavy SDKs (docker, kubernetes, torch) load inside those functions, never here,
so ``wmctl --help`` stays fast.
"""

from __future__ import annotations

import gc
import importlib
import signal
import sys
from typing import Callable


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C while wmctl is still importing: the user's answer, not a traceback (130, as main says)."""
    raise SystemExit(130)


def plans_only(args: list[str]) -> bool:
    """``wmctl render ...`` or ``wmctl submit ... --dry-run``: a short process that plans and exits."""
    command = next((a for a in args if not a.startswith("-")), None)
    return command == "render" or (command == "submit" and "--dry-run" in args)


_WMCTL_PROCESS = __name__ == "__main__" or sys.argv[0].rpartition("/")[2] == "wmctl"

# Installed before click and the commands are imported, in the wmctl process only (the console
# script, or `python -m orchestrator.cli`), never in a program that imports this module; main()
# gives KeyboardInterrupt back. A SIGINT someone ignored (a background job) stays ignored.
if _WMCTL_PROCESS and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_starting)

# The cyclic collector's passes over the modules a dry run imports were 4% of its instructions
# (21M of 525M, callgrind; issue 21 item 7), and a plan keeps nothing: a process that only plans
# runs without them. Every other command collects as usual (a watcher runs for days), and
# `submit` turns collection back on when it submits after all (`--dry-run` was another option's value).
if _WMCTL_PROCESS and plans_only(sys.argv[1:]):
    gc.disable()

import click  # noqa: E402

from . import __version__  # noqa: E402
from .errors import WmctlError  # noqa: E402

# command name -> module under orchestrator.commands that defines a click command ``command``
COMMANDS = {
    "render": "render",
    "submit": "submit",
    "build-image": "build_image",
    "wheelhouse": "wheelhouse",
    "watch": "watch",
    "status": "status",
    "logs": "logs",
    "cancel": "cancel",
    "list": "list_runs",
    "metrics": "metrics",
    "plot": "plot",
    "describe": "describe",
    "delete": "delete",
    "prune": "prune",
    "nodes": "nodes",
    "affinity": "affinity",
    "doctor": "doctor",
    "completion": "completion",
}

HELP = {
    "render": "Render what a backend would submit (Kubernetes, Docker or local), without submitting.",
    "submit": "Submit a job spec as a run (local by default); --dry-run prints the plan.",
    "build-image": "Render the Dockerfile from the vendor profile and build (and push) the image.",
    "wheelhouse": "Fill a wheelhouse folder for offline (air-gapped) image builds.",
    "watch": "Supervise a run; --auto-resume resubmits from the latest checkpoint on failure.",
    "status": "Show a run's attempts, nodes, last step and checkpoint.",
    "logs": "Print (or follow) the logs of one node of a run.",
    "cancel": "Cancel a run and tear down every attempt's processes/containers/objects.",
    "list": "List runs.",
    "metrics": "Print a run's kept progress events (steps, loss, timing, checkpoints) as a table, CSV or JSON.",
    "plot": "Draw a run's loss and throughput against step, failures, resumes and redone steps marked.",
    "describe": "Show a run's events and decisions in order (attempts, failures, checkpoints, resumes, cancel).",
    "delete": "Remove an ended run: its record, logs and leftover objects (never its checkpoints).",
    "prune": "Delete the runs that ended more than --older-than DUR ago (never checkpoints, never a running run).",
    "nodes": "List the nodes remembered as excluded per cluster; `nodes forgive NODE` clears one.",
    "affinity": "Print the per-rank CPU/NUMA binding plan for this machine.",
    "doctor": "Check devices, shared memory, dtype support and the vendor runtime.",
    "completion": "Print the shell completion script for bash, zsh or fish (completes run names).",
}


class LazyGroup(click.Group):
    """Loads a command's module only when that command runs (or its own --help is asked)."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        try:
            module = importlib.import_module(f"orchestrator.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"orchestrator.commands.{module_name}":
                raise
            return None
        return module.command

    def format_commands(self, ctx, formatter):
        # Short help from the table above, so listing commands imports none of them.
        rows = [(name, HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wmctl")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """wmctl: distributed PyTorch jobs from source to a self-healing run on any accelerator."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cli.main(args=argv, prog_name="wmctl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except WmctlError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        # A file or folder the machine refused (a full disk, a read-only folder, a name too long)
        # that no command foresaw: said in one line, as the unexpected failure it is (1).
        if debug:
            raise
        where = f" ({str(exc.filename)[:200]})" if exc.filename else ""
        click.echo(f"error: {exc.strerror or exc}{where}", err=True)
        sys.exit(1)


def run_as_module(entry: Callable[[], None] = main) -> None:
    """``python -m orchestrator.cli`` (how tests, detached and in-cluster watchers start wmctl).

    A CPython quirk made a watcher stopped by Ctrl-C exit by SIGINT (-2) instead of 130 (CI, 1 run
    in ~1): a KeyboardInterrupt that ends a string ``exec``/``eval`` (a dataclass or namedtuple being
    made when the signal lands) sets the runtime's unhandled_keyboard_interrupt flag even when a
    caller catches it (Python/pythonrun.c run_eval_code_obj), and under ``-m`` Py_RunMain then
    kills the process with SIGINT whatever exit code it chose (Modules/main.c). Every string
    eval clears the flag first: one that succeeds on the way out leaves the chosen exit code."""
    try:
        entry()
    finally:
        eval("0")


if __name__ == "__main__":  # pragma: no cover
    run_as_module()
