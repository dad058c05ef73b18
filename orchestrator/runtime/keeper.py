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

Two round sources: the folder above (local, Docker, Slurm), or, on Kubernetes, the attempt's
rounds ConfigMap read through the API server (``--rounds-url``) with the pod's service-account
token: a ConfigMap mounted as a volume changes only at the kubelet's next sync (a minute), where
a watch of it is news at once. Its data holds the same ``round-N.json`` documents and a
``closed`` key.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import warnings
from pathlib import Path
from typing import IO, Any, Callable

#: the environment variable that marks every process of one slot (runtime/protocol.py ENV_LOCAL_TAG,
#: repeated here so this file stands alone; a unit test keeps the two equal)
ENV_LOCAL_TAG = "WMCTL_LOCAL_TAG"
#: the prefix of a progress line (runtime/protocol.py PROGRESS_PREFIX and format_progress's JSON,
#: repeated here so this file stands alone; a unit test keeps the two equal)
PROGRESS_PREFIX = "WMCTL-PROGRESS "
#: the progress event a keeper with a hold writes to its slot's log when its torchrun fails: the
#: watcher may tell the job's own error from it at once, without waiting for the hold (docs/spares.md)
KEEPER_EXIT = "keeper_exit"

POLL_S = 0.05
CLOSED = "closed"          # written at teardown: idle spares stop
API_POLL_S = 0.25          # a keeper's first wait before it reads its rounds ConfigMap again after a failure
WATCH_S = 300              # how long one watch of the rounds ConfigMap lasts before it is opened anew
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"     # the pod's service-account token and CA


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


def newest_of(data: dict[str, str]) -> dict[str, Any] | None:
    """The newest round among a rounds ConfigMap's ``data`` (keys ``round-NNNN.json``)."""
    for key in sorted((k for k in data if k.startswith("round-") and k.endswith(".json")), reverse=True):
        try:
            found = json.loads(data[key])
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


class FolderRounds:
    """Rounds from a folder of ``round-N.json`` files (local, Docker, Slurm)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def newest(self) -> dict[str, Any] | None:
        return newest_round(self.directory)

    def closed(self) -> bool:
        return (self.directory / CLOSED).exists()


class ApiRounds:
    """Rounds from a ConfigMap through the Kubernetes API (``url``: its path on the API server):
    read once, then watched (one long request per keeper, not a read every moment: an API server
    serves hundreds of keepers); read again and watched anew whenever a watch ends or fails.
    Authenticated with the service-account token (read again each time: the kubelet rotates bound
    tokens) and checked against its CA. While the API cannot be reached the last round read holds:
    a moment of API trouble is no news, and the keeper's torchrun runs on meanwhile."""

    def __init__(self, url: str, token_file: str, ca_file: str | None, log: IO[bytes] | None = None):
        self.url, self.token_file, self.log = url, token_file, log
        base, _, self.name = url.rstrip("/").rpartition("/")
        self.watch_url = f"{base}?watch=1&fieldSelector=metadata.name%3D{self.name}&timeoutSeconds={WATCH_S}"
        self.context = None
        if url.startswith("https:"):
            self.context = ssl.create_default_context(cafile=ca_file if ca_file and os.path.exists(ca_file) else None)
        self.data: dict[str, str] = {}
        self.failing = False
        self._thread: threading.Thread | None = None

    def _open(self, url: str, timeout: float) -> Any:
        headers = {"Accept": "application/json"}
        try:
            with open(self.token_file, encoding="utf-8") as fh:
                headers["Authorization"] = f"Bearer {fh.read().strip()}"
        except OSError:
            pass
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout,
                                      context=self.context)

    def _take(self, obj: Any) -> str:
        """Keep a ConfigMap's data; its resourceVersion (to watch from)."""
        data = obj.get("data") if isinstance(obj, dict) else None
        if isinstance(data, dict):
            self.data = dict(data)
        return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self) -> None:
        wait = API_POLL_S
        while True:
            try:
                with self._open(self.url, 10) as resp:
                    rv = self._take(json.loads(resp.read()))
                with self._open(f"{self.watch_url}&resourceVersion={rv}", WATCH_S + 10) as stream:
                    self.failing, wait = False, API_POLL_S
                    for line in stream:
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._take(event.get("object"))
                        elif event.get("type") == "ERROR":       # 410 Gone: read again, watch anew
                            break
            except (OSError, ValueError) as exc:      # URLError, HTTPError, timeouts, a cut stream
                if not self.failing and self.log is not None:
                    self.log.write(f"wmctl keeper: cannot read the rounds at {self.url}: {exc}\n".encode())
                    self.log.flush()
                self.failing = True
                time.sleep(wait)
                wait = min(wait * 2, 5.0)

    def newest(self) -> dict[str, Any] | None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._follow, name="wmctl-keeper-rounds", daemon=True)
            self._thread.start()
        return newest_of(self.data)

    def closed(self) -> bool:
        if self._thread is None:
            self.newest()
        return CLOSED in self.data


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
        with warnings.catch_warnings():
            # 3.12+ warns of fork() in a process with threads (ApiRounds' watch): the child uses
            # none of that thread's objects, and CPython re-initialises its own locks in the child
            warnings.simplefilter("ignore", DeprecationWarning)
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


def exit_line(round_: int, slot: int | None, exit_code: int, signal_: int | None, when: float | None = None) -> str:
    """The progress line (no newline) that says this slot's torchrun of round ``round_`` failed, in
    runtime/protocol.py's format: ``WMCTL-PROGRESS {json}``, keys sorted, no spaces."""
    payload = {"event": KEEPER_EXIT, "round": round_, "slot": slot, "exit_code": exit_code, "signal": signal_,
               "time": round(time.time() if when is None else when, 3)}
    return PROGRESS_PREFIX + json.dumps(payload, sort_keys=True, separators=(",", ":"))


def _ended(code: int, round_: int, slot: int | None, exit_file: str, stopping: bool, log: IO[bytes] | None) -> int:
    """A round's torchrun ended with ``code`` (negative: a signal): its exit record written, and,
    when it failed (not stopped) and ``log`` is given (a keeper with a hold), its ``exit_line``
    after its output. Returns the exit code as a shell tells it (128 + the signal)."""
    exit_code = 128 - code if code < 0 else code
    signal_ = -code if code < 0 else None
    # signalled: a signal reached the keeper first (a scheduler's checkpoint signal, a graceful
    # cancel), so the end was the scheduler's doing, not the job's error
    _write(exit_file, {"exit_code": exit_code, "signal": signal_, "time": time.time(), "round": round_,
                       "signalled": stopping})
    if log is not None and exit_code != 0 and not stopping:
        try:
            log.write((exit_line(round_, slot, exit_code, signal_) + "\n").encode())
        except OSError:
            pass      # an output nobody reads: the hold still ends the keeper with its code
    return exit_code


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def run_rounds(directory: str | None, slot: int | None, command: list[str], *, log_path: str, exit_file: str,
               pid_file: str, source: "FolderRounds | ApiRounds | None" = None, hold_s: float | None = None) -> int:
    """The keeper's loop for one slot; returns its exit code (0 when its torchrun succeeded, or
    when it was stopped: dropped from a round, or closed). Rounds come from ``source`` (default:
    the folder ``directory``).

    ``hold_s``: how long a failed torchrun's slot waits for a newer round before the keeper
    exits with its code (None: until teardown). Where the watcher learns a node's end only from
    the node's own exit (a pod), a job's own error must end the keepers; a peer's loss (the
    usual cause of a survivor's failure) is answered by a new round well within it. With a hold,
    a failed torchrun's end is also said at once in the slot's log (``exit_line``): its watcher
    reads the output before it and may tell the job's own error from it without waiting."""
    tag = os.environ.get(ENV_LOCAL_TAG, "")
    rounds = source if source is not None else FolderRounds(directory or ".")
    current, ran, stopping = -1, False, False
    failed_at: float | None = None
    failed_code = 0
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
            if rounds.closed() or (stopping and proc is None):
                _kill_tree(tag, proc)
                return 0
            info = rounds.newest()
            if info is not None and info["round"] > current and not stopping:
                failed_at = None
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
                exit_code = _ended(code, current, slot, exit_file, stopping, log if hold_s is not None else None)
                if exit_code == 0 or stopping:
                    _reap()
                    return exit_code
                # failed (a peer died under it, most likely): wait for the next round or teardown
                failed_at, failed_code = time.monotonic(), exit_code
            if failed_at is not None and hold_s is not None and time.monotonic() - failed_at >= hold_s:
                _reap()
                return failed_code      # no new round came: the job's own failure, the keeper ends with it
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python keeper.py --rounds DIR --slot N --log F --exit-file F --pid-file F -- COMMAND...``:
    the keeper's loop as a program of its own, for a backend that runs it in a container, a pod or
    a Slurm task (the local backend calls ``run_rounds`` from its agent)."""
    parser = argparse.ArgumentParser(prog="wmctl-keeper")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--rounds", help="the attempt's rounds folder")
    where.add_argument("--rounds-url", help="the attempt's rounds ConfigMap on the Kubernetes API server")
    parser.add_argument("--token-file", default=f"{SA_DIR}/token", help="with --rounds-url: the bearer token")
    parser.add_argument("--ca-file", default=f"{SA_DIR}/ca.crt", help="with --rounds-url: the API server's CA")
    parser.add_argument("--hold", type=float, default=None,
                        help="seconds a failed round waits for a newer one before the keeper exits with its code")
    slot = parser.add_mutually_exclusive_group(required=True)
    slot.add_argument("--slot", type=int)
    slot.add_argument("--slot-env", help="the environment variable that holds the slot (a pod's JOB_COMPLETION_INDEX)")
    parser.add_argument("--log", required=True, help="torchrun's output: a file, or - for this keeper's stdout")
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the command to run each round (after --) is missing")
    if args.slot_env is not None:
        raw = os.environ.get(args.slot_env, "")
        if not raw.isdigit():
            parser.error(f"--slot-env {args.slot_env}: the environment holds {raw!r}, not a slot number")
        args.slot = int(raw)
    source = (ApiRounds(args.rounds_url, args.token_file, args.ca_file, sys.stderr.buffer)
              if args.rounds_url else None)
    return run_rounds(args.rounds, args.slot, command, log_path=args.log, exit_file=args.exit_file,
                      pid_file=args.pid_file, source=source, hold_s=args.hold)


if __name__ == "__main__":
    sys.exit(main())
