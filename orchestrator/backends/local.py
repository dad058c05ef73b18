"""Local backend: one torchrun agent per "node" on this machine, the default that runs anywhere.

Each node runs under a keeper process (``local_agent``) in its own session, with its output in
the run folder. Every process of a node carries ``WMCTL_LOCAL_TAG`` in its environment, so
teardown finds all of them (torchrun starts workers in sessions of their own), even after
the watcher itself was restarted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from ..errors import BackendError
from ..plan import AttemptContext, Plan
from ..render.local import render_local, run_dir
from ..runtime.protocol import parse_progress
from . import base as b

TAG_ENV = "WMCTL_LOCAL_TAG"


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise BackendError("no free TCP port on 127.0.0.1 for the rendezvous")


def _tag(attempt_name: str, node: int) -> str:
    return f"{attempt_name}/{node}"


def tagged_pids(prefix: str, exact: bool = False) -> list[int]:
    """PIDs whose environment has WMCTL_LOCAL_TAG starting with (or, ``exact``, equal to) ``prefix``."""
    needle = f"{TAG_ENV}={prefix}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        items = env.split(b"\0")
        if any(item == needle if exact else item.startswith(needle) for item in items):
            pids.append(int(entry))
    return pids


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return None


class _NodeWatch:
    def __init__(self, node: int, directory: Path):
        self.node = node
        self.log = directory / f"node-{node}.log"
        self.exit_file = directory / f"node-{node}.exit.json"
        self.pid_file = directory / f"node-{node}.pid.json"
        self.offset = 0
        self.partial = b""
        self.reported_start = False
        self.reported_end = False
        self.reported_pause = False
        self.phase = b.PENDING
        self.exit_code: int | None = None
        self.reason: str | None = None


class LocalBackend:
    name = "local"
    places_nodes = False     # this machine only

    def __init__(self) -> None:
        self._watches: dict[str, list[_NodeWatch]] = {}

    # -- planning ----------------------------------------------------------------------------
    def plan(self, spec, profile, ctx: AttemptContext) -> Plan:
        port = free_port(spec.local.master_port or spec.rendezvous.port)
        return render_local(spec, profile, ctx, port=port)

    # -- submit --------------------------------------------------------------------------------
    def submit(self, plan: Plan) -> b.AttemptRef:
        directory = Path(plan.extra["attempt_dir"])
        ref = b.AttemptRef("local", plan.run, plan.attempt)
        try:
            directory.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            # The attempt exists already (a second watcher, or a retry after a crash): adopt it.
            return ref
        Path(plan.extra["checkpoint_dir"]).mkdir(parents=True, exist_ok=True)
        (directory / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1))
        for agent in plan.resources:
            node = agent["node"]
            watch = _NodeWatch(node, directory)
            keeper = [sys.executable, "-m", "orchestrator.backends.local_agent", "--log", str(watch.log),
                      "--exit-file", str(watch.exit_file), "--pid-file", str(watch.pid_file)]
            if agent.get("cpus"):
                keeper += ["--cpus", agent["cpus"]]
            env = {**os.environ, **agent["env"], TAG_ENV: _tag(plan.attempt_name, node)}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                              env.get("PYTHONPATH")]))
            try:
                subprocess.Popen([*keeper, "--", *agent["argv"]], cwd=agent["cwd"], env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            except OSError as exc:
                self.cancel(ref)
                raise BackendError(f"cannot start node {node} of {plan.attempt_name}: {exc}") from None
        return ref

    # -- observe -----------------------------------------------------------------------------
    def _node_watches(self, ref: b.AttemptRef) -> list[_NodeWatch]:
        key = ref.attempt_name
        if key not in self._watches:
            directory = run_dir(ref.run) / f"attempt-{ref.attempt}"
            plan_file = directory / "plan.json"
            if not plan_file.exists():
                raise BackendError(f"no local attempt {key} (looked in {directory})")
            nodes = len(json.loads(plan_file.read_text())["resources"])
            self._watches[key] = [_NodeWatch(i, directory) for i in range(nodes)]
        return self._watches[key]

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        events: list[b.Event] = []
        statuses: list[b.NodeStatus] = []
        for w in self._node_watches(ref):
            host = f"localhost-{w.node}"
            # c10d assigns ranks in join order: global rank 0 (the one that reports) can be on any node.
            events += self._read_progress(w)
            if not w.reported_end:
                events += self._check_node(ref, w, host)
            statuses.append(b.NodeStatus(w.node, w.phase, host, w.exit_code, w.reason))
        return b.Observation(events, statuses)

    def _check_node(self, ref: b.AttemptRef, w: _NodeWatch, host: str) -> list[b.Event]:
        events = []
        if w.exit_file.exists():
            data = json.loads(w.exit_file.read_text())
            w.exit_code = data["exit_code"]
            w.reason = "SIGKILL" if data.get("signal") == signal.SIGKILL else None
            w.phase = b.SUCCEEDED if w.exit_code == 0 else b.FAILED
            w.reported_end = True
            events += self._read_progress(w)
            return events + [b.Event(b.NODE_EXITED, time=data["time"], node=w.node, host=host,
                                     exit_code=w.exit_code, reason=w.reason,
                                     message=f"torchrun agent exited with {w.exit_code}")]
        if not w.pid_file.exists():
            return events
        pids = json.loads(w.pid_file.read_text())
        keeper_state = _proc_state(pids["keeper"])
        if keeper_state in (None, "Z", "X") and not w.exit_file.exists():
            w.phase, w.reason, w.reported_end = b.LOST, "gone", True
            return [b.Event(b.NODE_LOST, node=w.node, host=host, reason="gone",
                            message="the node's processes vanished without an exit status (killed)")]
        if not w.reported_start:
            w.reported_start, w.phase = True, b.RUNNING
            events.append(b.Event(b.NODE_STARTED, time=pids["started"], node=w.node, host=host))
        agent_state = _proc_state(pids["agent"])
        if agent_state == "T" and not w.reported_pause:
            w.reported_pause, w.phase = True, b.PAUSED
            events.append(b.Event(b.NODE_PAUSED, node=w.node, host=host, message="torchrun agent is stopped (SIGSTOP)"))
        elif agent_state not in ("T", None) and w.reported_pause:
            w.reported_pause, w.phase = False, b.RUNNING
        return events

    def _read_progress(self, w: _NodeWatch) -> list[b.Event]:
        try:
            with open(w.log, "rb") as fh:
                fh.seek(w.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        w.offset += len(chunk)
        data = w.partial + chunk
        lines = data.split(b"\n")
        w.partial = lines.pop()
        events = []
        for raw in lines:
            progress = parse_progress(raw.decode("utf-8", "replace"))
            if progress is not None:
                events.append(b.Event(b.PROGRESS, time=progress.get("time", time.time()), node=w.node,
                                      host=f"localhost-{w.node}", progress=progress))
        return events

    # -- logs / cancel / attempts ------------------------------------------------------------
    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False) -> Iterator[str]:
        path = run_dir(ref.run) / f"attempt-{ref.attempt}" / f"node-{node}.log"
        if not path.exists():
            raise BackendError(f"no log for node {node} of {ref.attempt_name} ({path})")
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            while True:
                line = fh.readline()
                if line:
                    yield line.rstrip("\n")
                    continue
                if not follow or (path.parent / f"node-{node}.exit.json").exists():
                    return
                time.sleep(0.2)

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        """SIGKILL every process of the attempt (SIGTERM first with ``graceful``)."""
        prefix = f"{ref.attempt_name}/"
        if graceful:
            for pid in tagged_pids(prefix):
                _signal(pid, signal.SIGTERM)
            deadline = time.time() + 40
            while tagged_pids(prefix) and time.time() < deadline:
                time.sleep(0.2)
        for _ in range(50):
            pids = tagged_pids(prefix)
            if not pids:
                return
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)

    def release(self, ref: b.AttemptRef) -> None:
        """Nothing to free: ended processes hold no names, and the logs are in the run folder."""

    def close(self) -> None:
        """No background threads: the agents are separate processes that outlive this object."""

    def kill_node(self, ref: b.AttemptRef, node: int, sig: int = signal.SIGKILL) -> int:
        """Signal every process of one node (used to inject faults). Returns how many."""
        pids = tagged_pids(_tag(ref.attempt_name, node), exact=True)
        for pid in pids:
            _signal(pid, sig)
        return len(pids)

    def attempts(self, run: str) -> list[b.AttemptRef]:
        directory = run_dir(run)
        found = sorted(int(p.name.split("-")[1]) for p in directory.glob("attempt-*") if p.name.split("-")[1].isdigit())
        return [b.AttemptRef("local", run, n) for n in found]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
