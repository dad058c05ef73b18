"""The keeper of one slot of an attempt with spare nodes: its rounds, and the loop that runs them.

An attempt with ``restart.spares: k`` starts nodes + k keepers (slots); ``rounds/round-N.json``
names the slots that run in round N, its rendezvous id and the environment it adds. Round 0 is
written at submit (the first ``nodes`` slots); each in-place recovery writes the next, with the
dead slot replaced by a spare (docs/spares.md). A keeper watches the folder: a newer round that
names it kills its torchrun and every worker (blocked in a collective on the dead peer or not)
and starts a new torchrun with the new rendezvous id; a spare's keeper, idle until then, just
starts one. A slot a newer round leaves out (the dead or cut-off node) stops.

It runs where the node runs (a local process, a container, a Slurm task, a pod), so it is one
file of standard library only, with no import from wmctl: a backend may mount this file into an
image that has no wmctl in it and run ``python keeper.py --rounds DIR --slot N ... -- torchrun ...``
(``tests/unit/test_keeper_standalone.py`` holds it to that).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable

#: the environment variable that marks every process of one slot (runtime/protocol.py ENV_LOCAL_TAG,
#: repeated here so this file stands alone; a unit test keeps the two equal)
ENV_LOCAL_TAG = "WMCTL_LOCAL_TAG"

POLL_S = 0.05
CLOSED = "closed"          # written at teardown: idle spares stop


def round_file(directory: str | Path, n: int) -> Path:
    return Path(directory) / f"round-{n:04d}.json"


def write_round(directory: str | Path, n: int, active: list[int], rdzv_id: str, env: dict[str, str]) -> None:
    path = round_file(directory, n)
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps({"round": n, "active": active, "rdzv_id": rdzv_id, "env": env,
                               "time": time.time()}))
    os.replace(tmp, path)


def newest_round(directory: str | Path) -> dict[str, Any] | None:
    found = sorted(Path(directory).glob("round-*.json"))
    for path in reversed(found):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return None


def all_rounds(directory: str | Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(Path(directory).glob("round-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def close(directory: str | Path) -> None:
    try:
        (Path(directory) / CLOSED).touch()
    except OSError:
        pass


def with_rdzv_id(command: list[str], rdzv_id: str) -> list[str]:
    """``command`` with torchrun's ``--rdzv-id=`` replaced (only before the ``--`` that ends its options)."""
    out, options = [], True
    for word in command:
        if options and word == "--":
            options = False
        out.append(f"--rdzv-id={rdzv_id}" if options and word.startswith("--rdzv-id=") else word)
    return out


TORCHRUN_MODULE = "torch.distributed.run"


def prewarm(command: list[str]) -> Callable[[list[str]], Any] | None:
    """torchrun's ``main``, imported now while the slot waits (torch's import is the larger part
    of an agent's start), when ``command`` is ``python -m torch.distributed.run ...``; else None."""
    if command[1:3] != ["-m", TORCHRUN_MODULE]:
        return None
    try:
        from torch.distributed import run as torchrun
    except ImportError:
        return None
    return torchrun.main


def sync_poll_s(active: int) -> float:
    """How often an agent waiting for the round's other nodes reads the rendezvous state. torch
    reads it at most once a second: its state holder caches the state for a second
    (dynamic_rendezvous.py ``_BackendRendezvousStateHolder``, ``cache_duration=1``) and its join
    loop sleeps a second between reads (``_delay(seconds=1)`` on ``_Action.SYNC``), which costs a
    recovery about a second after the last node joined (measured: 1.06-1.27 s for two agents that
    join at once). A round's nodes all start within a moment of each other, so a keeper's agent
    reads faster, scaled so the store sees about 1000 reads a second at most whatever the number
    of nodes."""
    return min(1.0, max(0.05, active / 1000.0))


def quicken_rendezvous(poll_s: float) -> None:
    """In a forked torchrun (this process is the agent): its rendezvous state is read every
    ``poll_s`` instead of every second (the state holder's cache and the join loop's sleep), and
    the random skew of its first join, up to 0.3 s so that many agents do not reach the store at
    once, is scaled by the same factor (the whole 0.3 s again from about 1000 nodes). Nothing
    changes where torch's module lacks either name (another torch): the agent reads as torch does."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    except ImportError:
        return
    slow = getattr(dr, "_delay", None)
    holder = getattr(dr, "_BackendRendezvousStateHolder", None)
    if slow is None or holder is None:
        return

    def delay(seconds: Any) -> None:
        if seconds == 1:
            slow(poll_s)
        elif isinstance(seconds, tuple):     # the first round's random skew, (0, 0.3): scaled alike
            slow((seconds[0] * poll_s, seconds[1] * poll_s))
        else:
            slow(seconds)

    class QuickHolder(holder):  # type: ignore[misc,valid-type]
        def __init__(self, backend: Any, settings: Any, cache_duration: float = 1) -> None:
            super().__init__(backend, settings, cache_duration=min(cache_duration, poll_s))

    dr._delay = delay
    dr._BackendRendezvousStateHolder = QuickHolder  # type: ignore[misc]  # a subclass in its place


class Forked:
    """A round's torchrun forked from the keeper, torch already imported: ``subprocess.Popen``'s
    few methods the loop uses."""

    def __init__(self, main: Callable[[list[str]], Any], args: list[str], env: dict[str, str], log: IO[bytes],
                 poll_s: float = 1.0):
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:      # the child: never returns
            code = 1
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                os.environ.update(env)
                sys.argv = ["torchrun", *args]
                quicken_rendezvous(poll_s)
                main(args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:      # noqa: BLE001 - the child reports any error and exits 1, as torchrun does
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def _set(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:      # reaped already (the keeper reaps orphans after a kill)
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self._set(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("torchrun", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


def _own_tree(tag: str) -> list[int]:
    """Every other process carrying this keeper's tag: its torchrun and torchrun's workers (which
    run in sessions of their own)."""
    needle = f"{ENV_LOCAL_TAG}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _kill_tree(tag: str, proc: "subprocess.Popen[bytes] | Forked | None") -> None:
    for _ in range(200):
        pids = _own_tree(tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if proc is not None:
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        _reap()
    if proc is not None:
        proc.wait()
    _reap()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def run_rounds(directory: str, slot: int | None, command: list[str], *, log_path: str, exit_file: str,
               pid_file: str) -> int:
    """The keeper's loop for one slot; returns its exit code (0 when its torchrun succeeded, or
    when it was stopped: dropped from a round, or closed)."""
    tag = os.environ.get(ENV_LOCAL_TAG, "")
    current, ran, stopping = -1, False, False
    proc: subprocess.Popen[bytes] | Forked | None = None
    main = prewarm(command)    # paid now, not after a node is lost

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True      # a graceful cancel: the child checkpoints and stops, and so does this keeper
        if proc is not None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    # No torchrun yet (a spare waits for a round that names it): the engine still sees the keeper.
    _write(pid_file, {"keeper": os.getpid(), "agent": None, "started": time.time(), "round": -1})
    # "-": this keeper's own stdout (a container's, which `docker logs` reads), never reopened by
    # path: /dev/stdout of a pipe the engine made may not be openable by the container's user
    with (os.fdopen(os.dup(1), "ab", buffering=0) if log_path == "-" else open(log_path, "ab", buffering=0)) as log:
        while True:
            if (Path(directory) / CLOSED).exists() or (stopping and proc is None):
                _kill_tree(tag, proc)
                return 0
            info = newest_round(directory)
            if info is not None and info["round"] > current and not stopping:
                if proc is not None:
                    _kill_tree(tag, proc)
                    proc = None
                current = info["round"]
                if slot in info["active"]:
                    _reap()
                    try:
                        os.unlink(exit_file)
                    except FileNotFoundError:
                        pass
                    argv = with_rdzv_id(command, info["rdzv_id"])
                    proc = (Forked(main, argv[3:], info["env"], log, sync_poll_s(len(info["active"])))
                            if main is not None else
                            subprocess.Popen(argv, env={**os.environ, **info["env"]}, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                    _write(pid_file, {"keeper": os.getpid(), "agent": proc.pid, "started": time.time(),
                                      "round": current})
                    ran = True
                elif ran:
                    return 0     # replaced: this slot is out of the attempt now
            code = proc.poll() if proc is not None else None
            if code is not None:
                proc = None
                exit_code = 128 - code if code < 0 else code
                _write(exit_file, {"exit_code": exit_code, "signal": -code if code < 0 else None,
                                   "time": time.time(), "round": current})
                if exit_code == 0 or stopping:
                    _reap()
                    return exit_code
                # failed (a peer died under it, most likely): wait for the next round or teardown
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python keeper.py --rounds DIR --slot N --log F --exit-file F --pid-file F -- COMMAND...``:
    the keeper's loop as a program of its own, for a backend that runs it in a container, a pod or
    a Slurm task (the local backend calls ``run_rounds`` from its agent)."""
    parser = argparse.ArgumentParser(prog="wmctl-keeper")
    parser.add_argument("--rounds", required=True, help="the attempt's rounds folder")
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--log", required=True, help="torchrun's output: a file, or - for this keeper's stdout")
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the command to run each round (after --) is missing")
    return run_rounds(args.rounds, args.slot, command, log_path=args.log, exit_file=args.exit_file,
                      pid_file=args.pid_file)


if __name__ == "__main__":
    sys.exit(main())
