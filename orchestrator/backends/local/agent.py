"""The keeper of one local "node": runs its torchrun agent and records how it ended.

Started in its own session by the local backend, so a watcher that dies leaves the run
alive and a restarted watcher can still read how each node ended (from the exit file: a
process that is not our child has no exit status to wait for). It is a child subreaper,
so torchrun's workers (started in sessions of their own) stay in this node's tree.
Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from orchestrator.runtime.topology import parse_cpulist

PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the tag scan in cancel still finds workers
        pass


def oom_kills(root: str = "/") -> tuple[int, str] | None:
    """How many processes the kernel's OOM killer has killed in this process's cgroup and below
    (cgroup v2 ``memory.events``, ``oom_kill``), and that file; None without cgroup v2 or the
    memory controller. The count before and after the node ran says whether it killed one of it."""
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if not line.startswith("0::"):
            continue
        path = os.path.join(root, "sys/fs/cgroup", line[3:].strip().lstrip("/"), "memory.events")
        try:
            with open(path, encoding="utf-8") as fh:
                for row in fh.read().splitlines():
                    key, _, value = row.partition(" ")
                    if key == "oom_kill":
                        return int(value), path
        except (OSError, ValueError):
            return None
    return None


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wmctl-local-agent")
    parser.add_argument("--log", required=True)
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--cpus", default=None)
    parser.add_argument("--rounds", default=None, help="spare nodes: the rounds folder (runtime/keeper.py)")
    parser.add_argument("--slot", type=int, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    _become_subreaper()
    if args.cpus:
        os.sched_setaffinity(0, parse_cpulist(args.cpus))   # inherited by torchrun and its workers
    if args.rounds is not None:
        from orchestrator.runtime.keeper import run_rounds

        return run_rounds(args.rounds, args.slot, command, log_path=args.log, exit_file=args.exit_file,
                          pid_file=args.pid_file)
    oom_before = oom_kills()
    with open(args.log, "ab", buffering=0) as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        write_json_atomic(args.pid_file, {"keeper": os.getpid(), "agent": proc.pid, "started": time.time()})

        def forward(signum, _frame):
            # torchrun forwards SIGTERM to its workers (graceful checkpoint) and kills after 30 s.
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        code = proc.wait()
    # Reap whatever orphans the subreaper inherited so none linger as zombies.
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    exit_code = 128 - code if code < 0 else code   # -9 -> 137, as a container runtime reports it
    ended: dict = {"exit_code": exit_code, "signal": -code if code < 0 else None, "time": time.time()}
    oom_after = oom_kills()
    if oom_before is not None and oom_after is not None and oom_after[0] > oom_before[0]:
        ended["oom_kills"], ended["oom_cgroup"] = oom_after[0] - oom_before[0], oom_after[1]
    write_json_atomic(args.exit_file, ended)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
