"""Slurm backend: an attempt is one sbatch job, one srun step, one torchrun per node.

``render`` (render.py) makes the exact sbatch script and command line a dry run prints; ``check``
(check.py) refuses what Slurm cannot run. The engine runs Slurm's client tools on this host (the
submit host, a login node), never a daemon on the compute nodes:

- submit writes the script into the attempt folder and runs ``sbatch --parsable`` (an argument
  list, never a shell); the job id goes to ``job.json`` beside it. An attempt whose folder holds
  one is adopted, never submitted twice (one that lost its ``job.json`` is found by its job name).
- poll reads every node's log and exit record in the attempt folder (the nodes write them on the
  shared filesystem: progress lines, the runtime's per-node beat, how each node ended) and asks
  Slurm about the job at most every SLURM_EVERY_S (tools.py: scontrol, then sacct, then
  nothing: a job Slurm has forgotten still left its records). classify.py turns both into events.
- cancel: ``scancel --signal=KILL JOBID.0`` (the step, straight to the nodes' slurmd), then
  ``scancel`` (the job's nodes are free at once for the next attempt; a plain scancel alone, or
  SIGKILL to the whole job, is Slurm's termination: SIGTERM, then KillWait, 30 s, while the
  survivors try a checkpoint their dead peer blocks and srun waits for the dead node). Graceful:
  ``scancel --signal=TERM`` (the job steps only, not the batch shell), a wait for every node's exit
  record (the checkpoint), then the same teardown.
- spare nodes (restart.spares, slots.py): one step per slot, each running the keeper; poll reports
  the current round's slots only; ``recover_in_place`` SIGKILLs the lost slot's step and writes the
  next round (no new job, no new allocation).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ... import layout
from ...errors import BackendError, RunNotFound
from ...plan import AttemptContext, HostFacts, Plan
from ...runtime import keeper as r
from ...runtime.protocol import run_checkpoint_dir
from ...serialize import dump
from ...spec import JobSpec
from ...speccheck import context_problems
from ...vendors import VendorProfile
from .. import base as b
from ..local.render import local_checkpoint_dir
from . import classify as C
from . import slots as S
from .check import problems
from .render import JOB_EXIT_FILE, TEARDOWN_FILE, SlurmRequest, render_slurm
from .tools import JobInfo, NodeState, SlurmTools, parse_sbatch

JOB_FILE = "job.json"          # in the attempt folder: {"job_id", "job_name", "nodes", "submitted"}
SLURM_EVERY_S = 1.0            # how often poll asks Slurm (the files are read every poll)
NODES_EVERY_S = 2.0            # ... and about the allocation's nodes
READ_CHUNK_BYTES = 1 << 20
GRACEFUL_WAIT_DEFAULT_S = 90.0
# A node that failed because a peer's connection broke (its own words say so) while the peer wrote
# no exit record: the peer gets this long to write one before it counts as dead (its node script
# was killed with it). A live node whose workers saw the same break records its end in about a
# second; the first failure seen is held meanwhile, so the root cause is the dead node.
PEER_WAIT_S = 3.0
STEP_KILL_WAIT_S = 1.0         # cancel: the step's SIGKILL reaches the live nodes' slurmd well within this
TAIL_BYTES = 64 * 1024


@dataclass
class _Node:
    node: int
    log: Path
    exit_file: Path
    host: str | None = None
    offset: int = 0
    lines: b.LineSplitter = field(default_factory=b.LineSplitter)
    output_at: dict[int, float] = field(default_factory=dict)
    end: C.NodeEnd | None = None
    lost: bool = False
    held: tuple[b.Event, float] | None = None      # its failing exit, waiting for the others' (PEER_WAIT_S)


@dataclass
class _Watch:
    ref: b.AttemptRef
    job_id: str
    nodes: list[_Node]
    info: JobInfo | None = None
    asked_at: float = float("-inf")
    nodes_at: float = float("-inf")
    states: dict[str, NodeState] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    said: set[str] = field(default_factory=set)     # job-level facts already reported
    gone: bool = False                              # Slurm (scontrol and sacct) has forgotten the job
    spares: int = 0                                 # restart.spares: nodes are slots, the last ones spares
    round: int | None = None                        # with spares: the round poll reports (its slots only)
    active: list[int] = field(default_factory=list)     # ... and the slots it names


class SlurmBackend(b.Backend[SlurmRequest]):
    name = "slurm"
    places_nodes = True               # sbatch --exclude keeps an attempt off the nodes that failed
    remembers_exclusions = True       # nodes are machines: a lost one is avoided by the next runs too
    graceful_cancel = True            # scancel --signal=TERM to the steps, a wait for the checkpoint
    runs_image = False                # without a container the nodes run this host's interpreter
    checkpoints_outlive_nodes = True  # the run folder and checkpoints are on the cluster's shared filesystem
    log_options = frozenset({"tail"})  # the node logs are plain files: no per-line times
    spares = True                     # spare nodes of the allocation, each slot a keeper's step (slots.py)
    replenishes_spares = False        # an allocation cannot grow (docs/spares.md)

    def __init__(self, tools: SlurmTools | None = None) -> None:
        self.tools = tools or SlurmTools()
        self._cluster: str | None = None             # cluster_key, asked once
        self._watches: dict[str, _Watch] = {}
        self._stragglers: list[subprocess.Popen[bytes]] = []    # step scancels still waiting on a dead node

    @classmethod
    def check(cls, spec: JobSpec) -> list[tuple[str, str]]:
        return problems(spec)

    @classmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext,
               host: HostFacts) -> Plan[SlurmRequest]:
        return render_slurm(spec, profile, ctx, host)

    @classmethod
    def document(cls, plan: Plan[SlurmRequest], output: str) -> str:
        """The script itself (its comments name the sbatch line and the plan's notes): what
        `sbatch` reads. As json: the whole plan, script and sbatch line included."""
        if output == "json":
            return dump(plan.to_dict(), "json")
        return plan.request.script

    def placeable_hosts(self, spec: JobSpec) -> frozenset[str] | None:
        """Every node of slurm.partition (else of every partition), down, drained or failing ones
        too (`sinfo -N`); None when sinfo does not answer. A down node is still the partition's:
        sbatch queues a job that waits for it, but refuses outright ("Requested node configuration
        is not available") one that the partition's nodes less the excluded ones can never hold,
        so excluding a down node costs a place like any other (a 3-node partition, a job of 2
        nodes + 1 spare, two nodes just lost: excluding either would make the run fail at sbatch
        rather than wait for them)."""
        return self.tools.node_names(spec.slurm.partition)

    def cluster_key(self) -> str | None:
        """``slurm:<ClusterName>`` from `scontrol show config`, else ``slurm:<SLURM_CONF path>``;
        None when neither is known (no remembered exclusion is kept or applied then)."""
        if self._cluster is None:
            self._cluster = self.tools.cluster_name() or ""
        return self._cluster or None

    def check_host(self, spec: JobSpec) -> list[tuple[str, str]]:
        """Without a container the nodes run the job in image.context: it must be there."""
        return context_problems(spec) if spec.slurm.container == "none" else []

    def checkpoint_root(self, spec: JobSpec) -> tuple[str, bool]:
        """Without a container the checkpoints are a folder of the shared filesystem, seen here too."""
        if spec.slurm.container == "none":
            return run_checkpoint_dir(str(local_checkpoint_dir(spec)), spec.name), True
        return super().checkpoint_root(spec)

    def prepare_host(self, spec: JobSpec) -> list[str]:
        if spec.slurm.container != "none" or not spec.checkpoint.dir:
            return []
        ckpt = local_checkpoint_dir(spec)
        if ckpt.exists():
            return []
        ckpt.mkdir(parents=True, exist_ok=True)
        return [f"created the missing checkpoint folder {ckpt} (checkpoint.dir {spec.checkpoint.dir})"]

    # -- submit ----------------------------------------------------------------------------------
    def submit(self, plan: Plan[SlurmRequest]) -> b.AttemptRef:
        req = plan.request
        if not isinstance(req, SlurmRequest):
            raise BackendError(f"a {plan.backend} plan cannot be submitted to the slurm backend",
                               hint="plan it for the slurm backend (-b slurm)")
        ref = b.AttemptRef(self.name, plan.run, plan.attempt)
        job_file = req.attempt_dir / JOB_FILE
        if job_file.exists():
            return ref                  # submitted already (a second watcher, a restart): adopted
        req.attempt_dir.mkdir(parents=True, exist_ok=True)
        found = self._job_by_name(req)
        if found is None:
            if req.spares:       # round 0: the job's nodes, the first slots; the spares wait for a round
                rounds = layout.rounds_dir(plan.run, plan.attempt)
                rounds.mkdir(exist_ok=True)
                r.write_round(rounds, 0, list(range(len(req.node_logs) - req.spares)),
                              layout.round_rendezvous_id(plan.run, plan.attempt, 0), {})
            req.script_path.write_text(req.script)
            out = self.tools.run(list(req.sbatch_argv))
            job_id = parse_sbatch(out.stdout) if out.returncode == 0 else None
            if job_id is None:
                fname, why = C.sbatch_refusal(out.stderr or out.stdout)
                raise BackendError(f"{fname}: {why}", hint=f"fix {fname} in the spec; `wmctl submit SPEC -b slurm "
                                   "--dry-run` prints the script and the sbatch line")
            found = job_id
        _write_json(job_file, {"job_id": found, "job_name": req.job_name, "nodes": len(req.node_logs),
                               "submitted": time.time(), **({"spares": req.spares} if req.spares else {})})
        return ref

    def _job_by_name(self, req: SlurmRequest) -> str | None:
        """A job already submitted for this attempt whose job.json was never written (the watcher
        died between sbatch and the write): this user's job of the attempt's name running this
        very script file, submitted after it was written. ``squeue -h -t all -u USER -n NAME -o
        '%i|%o|%V'`` (man squeue: %o the command, %V the submit time)."""
        try:
            written = req.script_path.stat().st_mtime
        except FileNotFoundError:
            return None             # the script is written before sbatch runs: nothing was submitted
        user = os.environ.get("USER") or str(os.getuid())
        out = self.tools.run(["squeue", "-h", "-t", "all", "-u", user, "-n", req.job_name, "-o", "%i|%o|%V"])
        for line in reversed(out.stdout.splitlines() if out.returncode == 0 else []):
            job_id, _, rest = line.partition("|")
            command, _, submitted = rest.partition("|")
            try:
                at = time.mktime(time.strptime(submitted.strip(), "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                continue
            if command.strip() == str(req.script_path) and at >= int(written) - 1:
                return job_id.strip()
        return None

    # -- observe ---------------------------------------------------------------------------------
    def _watch(self, ref: b.AttemptRef) -> _Watch:
        key = f"{ref.run}/{ref.attempt}"
        if key not in self._watches:
            job = _read_job(ref)
            nodes = [_Node(i, layout.node_log(ref.run, ref.attempt, i), layout.node_exit_file(ref.run, ref.attempt, i))
                     for i in range(job.nodes)]
            self._watches[key] = _Watch(ref, job.job_id, nodes, spares=job.spares)
        return self._watches[key]

    def _active(self, w: _Watch) -> list[_Node]:
        """The nodes poll reports: every node, or with spares the slots the newest round names
        (an idle spare, or a slot a recovery replaced, is no news). A new round starts its slots over."""
        if not w.spares:
            return w.nodes
        newest = r.newest_round(layout.rounds_dir(w.ref.run, w.ref.attempt))
        if newest is not None and newest["round"] != w.round:
            w.round, w.active = newest["round"], [int(s) for s in newest["active"]]
            for n in w.nodes:
                if n.node in w.active:
                    n.end, n.lost, n.held = None, False, None
        return [n for n in w.nodes if n.node in w.active]

    def _end(self, w: _Watch, n: _Node) -> C.NodeEnd | None:
        if not w.spares:
            return _node_end(n.exit_file)
        return S.keeper_end(n.exit_file, n.node, n.host, w.job_id, w.round if w.round is not None else 0)

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        w = self._watch(ref)
        now = time.time()
        events: list[b.Event] = []
        if w.spares and not w.hosts:
            self._slot_hosts(w)
        active = self._active(w)
        for n in w.nodes:
            events += self._read_log(n)
        for n in active:
            if n.end is None:
                n.end = self._end(w, n)
                if n.end is not None:
                    events += self._read_log(n)      # what it wrote before its end comes first
                    n.host = n.host or n.end.host
                    ev = C.node_exited(n.end)
                    if C.peer_broke(n.end.exit_code, _tail(n.log)) and \
                            any(m.end is None and not m.lost for m in active if m is not n):
                        n.held = (ev, now)
                    else:
                        events.append(ev)
        events += self._release_held(active, now)
        if now - w.asked_at >= SLURM_EVERY_S and not w.gone:
            w.asked_at = now
            events += self._ask_slurm(w, now)
        return b.Observation(events, [self._status(w, n) for n in self._active(w)])

    def _slot_hosts(self, w: _Watch) -> None:
        """With spares, each slot's node as the batch script placed it (slots.txt)."""
        w.hosts = S.slot_hosts(layout.attempt_dir(w.ref.run, w.ref.attempt))
        for n, host in zip(w.nodes, w.hosts, strict=False):
            n.host = n.host or host

    def _release_held(self, active: list[_Node], now: float) -> list[b.Event]:
        """A held failure goes out once every other node has ended, or after PEER_WAIT_S with
        the nodes still silent called lost (first: the root cause)."""
        out: list[b.Event] = []
        for n in active:
            if n.held is None:
                continue
            ev, since = n.held
            quiet = [m for m in active if m is not n and m.end is None and not m.lost]
            if quiet and now - since < PEER_WAIT_S:
                continue
            for m in quiet:
                m.lost = True
                out.append(C.lost_node_event(
                    m.node, m.host, f"node {m.node} ({m.host or 'host unknown'}) wrote no exit record "
                    f"{now - since:.0f} s after node {n.node}'s connection to its peers broke (exit "
                    f"{ev.exit_code}): its processes are gone with their node", at=min(ev.time, since)))
            n.held = None
            out.append(ev)
        return out

    def _ask_slurm(self, w: _Watch, now: float) -> list[b.Event]:
        info = self.tools.job(w.job_id)
        events: list[b.Event] = []
        if info is None:
            w.gone = True
            ended = _job_end(w.ref)
            for n in self._active(w):
                if n.end is None and not n.lost:
                    n.lost = True
                    why = (f"the job's exit record says srun ended {ended.exit_code}" if ended else
                           "nor did the job leave its exit record")
                    events.append(C.lost_node_event(n.node, n.host, f"Slurm has forgotten job {w.job_id} (MinJobAge; "
                                                    f"no slurmdbd) and node {n.node} left no exit record; {why}",
                                                    at=now))
            return events
        w.info = info
        if info.nodes and not w.hosts and not w.spares:
            w.hosts = self.tools.hostnames(info.nodes)
            for n, host in zip(w.nodes, w.hosts, strict=False):
                n.host = n.host or host
        if info.state in C.WAITING_STATES:
            ev = C.pending_event(info.reason, nodes=len(w.nodes), partition_nodes=self._room(info))
            if ev is not None and f"pending:{ev.reason}" not in w.said:
                w.said.add(f"pending:{ev.reason}")
                events.append(ev)
            return events
        if w.hosts and (now - w.nodes_at >= NODES_EVERY_S or info.state not in C.LIVE_STATES):
            w.nodes_at = now
            w.states = self.tools.node_states(w.hosts)
        if info.state in ("RUNNING", "COMPLETING"):
            return self._unheard(w, now)
        if info.state not in C.LIVE_STATES and "end" not in w.said:
            w.said.add("end")
            active = self._active(w)
            recorded = {n.node for n in w.nodes if n.end is not None or n not in active}
            down = {name: (st.state, st.reason) for name, st in w.states.items() if st.down}
            hosts = w.hosts or [n.host or "" for n in w.nodes]
            for ev in C.ended_events(info.state, job_id=w.job_id, exit_code=info.exit_code, reason=info.reason,
                                     hosts=hosts, down=down, recorded=recorded, now=now):
                if ev.kind == b.NODE_LOST and ev.node is not None:
                    if w.nodes[ev.node].lost:
                        continue
                    w.nodes[ev.node].lost = True
                events.append(ev)
        return events

    def _unheard(self, w: _Watch, now: float) -> list[b.Event]:
        """A node Slurm no longer hears from (sinfo's '*': missed pings) is lost now, before
        SlurmdTimeout makes it DOWN and the job NODE_FAIL."""
        events = []
        for n in self._active(w):
            st = w.states.get(n.host or "")
            if st is not None and st.down and n.end is None and not n.lost:
                n.lost = True
                events.append(C.lost_node_event(n.node, n.host, f"Slurm does not hear from {n.host}",
                                                st.state, st.reason, at=now))
        return events

    def _room(self, info: JobInfo) -> int | None:
        if C.reason_word(info.reason) not in C.SIZE_REASONS:
            return None
        out = self.tools.run(["scontrol", "show", "job", "-o", info.job_id])
        partition = next((p.split("=", 1)[1] for p in out.stdout.split() if p.startswith("Partition=")), None)
        return self.tools.partition_nodes(partition)

    def _status(self, w: _Watch, n: _Node) -> b.NodeStatus:
        if n.end is not None:
            return b.NodeStatus(n.node, b.SUCCEEDED if n.end.exit_code == 0 else b.FAILED, n.host,
                                n.end.exit_code)
        if n.lost:
            return b.NodeStatus(n.node, b.LOST, n.host, reason="NodeDown")
        info = w.info
        if info is None:
            return b.NodeStatus(n.node, b.LOST if w.gone else b.PENDING, n.host)
        if info.state in C.WAITING_STATES:
            return b.NodeStatus(n.node, b.PENDING, n.host, reason=info.reason)
        if info.state in C.LIVE_STATES:
            return b.NodeStatus(n.node, b.RUNNING, n.host)
        if info.state == "COMPLETED":
            return b.NodeStatus(n.node, b.SUCCEEDED, n.host, 0)
        return b.NodeStatus(n.node, b.FAILED, n.host, info.exit_code, reason=info.state)

    def _read_log(self, n: _Node) -> list[b.Event]:
        """Every node's log, from where the last look stopped: c10d places global rank 0 on any
        node, and group rank 1's node keeps the runtime's witness of node 0's beat."""
        events = []
        try:
            with open(n.log, "rb") as fh:
                fh.seek(n.offset)
                while chunk := fh.read(READ_CHUNK_BYTES):
                    n.offset += len(chunk)
                    for raw in n.lines.feed(chunk):
                        ev = b.line_event(raw.decode("utf-8", "replace"), n.node, n.host, n.output_at)
                        if ev is not None:
                            events.append(ev)
        except FileNotFoundError:
            return []
        return events

    # -- logs / cancel / attempts ----------------------------------------------------------------
    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        query = query or b.LogQuery()
        job = _read_job(ref, missing=RunNotFound)
        nodes = job.nodes
        if not 0 <= node < nodes:
            raise RunNotFound(f"{ref.attempt_name} has no node {node}",
                              hint=f"its nodes are 0-{nodes - 1}" if nodes > 1 else "its only node is 0")
        path = layout.node_log(ref.run, ref.attempt, node)
        exit_file = layout.node_exit_file(ref.run, ref.attempt, node)
        while not path.exists():
            if not follow or exit_file.exists() or (query.stop is not None and query.stop()):
                raise RunNotFound(f"no log for node {node} of {ref.attempt_name} yet ({path})",
                                  hint="the job has not started on its nodes yet (`wmctl status` says why it waits)")
            time.sleep(0.5)
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            pending = ""
            if query.tail is not None:
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
                if not follow or exit_file.exists() or (query.stop is not None and query.stop()):
                    rest = (pending + fh.read()).split("\n")
                    if rest[-1] == "":
                        rest.pop()
                    yield from rest
                    return
                time.sleep(0.2)

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        """Graceful: SIGTERM to the job's steps (the runtime saves a checkpoint and exits), a wait
        until every node has recorded its end (at most the save's room), then the teardown (``_kill``):
        SIGKILL to the job's step, and the job ended (its batch shell kills srun). Idempotent."""
        try:
            job = _read_job(ref)
        except BackendError:
            return                       # never submitted: nothing to tear down
        job_id = job.job_id
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        try:     # the batch shell waits for the scancel below rather than end first (render.TEARDOWN_FILE)
            (layout.attempt_dir(ref.run, ref.attempt) / TEARDOWN_FILE).write_text(f"{time.time()}\n")
        except OSError:
            pass     # the folder is gone: the job records FAILED rather than CANCELLED, nothing worse
        if graceful:
            self.tools.run(["scancel", "--signal=TERM", job_id])
            deadline = time.time() + self._grace_s(ref)
            while time.time() < deadline:
                if self._all_ended(ref, job):
                    break
                info = self.tools.job(job_id)
                if info is None or info.state not in C.LIVE_STATES:
                    break
                time.sleep(0.2)
        elif job.spares:
            r.close(rounds)         # idle spares stop rather than wait for a round
        self._kill(job_id, steps=job.nodes if job.spares else 1)

    def _all_ended(self, ref: b.AttemptRef, job: _JobFile) -> bool:
        """Has every node (with spares: every slot of the newest round) recorded its end?"""
        if job.spares:
            return S.round_ended(ref.run, ref.attempt, job.job_id)
        return all(layout.node_exit_file(ref.run, ref.attempt, i).exists() for i in range(job.nodes))

    # -- spare nodes -----------------------------------------------------------------------------
    def recover_in_place(self, ref: b.AttemptRef, node: int) -> b.InPlaceRecovery | None:
        """Lost slot ``node`` replaced by an idle spare of the same allocation: its step is
        SIGKILLed (straight to its node's slurmd, as the teardown does; a dead node's slurmd does not
        answer and the kill is not waited for: the new round's fencing epoch refuses a cut-off
        node's commits), and the next round names the spare in its place; every keeper of the round
        restarts its torchrun (runtime/keeper.py). No job, step or allocation is created. None
        when no spare is left (or the attempt has none)."""
        w = self._watch(ref)
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        history = r.all_rounds(rounds) if w.spares else []
        if not history or node not in history[-1]["active"]:
            return None
        attempt_dir = layout.attempt_dir(ref.run, ref.attempt)
        if not w.hosts:
            self._slot_hosts(w)
        down = {name for name, st in w.states.items() if st.down}
        idle = S.idle_spares(history, attempt_dir, [n.node for n in w.nodes if (n.host or "") not in down])
        if not idle:
            return None
        step = S.step_id(attempt_dir, node)
        if step is not None:
            self._stragglers.append(self.tools.start(["scancel", "--signal=KILL", f"{w.job_id}.{step}"]))
        n = S.next_round(ref.run, ref.attempt, history, lost=node, spare=idle[0])
        self._active(w)          # the new round's slots start over
        return b.InPlaceRecovery(round=n, lost=node, spare=idle[0], spares_left=len(idle) - 1)

    def _kill(self, job_id: str, steps: int = 1) -> None:
        """Every process of the job SIGKILLed at once, then the job ended, so that its healthy nodes
        are free for the next attempt in a second, not after KillWait. man scancel: with
        ``--signal`` "the signal is sent directly to the slurmd where the job is running"; without
        it, or with SIGKILL to the whole job (``--full`` included: slurmctld's job_signal takes a
        job's SIGKILL as its cancel), slurmctld terminates the job: SIGTERM, KillWait (30 s by
        default), then SIGKILL. Survivors blocked on a dead peer, or saving, hold their node that long.
        So: SIGKILL to the step first (JOBID.0, the script's one srun step), then ``scancel`` ends the
        job; its SIGTERM makes the batch shell kill srun (which would wait KillWait + 2 s for a dead
        node's tasks) and write the job's exit record (templates/slurm/job.sbatch.j2). Once the job
        is ending Slurm refuses signals: the order matters. The step's scancel waits MessageTimeout
        (10 s by default) for a dead node's slurmd; the live ones have the signal within
        STEP_KILL_WAIT_S, and it is not waited for longer. With spares the job has a step per slot
        (0 to ``steps`` - 1): each gets its own scancel, side by side, so a dead node's holds none
        of the others."""
        kills = [self.tools.start(["scancel", "--signal=KILL", f"{job_id}.{i}"]) for i in range(steps)]
        deadline = time.monotonic() + STEP_KILL_WAIT_S
        for step in kills:
            try:
                step.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._stragglers.append(step)
        self.tools.run(["scancel", job_id])
        self._stragglers = [p for p in self._stragglers if p.poll() is None]

    def _grace_s(self, ref: b.AttemptRef) -> float:
        """The save's room, kubernetes.termination_grace_period of the spec as submitted (the
        grace every backend gives a SIGTERM checkpoint), from the run's record."""
        from ...errors import WmctlError
        from ...state import open_store
        from ...validate import Invalid, parse_duration

        try:
            spec = open_store(ref.run).load().spec or {}
            value = (spec.get("kubernetes") or {}).get("termination_grace_period")
            return parse_duration(value) if value is not None else GRACEFUL_WAIT_DEFAULT_S
        except (WmctlError, Invalid, AttributeError, TypeError):
            return GRACEFUL_WAIT_DEFAULT_S

    def release(self, ref: b.AttemptRef) -> None:
        """Nothing to free: an ended job holds no nodes, and its logs are in the run folder. With
        spares the rounds folder is closed: idle spares stop (the batch script closes it too when
        the job is done, so a job whose watcher is gone still ends)."""
        rounds = layout.rounds_dir(ref.run, ref.attempt)
        if rounds.exists():
            r.close(rounds)

    def close(self) -> None:
        """No background threads: Slurm is asked when poll runs. A step's scancel still waiting on
        a dead node's slurmd ends by itself after MessageTimeout; it is not waited for."""

    def attempts(self, run: str) -> list[b.AttemptRef]:
        directory = layout.run_dir(run)
        found = sorted(n for n in (layout.attempt_number(p.name) for p in directory.glob("attempt-*")
                                   if (p / JOB_FILE).exists()) if n is not None)
        return [b.AttemptRef(self.name, run, n) for n in found]

    def job_id(self, ref: b.AttemptRef) -> str:
        """The Slurm job id of an attempt (tests, the benchmark, `describe`)."""
        return _read_job(ref).job_id


@dataclass(frozen=True)
class _JobFile:
    job_id: str
    nodes: int          # with spares: every slot, spares included
    spares: int = 0


def _read_job(ref: b.AttemptRef, missing: type[Exception] = BackendError) -> _JobFile:
    path = layout.attempt_dir(ref.run, ref.attempt) / JOB_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise missing(f"no Slurm job for {ref.attempt_name} (looked for {path})") from None
    except ValueError:
        raise missing(f"{path} is damaged: it should hold the attempt's Slurm job id") from None
    if not isinstance(data, dict) or "job_id" not in data or not isinstance(data.get("nodes"), int):
        raise missing(f"{path} is damaged: it should hold the attempt's Slurm job id")
    spares = data.get("spares", 0)
    return _JobFile(str(data["job_id"]), data["nodes"], spares if isinstance(spares, int) else 0)


def _tail(path: Path) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return fh.read().decode("utf-8", "replace").splitlines()[-200:]
    except FileNotFoundError:
        return []


def _node_end(path: Path) -> C.NodeEnd | None:
    try:
        return C.node_end(path.read_text())
    except FileNotFoundError:
        return None


def _job_end(ref: b.AttemptRef) -> C.JobEnd | None:
    try:
        return C.job_end((layout.attempt_dir(ref.run, ref.attempt) / JOB_EXIT_FILE).read_text())
    except FileNotFoundError:
        return None


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
