"""Local backend: one torchrun agent per "node" on this machine, the default that runs anywhere.

Each node runs under a keeper process (``backends/local/agent.py``) in its own session, with its output in
the run folder. Every process of a node carries ``WMCTL_LOCAL_TAG`` in its environment, so
teardown finds all of them (torchrun starts workers in sessions of their own), even after
the watcher itself was restarted.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from ... import layout
from ...errors import BackendError, RunNotFound, SpecError, WmctlError
from ...launch import fence_epoch
from ...plan import AttemptContext, HostFacts, Plan
from ...runtime.protocol import ENV_FENCE_EPOCH, ENV_LOCAL_TAG, ENV_NODE_NAME, ENV_RESUME, run_checkpoint_dir
from ...spec import JobSpec
from ...speccheck import context_problems
from ...state import open_store
from ...vendors import VendorProfile
from .. import base as b
from ...runtime import keeper as r
from .classify import NodeView, node_events
from .render import LocalRequest, local_checkpoint_dir, render_local

TAG_ENV = ENV_LOCAL_TAG
READ_CHUNK_BYTES = 1 << 20     # how much of a node's log one read takes


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise BackendError("no free TCP port on 127.0.0.1 for the rendezvous")


STORE_SLOT = "store"     # the tag's node part for an attempt's c10d store process (spare nodes)


def _tag(attempt_name: str, node: int | str, run_id: str = "") -> str:
    """``<run>-a<N>/<node>@<run id>``: the run id is random per run and kept in its record, so two
    runs of one name (two WMCTL_HOMEs, two users) never share a tag."""
    return f"{attempt_name}/{node}@{run_id}" if run_id else f"{attempt_name}/{node}"


def tagged_pids(prefix: str, exact: bool = False, run_id: str | None = None) -> list[int]:
    """PIDs whose environment has WMCTL_LOCAL_TAG starting with (or, ``exact``, equal to up to
    the run id) ``prefix``. With ``run_id`` (teardown), only processes this run started: its id
    ends the tag and they run as this user; a process whose tag has another id, or none, or
    that another user owns, is never listed."""
    needle = f"{TAG_ENV}={prefix}".encode()
    uid = os.getuid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            owner = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        for item in env.split(b"\0"):
            if not item.startswith(needle):
                continue
            tag = item[len(f"{TAG_ENV}="):].decode(errors="replace")
            body, _, tag_id = tag.partition("@")
            if exact and body != prefix:
                continue
            if run_id is not None and (tag_id != run_id or owner != uid):
                continue
            pids.append(int(entry))
            break
    return pids


def run_id_of(run: str) -> str:
    """The run's random id from its record ("" for a record from before run ids)."""
    try:
        return open_store(run).load().run_id
    except WmctlError:
        return ""


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return None


class _NodeWatch(NodeView):
    """A node's files in the attempt folder, and how far its log has been read."""

    def __init__(self, ref: b.AttemptRef, node: int):
        super().__init__(node, layout.local_host(node))
        self.log = layout.node_log(ref.run, ref.attempt, node)
        self.exit_file = layout.node_exit_file(ref.run, ref.attempt, node)
        self.pid_file = layout.node_pid_file(ref.run, ref.attempt, node)
        self.offset = 0
        self.lines = b.LineSplitter()      # '\r' ends a line; a line past MAX_LINE_BYTES is cut
        self.output_at: dict[int, float] = {}


class LocalBackend(b.Backend[LocalRequest]):
    name = "local"
    places_nodes = False              # this machine only
    graceful_cancel = True            # SIGTERM to every process, then a wait for the checkpoint
    runs_image = False                # the agents run this machine's interpreter
    checkpoints_outlive_nodes = True  # checkpoints are on this machine's disk
    log_options = frozenset({"tail"})  # a node's output goes straight to a file: no per-line times
    spares = True                     # spare keepers wait beside the nodes (runtime/keeper.py, docs/spares.md)
    replenishes_spares = True         # a used spare's slot is followed by a new keeper

    def __init__(self) -> None:
        self._watches: dict[str, list[_NodeWatch]] = {}

    # -- planning ----------------------------------------------------------------------------
    @classmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext,
               host: HostFacts) -> Plan[LocalRequest]:
        return render_local(spec, profile, ctx, host)

    def host_facts(self, spec: JobSpec) -> HostFacts:
        """This machine, and a rendezvous port free on it now (the dry run and the submit
        choose it the same way): ``local.master_port`` when set and free, else one the OS picks.
        Never ``rendezvous.port`` (29500) by default: every run on this machine would then aim at
        one port, and an agent that finds it taken joins the other run's store as a client, then
        fails when that run ends."""
        return HostFacts.of_this_machine(port=free_port(spec.local.master_port or 0))

    def check_host(self, spec: JobSpec) -> list[tuple[str, str]]:
        """The job runs in image.context (its working directory): a folder that is not there
        fails every node at start, so it is refused before anything is submitted."""
        return context_problems(spec)

    def prepare_host(self, spec: JobSpec) -> list[str]:
        """The checkpoint folder the spec names (checkpoint.dir, or its host_path volume) is made
        here, as submit always did, now with a note when it did not exist. Other volumes are not
        mounted on this backend (the job runs on this machine, with its folders as they are)."""
        if not spec.checkpoint.dir:
            return []       # the run folder's own checkpoints/: nothing the user named
        ckpt = local_checkpoint_dir(spec)
        if ckpt.exists():
            return []
        try:
            ckpt.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise SpecError([("checkpoint.dir", f"the checkpoint folder {ckpt} cannot be created: {why}; "
                                                "point it at a folder you can write")]) from None
        return [f"created the missing checkpoint folder {ckpt} (checkpoint.dir {spec.checkpoint.dir})"]

    def checkpoint_root(self, spec: JobSpec) -> tuple[str, bool]:
        return run_checkpoint_dir(str(local_checkpoint_dir(spec)), spec.name), True

    # -- submit --------------------------------------------------------------------------------
    def submit(self, plan: Plan[LocalRequest]) -> b.AttemptRef:
        if not isinstance(plan.request, LocalRequest):
            raise BackendError(f"a {plan.backend} plan cannot be submitted to the local backend",
                               hint="plan it for the local backend (-b local)")
        directory = plan.request.attempt_dir
        ref = b.AttemptRef(self.name, plan.run, plan.attempt)
        try:
            directory.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            # The attempt exists already (a second watcher, or a retry after a crash): adopt it.
            return ref
        plan.request.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        run_id = run_id_of(plan.run)
        (directory / layout.PLAN_FILE).write_text(json.dumps(plan.to_dict(), indent=1))
        rounds = layout.rounds_dir(plan.run, plan.attempt)
        if plan.request.spares:
            self._start_store(plan, run_id)
            rounds.mkdir()
            r.write_round(rounds, 0, [a["node"] for a in plan.resources if not a.get("spare")],
                          layout.round_rendezvous_id(plan.run, plan.attempt, 0), {})
        for agent in plan.resources:
            try:
                self._start_keeper(ref, agent, rounds if plan.request.spares else None, run_id)
            except OSError as exc:
                self.cancel(ref)
                raise BackendError(f"cannot start node {agent['node']} of {plan.attempt_name}: {exc}") from None
        return ref

    def _start_keeper(self, ref: b.AttemptRef, agent: dict[str, Any], rounds: Path | None, run_id: str) -> None:
        """One slot's keeper (agent.py) in a session of its own, tagged; with ``rounds``, the
        keeper runs the rounds that folder names (spare nodes)."""
        node = agent["node"]
        watch = _NodeWatch(ref, node)
        keeper = [sys.executable, "-m", "orchestrator.backends.local.agent", "--log", str(watch.log),
                  "--exit-file", str(watch.exit_file), "--pid-file", str(watch.pid_file)]
        if agent.get("cpus"):
            keeper += ["--cpus", agent["cpus"]]
        if rounds is not None:
            keeper += ["--rounds", str(rounds), "--slot", str(node)]
        env = {**os.environ, **agent["env"], TAG_ENV: _tag(ref.attempt_name, node, run_id)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                          env.get("PYTHONPATH")]))
        subprocess.Popen([*keeper, "--", *agent["argv"]], cwd=agent["cwd"], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def _start_store(self, plan: Plan[LocalRequest], run_id: str) -> None:
        """The attempt's c10d store in a process of its own (runtime/c10dstore.py), tagged like its nodes."""
        env = {**os.environ, TAG_ENV: _tag(plan.attempt_name, STORE_SLOT, run_id)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                          env.get("PYTHONPATH")]))
        log = plan.request.attempt_dir / "store.log"
        try:
            with open(log, "ab") as out:
                subprocess.Popen([sys.executable, "-m", "orchestrator.runtime.c10dstore", "--port",
                                  str(plan.request.port)], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise BackendError(f"cannot start the c10d store of {plan.attempt_name}: {exc}") from None

    # -- spare nodes ---------------------------------------------------------------------------
    def recover_in_place(self, ref: b.AttemptRef, node: int) -> b.InPlaceRecovery | None:
        """Replace lost slot ``node`` with an idle spare: its processes are killed (a frozen node
        too: fenced off), and the next round names the spare in its place; every keeper of the
        round restarts its torchrun (runtime/keeper.py). None when the attempt has no spare left."""
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        history = r.all_rounds(rounds)
        if not history or node not in history[-1]["active"]:
            return None
        used = {slot for info in history for slot in info["active"]}
        run_id = run_id_of(ref.run)
        watches = self._node_watches(ref)
        idle = [w.node for w in watches if w.node not in used
                and tagged_pids(_tag(ref.attempt_name, w.node), exact=True, run_id=run_id)]
        if not idle:
            return None
        spare = idle[0]
        self.kill_node(ref, node)
        current = history[-1]
        active = [spare if slot == node else slot for slot in current["active"]]
        n = current["round"] + 1
        r.write_round(rounds, n, active, layout.round_rendezvous_id(ref.run, ref.attempt, n),
                      {ENV_RESUME: "1", ENV_FENCE_EPOCH: str(fence_epoch(ref.attempt, n))})
        for w in watches:       # the new round's news only: each keeper starts over (its log goes on)
            if w.node in active:
                w.reported_start = w.reported_end = w.reported_pause = False
                w.phase, w.exit_code, w.reason = b.PENDING, None, None
        return b.InPlaceRecovery(round=n, lost=node, spare=spare, spares_left=len(idle) - 1)

    def replenish_spare(self, ref: b.AttemptRef, lost: int) -> int | None:
        """A new spare keeper in a new slot (the next number), with the lost slot's CPUs and
        devices (it is gone, so they are free); the attempt's plan file lists it, so a watcher
        started later watches it too. The keeper imports torchrun while it waits, as the first
        spares did; it is not waited for."""
        directory = layout.attempt_dir(ref.run, ref.attempt)
        plan_file = directory / layout.PLAN_FILE
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        if not rounds.exists() or (rounds / r.CLOSED).exists():
            return None
        plan = json.loads(plan_file.read_text())
        slots = plan["resources"]
        if not 0 <= lost < len(slots):
            return None
        n = len(slots)
        agent = {**slots[lost], "node": n, "spare": True, "replenished": True,
                 "env": {**slots[lost]["env"], ENV_NODE_NAME: layout.local_host(n)},
                 "log": str(layout.node_log(ref.run, ref.attempt, n))}
        plan["resources"] = [*slots, agent]
        tmp = plan_file.with_name(f"{plan_file.name}.tmp")
        tmp.write_text(json.dumps(plan, indent=1))
        os.replace(tmp, plan_file)
        try:
            self._start_keeper(ref, agent, rounds, run_id_of(ref.run))
        except OSError:
            return None
        if ref.attempt_name in self._watches:     # else read from the plan file, which lists it now
            self._watches[ref.attempt_name].append(_NodeWatch(ref, n))
        return n

    def _round(self, ref: b.AttemptRef) -> dict[str, Any] | None:
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        return r.newest_round(rounds) if rounds.exists() else None

    # -- observe -----------------------------------------------------------------------------
    def _node_watches(self, ref: b.AttemptRef) -> list[_NodeWatch]:
        key = ref.attempt_name
        if key not in self._watches:
            directory = layout.attempt_dir(ref.run, ref.attempt)
            plan_file = directory / layout.PLAN_FILE
            if not plan_file.exists():
                raise BackendError(f"no local attempt {key} (looked in {directory})")
            nodes = len(json.loads(plan_file.read_text())["resources"])
            self._watches[key] = [_NodeWatch(ref, i) for i in range(nodes)]
        return self._watches[key]

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        events: list[b.Event] = []
        statuses: list[b.NodeStatus] = []
        current = self._round(ref)
        for w in self._node_watches(ref):
            # c10d assigns ranks in join order: global rank 0 (the one that reports) can be on any node.
            events += self._read_progress(w)
            if current is not None and w.node not in current["active"]:
                continue        # an idle spare, or a slot an in-place recovery replaced
            if not w.reported_end:
                events += self._check_node(w, current["round"] if current is not None else None)
            statuses.append(b.NodeStatus(w.node, w.phase, w.host, w.exit_code, w.reason))
        return b.Observation(events, statuses)

    def _check_node(self, w: _NodeWatch, round_: int | None = None) -> list[b.Event]:
        exit_data = json.loads(w.exit_file.read_text()) if w.exit_file.exists() else None
        if round_ is not None and exit_data is not None and exit_data.get("round") != round_:
            exit_data = None        # an earlier round's end: its keeper has moved on
        if exit_data is not None:
            # Lines written just before the exit come before the exit event.
            return self._read_progress(w) + node_events(w, exit_data, None, None, None)
        if not w.pid_file.exists():
            return []
        pids = json.loads(w.pid_file.read_text())
        keeper_state = _proc_state(pids["keeper"])
        if round_ is not None and pids.get("round") != round_ and keeper_state not in (None, "Z", "X"):
            return []      # its keeper (alive) has not started this round's torchrun yet
        if keeper_state in (None, "Z", "X") and w.exit_file.exists():
            return self._check_node(w, round_)      # it exited between the two reads
        last_alive = _last_sign_of_life(w, pids) if keeper_state in (None, "Z", "X") else None
        return node_events(w, None, pids, keeper_state, _proc_state(pids["agent"]), last_alive)

    def _read_progress(self, w: _NodeWatch) -> list[b.Event]:
        """The events of what node ``w`` wrote since the last look, read READ_CHUNK_BYTES at a
        time: a watcher that looks late holds no more of the log than that."""
        events = []
        try:
            with open(w.log, "rb") as fh:
                fh.seek(w.offset)
                while chunk := fh.read(READ_CHUNK_BYTES):
                    w.offset += len(chunk)
                    for raw in w.lines.feed(chunk):
                        ev = b.line_event(raw.decode("utf-8", "replace"), w.node, w.host, w.output_at)
                        if ev is not None:
                            events.append(ev)
        except FileNotFoundError:
            return []
        return events

    # -- logs / cancel / attempts ------------------------------------------------------------
    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        query = query or b.LogQuery()
        path = layout.node_log(ref.run, ref.attempt, node)
        if not path.exists():
            # Not found (6), like the Docker and Kubernetes backends: no such attempt, no such
            # node, or a node that has not started writing yet.
            plan_file = layout.attempt_dir(ref.run, ref.attempt) / layout.PLAN_FILE
            if not plan_file.exists():
                raise RunNotFound(f"run {ref.run} has no attempt {ref.attempt} here",
                                  hint=f"see `wmctl status {ref.run}` for its attempts")
            nodes = len(json.loads(plan_file.read_text())["resources"])
            if not 0 <= node < nodes:
                raise RunNotFound(f"{ref.attempt_name} has no node {node}",
                                  hint=f"its nodes are 0-{nodes - 1}" if nodes > 1 else "its only node is 0")
            raise RunNotFound(f"no log for node {node} of {ref.attempt_name} yet ({path})",
                              hint="the node has not started yet; try again in a moment")
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            # A line is shown once its newline is written: a node caught mid-write (a job's
            # block-buffered stdout flushes 8 KiB at a time, wherever a line stands) never shows a
            # line cut in two. What is left without one when the node has ended is shown as it is.
            pending = ""
            if query.tail is not None:          # the last N lines, then (following) what comes next
                last = collections.deque(fh, maxlen=query.tail)
                if follow and last and not last[-1].endswith("\n"):
                    pending = last.pop()
                yield from (line.rstrip("\n") for line in last)
            while True:
                chunk = fh.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        yield pending[:-1]
                        pending = ""
                    continue
                ended = not follow or layout.node_exit_file(ref.run, ref.attempt, node).exists() or \
                    (query.stop is not None and query.stop())
                if ended:
                    # what it wrote before it ended or died, after the last look
                    rest = (pending + fh.read()).split("\n")
                    if rest[-1] == "":
                        rest.pop()
                    yield from rest
                    return
                time.sleep(0.2)

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        """SIGKILL every process of the attempt (SIGTERM first with ``graceful``)."""
        prefix = f"{ref.attempt_name}/"
        run_id = run_id_of(ref.run)
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        if rounds.exists() and not graceful:
            r.close(rounds)         # idle spares stop rather than wait for a round
        if graceful:
            for pid in tagged_pids(prefix, run_id=run_id):
                _signal(pid, signal.SIGTERM)
            deadline = time.time() + 40
            while tagged_pids(prefix, run_id=run_id) and time.time() < deadline:
                time.sleep(0.2)
        for _ in range(50):
            pids = tagged_pids(prefix, run_id=run_id)
            if not pids:
                return
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)

    def release(self, ref: b.AttemptRef) -> None:
        """Nothing to free (ended processes hold no names, and the logs are in the run folder),
        but with spare nodes the idle spares and the c10d store: stopped."""
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        if rounds.exists():
            self.cancel(ref)

    def close(self) -> None:
        """No background threads: the agents are separate processes that outlive this object."""

    def kill_node(self, ref: b.AttemptRef, node: int, sig: int = signal.SIGKILL) -> int:
        """Signal every process of one node (used to inject faults). Returns how many."""
        pids = tagged_pids(f"{ref.attempt_name}/{node}", exact=True, run_id=run_id_of(ref.run))
        for pid in pids:
            _signal(pid, sig)
        return len(pids)

    def attempts(self, run: str) -> list[b.AttemptRef]:
        directory = layout.run_dir(run)
        found = sorted(n for n in (layout.attempt_number(p.name) for p in directory.glob("attempt-*")) if n is not None)
        return [b.AttemptRef(self.name, run, n) for n in found]


def _last_sign_of_life(w: _NodeWatch, pids: dict[str, Any]) -> float:
    """When a node whose processes are gone was last seen alive: its start, or the last write to
    its output (a dead process writes nothing), whichever is later. Its loss came after this."""
    seen = [float(pids.get("started") or 0.0)]
    for path in (w.log, w.pid_file):
        try:
            seen.append(path.stat().st_mtime)
        except OSError:
            pass
    return max(seen)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
