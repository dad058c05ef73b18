"""Docker backend: one container per node on a private network on one Docker host.

submit creates the Plan's network, volumes and containers (a name conflict means the attempt
already exists: it is adopted after its labels are checked; a failure halfway removes what the
call created). poll merges two sources so nothing is missed when one drops: the Docker events
API (followed in a background thread: kill signals, pause, destroy times) and container state
from inspect (exit code, OOMKilled, gone). PROGRESS events come from following node 0's log.
cancel SIGKILLs every container of the attempt at once (survivors would otherwise hang in a
collective), copies each container's log into the run folder (``attempt-N/node-I.log``, as the
local backend writes them, so `wmctl logs` still shows why an attempt failed), then removes the
containers and the attempt's network; named volumes stay (they hold checkpoints). release does
the same for an attempt that ended well.

The Docker SDK comes through ``adaptors.docker``, loaded on first use, so ``wmctl --help``
and dry runs never load it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ... import labels as L
from ... import layout
from ...adaptors import docker as sdk
from ...errors import BackendError, RunNotFound, SpecError
from ...launch import user_program
from ...plan import AttemptContext, HostFacts, Plan
from ...spec import JobSpec
from .. import base as b
from .. import host_paths
from ...state import open_store
from ...vendors import VendorProfile
from ..logcursor import LogCursor
from .classify import TERMINAL, node_status, parse_docker_time, transition_events
from .evidence import AttemptState, drain, event_time, fresh_lines
from . import slotfiles
from .spareslots import SpareSlots
from .render import DockerRequest, render_docker

# Plan "create" keys that belong to the container config; every other known key is host config.
_CONFIG_KEYS = {"name", "image", "command", "hostname", "environment", "labels", "working_dir",
                "stop_signal", "stop_timeout", "user", "entrypoint"}
_HOST_KEYS = {"shm_size", "mounts", "mem_limit", "memswap_limit", "cpuset_cpus", "cpuset_mems", "nano_cpus",
              "device_requests", "runtime", "devices", "group_add", "security_opt", "cap_add", "ulimits",
              "ipc_mode", "privileged", "init", "oom_kill_disable", "pids_limit"}


def container_kwargs(create: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """A Plan container's ``create`` dict -> (create_container kwargs, host config kwargs, network)."""
    unknown = set(create) - _CONFIG_KEYS - _HOST_KEYS - {"network"}
    if unknown:
        raise BackendError(f"the plan's container {create.get('name')!r} has settings this Docker backend "
                           f"does not know: {', '.join(sorted(unknown))}",
                           hint="render the plan with the same wmctl version that submits it")
    config = {k: v for k, v in create.items() if k in _CONFIG_KEYS}
    host = {k: v for k, v in create.items() if k in _HOST_KEYS}
    return config, host, create.get("network")


def attempt_filters(run: str, attempt: int | None = None) -> dict[str, list[str]]:
    found = [f"{L.MANAGED_BY}={L.MANAGED_BY_VALUE}", f"{L.RUN}={run}"]
    if attempt is not None:
        found.append(f"{L.ATTEMPT}={attempt}")
    return {"label": found}


def _create_bind_sources(containers: list[dict[str, Any]]) -> None:
    """A writable bind source that is missing is created, as `docker run -v` does (the engine
    API refuses it: "bind source path does not exist"). ``prepare_host`` made them, with notes,
    when the run was scheduled; this covers a later attempt after the folder was removed, and a
    plan submitted without the api. A read-only one is left for the engine to refuse."""
    if not sdk.engine_is_local():
        return
    for c in containers:
        for m in c["create"].get("mounts", []):
            if m.get("Type") == "bind" and not m.get("ReadOnly") and m.get("Source"):
                try:
                    Path(m["Source"]).mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass        # the engine's refusal names the path


class DockerBackend(SpareSlots, b.Backend[DockerRequest]):
    name = "docker"
    places_nodes = False     # one Docker host: a retry cannot go elsewhere
    graceful_cancel = True   # `docker stop`: SIGTERM, then SIGKILL after the grace period
    host_paths_here = True   # bind mounts of this machine's folders (a remote engine: see host_paths)
    # secret and config_map are Kubernetes objects: a Docker host has no such thing to mount
    volume_sources = frozenset(("pvc", "host_path", "nfs", "empty_dir"))
    log_options = frozenset({"tail", "since", "timestamps"})   # the engine keeps each line's time
    spares = True            # spare containers run the keeper beside the nodes (docs/spares.md)
    replenishes_spares = True  # a used spare is followed by a new container (replenish_spare)

    def __init__(self, client: Any = None, *, pull: bool = False, log_follow: bool = True):
        self._client = client
        self._pull = pull                # pull images missing on the host (off: no registry here)
        self._log_follow = log_follow    # follow node 0's log for PROGRESS events
        self._attempts: dict[tuple[str, int], AttemptState] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = sdk.client()
        return self._client

    # ------------------------------------------------------------ planning

    @classmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext,
               host: HostFacts) -> Plan[DockerRequest]:
        return render_docker(spec, profile, ctx, host)

    # ------------------------------------------------------------ the host

    def host_facts(self, spec: JobSpec) -> HostFacts:
        """This machine's facts, and the submitting user for ``docker.user: auto``: not for root,
        a remote engine (its uids are not ours) or an engine that remaps uids (rootless Docker
        already writes host files as its user; under userns-remap no container uid is ours)."""
        facts = HostFacts.of_this_machine()
        uid = os.getuid()
        if spec.docker.user != "auto" or uid == 0 or not sdk.engine_is_local() or sdk.engine_remaps_users():
            return facts
        return dataclasses.replace(facts, user=(uid, os.getgid()))

    def check_host(self, spec: JobSpec) -> list[tuple[str, str]]:
        # A remote engine's bind sources are its folders, not this machine's: not checked here.
        if not sdk.engine_is_local():
            if spec.restart.spares:
                # the keeper and the rounds folder are bind mounts of this machine's files
                return [("restart.spares", f"spare nodes need the Docker engine on this machine, and DOCKER_HOST "
                         f"({os.environ.get('DOCKER_HOST')}) is another: set restart.spares: 0, or submit from the "
                         "engine's own machine")]
            return []
        return host_paths.missing_read_only(spec)

    def prepare_host(self, spec: JobSpec) -> list[str]:
        if spec.image.tag:
            # Refused before the run is recorded, so a missing image leaves no record behind
            # that holds the name (submit checks again, for later attempts).
            self._ensure_image(spec.image.tag)
        return host_paths.create_missing(spec) if sdk.engine_is_local() else []

    # ------------------------------------------------------------ submit

    def submit(self, plan: Plan[DockerRequest]) -> b.AttemptRef:
        if not isinstance(getattr(plan, "request", None), DockerRequest):
            raise BackendError(f"a {getattr(plan, 'backend', '?')} plan cannot be submitted to Docker",
                               hint="render the plan for the docker backend (-b docker)")
        containers = [r for r in plan.resources if r.get("kind") == "container"]
        if not containers:
            raise BackendError("the plan has no containers", hint="render the plan for the docker backend")
        stores = [r for r in plan.resources if r.get("kind") == "store"]     # spare nodes: the c10d store
        ref = b.AttemptRef(self.name, plan.run, plan.attempt)
        errors, _ = sdk.errors()
        _ = self.client       # connect first: an unreachable engine fails before anything exists
        if stores:
            if not sdk.engine_is_local():
                raise BackendError("spare nodes (restart.spares) need the Docker engine on this machine",
                                   hint="set restart.spares: 0, or submit from the engine's own machine")
            me = f"{os.getuid()}:{os.getgid()}"
            slotfiles.prepare(plan.run, plan.attempt, [c["node"] for c in containers if not c.get("spare")],
                              shared=any(c["create"].get("user") != me for c in containers))
            slotfiles.save_plan(plan.run, plan.attempt, plan.to_dict())
        _create_bind_sources(containers)
        undo: list[Callable[[], None]] = []
        since = time.time() - 1.0
        with sdk.engine(f"submitting {plan.attempt_name}"):
            try:
                for image in sorted({c["create"]["image"] for c in containers}):
                    self._ensure_image(image)
                    if plan.attempt == 0:
                        self._check_program(image, user_program(list(containers[0]["create"]["command"])))
                for res in plan.resources:
                    if res["kind"] == "network":
                        self._ensure_network(res, plan, undo)
                    elif res["kind"] == "volume":
                        self._ensure_volume(res, undo)
                networks = {c["create"].get("network") for c in containers} - {None}
                declared = {r["name"] for r in plan.resources if r["kind"] == "network"}
                for net in sorted(networks - declared):
                    self._require_network(net)
                created = [self._ensure_container(c, plan, undo) for c in [*stores, *containers]]
                for cid in created:
                    self._start(cid)
            except errors.APIError as exc:
                self._rollback(undo)
                raise BackendError(f"Docker refused to submit {plan.attempt_name}: {sdk.explain(exc)}",
                                   hint="nothing of this attempt was left behind; fix the cause and submit "
                                        "again") from None
            except BaseException:
                self._rollback(undo)
                raise
        self._watch(ref, {c["node"]: c["create"]["name"] for c in containers}, since)
        return ref

    def _ensure_image(self, image: str) -> None:
        errors, _ = sdk.errors()
        try:
            self.client.images.get(image)
            return
        except errors.ImageNotFound:
            pass
        if self._pull:
            try:
                self.client.images.pull(image)
                return
            except errors.APIError as exc:
                raise BackendError(f"image {image!r} is not on this Docker host and pulling it failed: "
                                   f"{sdk.explain(exc)}", hint="check the tag and `docker login`, or build it with "
                                   "`wmctl build-image SPEC`") from None
        raise BackendError(f"image {image!r} is not on this Docker host",
                           hint=f"build it with `wmctl build-image SPEC` or pull it (`docker pull {image}`), "
                                "then submit again")

    def _check_program(self, image: str, program: str | None) -> None:
        """The job's program (``command[0]``) must exist in the image: asked of the image's own
        shell (``command -v``, the program passed as an argument, never spliced into the script)
        in a throwaway container, before any container of the attempt exists. An image without a
        shell is not probed; the in-job launcher then reports it (exit 127, named)."""
        if not program:
            return
        errors, _ = sdk.errors()
        try:
            self.client.containers.run(image, ["-c", 'command -v "$1" >/dev/null || exit 127', "sh", program],
                                       entrypoint="sh", remove=True, network_mode="none", stdout=True,
                                       stderr=True)
        except errors.ContainerError as exc:
            if exc.exit_status != 127:
                return
            alt = " (the image may have python3: use it in command)" if program == "python" else ""
            raise SpecError([("command[0]", f"{program!r} is not found in image {image}{alt}; "
                                            "nothing was submitted")]) from None
        except errors.APIError:
            return

    def _ensure_network(self, res: dict[str, Any], plan: Any, undo: list[Callable[[], None]]) -> None:
        errors, _ = sdk.errors()
        want = res.get("labels") or L.run_labels(plan.run, plan.attempt)
        try:
            net = self.client.networks.get(res["name"])
        except errors.NotFound:
            net = self.client.networks.create(res["name"], driver=res.get("driver") or "bridge",
                                              labels=want, check_duplicate=True)
            undo.append(lambda n=net: self._quiet_remove(n))  # type: ignore[misc]
            return
        have = net.attrs.get("Labels") or {}
        if any(have.get(k) != v for k, v in want.items()):
            raise BackendError(f"a Docker network named {res['name']!r} exists but does not belong to "
                               f"{plan.attempt_name}", hint=f"remove it (`docker network rm {res['name']}`) "
                               "or set docker.network in the spec to use it on purpose")

    def _require_network(self, name: str) -> None:
        errors, _ = sdk.errors()
        try:
            self.client.networks.get(name)
        except errors.NotFound:
            raise BackendError(f"Docker network {name!r} (docker.network) does not exist",
                               hint=f"create it (`docker network create {name}`) or remove docker.network "
                                    "from the spec to get a private network per attempt") from None

    def _ensure_volume(self, res: dict[str, Any], undo: list[Callable[[], None]]) -> None:
        errors, _ = sdk.errors()
        try:
            self.client.volumes.get(res["name"])  # reused as is: it may hold checkpoints
        except errors.NotFound:
            vol = self.client.volumes.create(name=res["name"], driver=res.get("driver") or "local",
                                             driver_opts=res.get("driver_opts") or {},
                                             labels={L.MANAGED_BY: L.MANAGED_BY_VALUE})
            undo.append(lambda v=vol: self._quiet_remove(v))  # type: ignore[misc]

    def _ensure_container(self, res: dict[str, Any], plan: Any, undo: list[Callable[[], None]]) -> str:
        """Create one node's container, or adopt it if this attempt already made it. Returns its id."""
        errors, _ = sdk.errors()
        api = self.client.api
        config, host, network = container_kwargs(res["create"])
        networking = None
        if network:
            host["network_mode"] = network
            networking = api.create_networking_config(
                {network: api.create_endpoint_config(aliases=list(res.get("aliases") or []))})
        try:
            out = api.create_container(**config, host_config=api.create_host_config(**host),
                                       networking_config=networking)
        except errors.ImageNotFound:
            raise BackendError(f"image {config['image']!r} is not on this Docker host",
                               hint="build it with `wmctl build-image SPEC` or pull it, then submit again") from None
        except errors.APIError as exc:
            if exc.status_code != 409:
                raise
            return self._adopt(config["name"], plan, res.get("node", "store"))
        cid = out["Id"]
        undo.append(lambda: self._quiet_remove_container(cid))
        return cid

    def _adopt(self, name: str, plan: Any, node: int | str) -> str:
        container = self.client.containers.get(name)
        have = container.labels or {}
        if have.get(L.RUN) != plan.run or have.get(L.ATTEMPT) != str(plan.attempt) or have.get(L.NODE) != str(node):
            raise BackendError(f"a container named {name!r} exists but is not node {node} of {plan.attempt_name} "
                               f"(its labels: run={have.get(L.RUN)!r} attempt={have.get(L.ATTEMPT)!r})",
                               hint=f"remove it (`docker rm -f {name}`) or rename the run")
        return container.id

    def _start(self, cid: str) -> None:
        state = self.client.api.inspect_container(cid)["State"]
        if state.get("Status") == "created":  # an adopted container that already ran is left as it is
            self.client.api.start(cid)

    def _rollback(self, undo: list[Callable[[], None]]) -> None:
        for action in reversed(undo):
            action()
        undo.clear()

    def _quiet_remove(self, obj: Any) -> None:
        errors, _ = sdk.errors()
        try:
            obj.remove()
        except errors.NotFound:
            pass

    def _quiet_remove_container(self, cid: str) -> None:
        errors, _ = sdk.errors()
        try:
            # force: SIGKILL then remove; v: the container's anonymous (empty_dir) volumes go too,
            # named volumes never do.
            self.client.api.remove_container(cid, force=True, v=True)
        except errors.NotFound:
            pass
        except errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    # ------------------------------------------------------------ observation

    def _watch(self, ref: b.AttemptRef, names: dict[int, str], since: float) -> AttemptState:
        key = (ref.run, ref.attempt)
        with self._lock:
            st = self._attempts.get(key)
            if st is not None:
                return st
            st = AttemptState(ref, names, spares=slotfiles.has_rounds(ref.run, ref.attempt))
            # Alive when the attempt started, as far as anyone knows: a container found gone later
            # with nothing to date its removal can have gone any time since.
            st.alive_at = {node: since for node in names}
            self._attempts[key] = st
        t = threading.Thread(target=self._follow_events, args=(st, since), daemon=True,
                             name=f"wmctl-docker-events-{ref.attempt_name}")
        st.threads.append(t)
        t.start()
        # With spares global rank 0 is on whichever slot c10d ranks first in a round: every slot's
        # output is read whole, as the local backend reads every node's.
        followed = (sorted(names) if st.spares else [0, b.WITNESS_NODE]) if self._log_follow else []
        for node in (n for n in followed if n in names):
            witness = node != 0 and not st.spares
            t = threading.Thread(target=self._follow_progress, args=(st, names[node], node, witness), daemon=True,
                                 name=f"wmctl-docker-log-{node}-{ref.attempt_name}")
            st.threads.append(t)
            t.start()
        return st

    def _state_for(self, ref: b.AttemptRef) -> AttemptState:
        st = self._attempts.get((ref.run, ref.attempt))
        if st is not None:
            return st
        # A watcher started again: rebuild from container labels and replay the engine's events.
        found = self._containers(ref.run, ref.attempt)
        if not found:
            raise RunNotFound(f"no containers of {ref.attempt_name} on this Docker host",
                              hint="`wmctl list` shows the runs this host knows")
        names = {int(c.labels[L.NODE]): c.name for c in found if c.labels.get(L.NODE, "").isdigit()}
        # A container removed while nobody watched is missing from the list, not from the
        # attempt: the survivors' label says how many nodes there were.
        counts = [int(c.labels[L.NODES]) for c in found if c.labels.get(L.NODES, "").isdigit()]
        for node in range(max(counts, default=0)):
            names.setdefault(node, layout.node_name(ref.run, ref.attempt, node))
        created = [parse_docker_time(c.attrs.get("Created")) for c in found]
        since = min((t for t in created if t is not None), default=time.time()) - 1.0
        st = self._watch(ref, names, since)
        self._replay_events(st, since)
        return st

    def _replay_events(self, st: AttemptState, since: float) -> None:
        """The engine's past events of the attempt, queued before the first look: the kill
        signals, exit codes and removal times of what happened while nobody watched (the engine
        keeps its latest events only; the follower thread brings the rest, deduplicated)."""
        errors, rexc = sdk.errors()
        filters = {**attempt_filters(st.ref.run, st.ref.attempt), "type": ["container"]}
        try:
            for ev in self.client.events(decode=True, filters=filters, since=int(since), until=int(time.time())):
                st.inbox.put(("docker", ev))
        except (errors.DockerException, rexc.RequestException):
            pass        # the follower thread subscribes again from the same start

    def _follow_events(self, st: AttemptState, since: float) -> None:
        errors, rexc = sdk.errors()
        filters = {**attempt_filters(st.ref.run, st.ref.attempt), "type": ["container"]}
        last = since
        while not st.stop.is_set():
            try:
                stream = self.client.events(decode=True, filters=filters, since=int(last))
            except (errors.DockerException, rexc.RequestException):
                st.stop.wait(1.0)  # engine restarting: resubscribe from the last event seen
                continue
            st.streams.append(stream)
            if st.stop.is_set():
                stream.close()
                return
            for ev in stream:
                last = max(last, ev.get("time", last))
                st.inbox.put(("docker", ev))
            st.streams.remove(stream)
            st.stop.wait(1.0)

    def _follow_progress(self, st: AttemptState, name: str, node: int = 0, witness: bool = False) -> None:
        """Node 0's output: progress lines and the output heartbeat. The witness node's
        (base.WITNESS_NODE, ``witness``): its reports about node 0 only."""
        output_at: dict[int, float] = {}
        for ns, line in self._log_lines(name, follow=True, stop=st.stop, streams=st.streams):
            ev = b.line_event(line, node, name, output_at, witness=witness, stamp=ns / 1e9 if ns else None)
            if ev is not None:
                st.inbox.put(("progress", ev))

    def _log_lines(self, name: str, *, follow: bool, stop: threading.Event | None = None,
                   streams: list[Any] | None = None, tail: int | None = None,
                   since: float | None = None) -> Iterator[tuple[int, str]]:
        """(timestamp ns, line) of a container's output (the last ``tail`` lines, those at or after
        ``since``). Following survives read timeouts on a silent container by reconnecting a
        little before the newest line read, dropping the lines read already (logcursor)."""
        errors, rexc = sdk.errors()
        stop = stop or threading.Event()
        cursor = LogCursor()
        while not stop.is_set():
            start = cursor.resume_from_ns()
            try:
                stream = self.client.api.logs(name, stream=True, follow=follow, timestamps=True,
                                              tail=tail if start is None and tail is not None else "all",
                                              since=(max(1, start // 10**9) if start is not None else since))
            except errors.APIError as exc:
                if exc.status_code in (404, 409):   # gone, or dead / being removed: nothing more to read
                    return
                raise
            except rexc.RequestException:
                if not follow:
                    raise
                stop.wait(1.0)
                continue
            if streams is not None:
                streams.append(stream)
            yield from fresh_lines(stream, cursor)
            if streams is not None and stream in streams:
                streams.remove(stream)
            if not follow:
                return
            if not self._alive(name):
                # dockerd may end a follow when the container stops before its follower read the
                # whole log (seen under load: 15,350 of 40,000 lines): one last plain read from
                # where this one was, the cursor dropping what was read, takes the rest.
                follow = False

    def _exists(self, name: str) -> bool:
        errors, _ = sdk.errors()
        try:
            self.client.api.inspect_container(name)
            return True
        except errors.NotFound:
            return False

    def _alive(self, name: str) -> bool:
        errors, _ = sdk.errors()
        try:
            return self.client.api.inspect_container(name)["State"].get("Status") in ("running", "paused",
                                                                                    "restarting", "created")
        except errors.NotFound:
            return False

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        errors, _ = sdk.errors()
        with sdk.engine(f"polling {ref.attempt_name}"):
            st = self._state_for(ref)
            # With spares: the current round's active slots only (not an idle spare, nor a slot replaced)
            current = slotfiles.current(ref.run, ref.attempt) if st.spares else None
            active = sorted(st.names) if current is None else sorted(n for n in st.names if n in current["active"])
            with st.lock:
                events = drain(st)
                # Cancelling an attempt that had already ended is clean-up, not a cancellation.
                ended = bool(st.status) and all(st.status[n].phase in TERMINAL for n in active if n in st.status)
                looked = time.time()
                for node in active:
                    name = st.names[node]
                    try:
                        info = self.client.api.inspect_container(name)
                    except errors.NotFound:
                        info = None
                    state = info["State"] if info else None
                    signal = st.signals.get(node)
                    started = parse_docker_time(state.get("StartedAt")) if state else None
                    finished = parse_docker_time(state.get("FinishedAt")) if state else None
                    if current is not None and state is not None and state.get("Status") == "running":
                        # The container runs on across rounds, its keeper waiting between them: the
                        # round's start and end are the keeper's pid and exit files.
                        started = slotfiles.round_start(ref.run, ref.attempt, node, current["round"])
                        end = slotfiles.round_end(ref.run, ref.attempt, node, current["round"])
                        if end is not None:
                            state = {**state, "Status": "exited", "ExitCode": end.get("exit_code"), "OOMKilled": False}
                            signal, finished = end.get("signal"), float(end.get("time") or looked)
                        elif started is None:
                            state = {**state, "Status": "created"}     # not this round's torchrun yet
                    prev = st.status.get(node)
                    cur = node_status(node, name, state, signal=signal, cancelled=st.cancelled,
                                      previous=prev, gone_exit=st.died.get(node))
                    events += transition_events(
                        prev, cur, name=name, event_time=event_time(st, node, prev, cur),
                        started_at=started, finished_at=finished, last_alive=st.alive_at.get(node))
                    if cur.phase in (b.PENDING, b.RUNNING, b.PAUSED):
                        st.alive_at[node] = looked
                    st.status[node] = cur
                if st.cancelled and not st.cancel_reported:
                    st.cancel_reported = True
                    if not ended:
                        events.append(b.Event(b.CANCELLED, message=f"{ref.attempt_name} cancelled by wmctl"))
                nodes = [st.status[n] for n in active]
            # With spares a failed round is not the attempt's end: the supervisor may answer it with
            # a spare (recover_in_place), and the followers must read the next round. Teardown stops them.
            over = not st.spares or all(n.phase == b.SUCCEEDED for n in nodes)
            if b.Observation([], nodes).finished and over and not st.stop.is_set():
                if st.spares:
                    slotfiles.close(ref.run, ref.attempt)     # idle spares stop: their logs end too
                # Nothing more can happen. The log stream ends with node 0's container: give the
                # follower a moment to deliver the last PROGRESS lines, then stop the threads.
                for t in st.threads[1:]:
                    t.join(timeout=2.0)
                if all(not t.is_alive() for t in st.threads[1:]):
                    self._stop_threads(st)
                with st.lock:
                    events += drain(st)
        events.sort(key=lambda e: e.time)
        return b.Observation(events, nodes)

    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        query = query or b.LogQuery()
        kept = b.kept_log(ref, node, query)
        if kept is not None:   # the attempt was torn down: its containers are gone
            yield from kept
            return
        with sdk.engine(f"reading the log of node {node} of {ref.attempt_name}"):
            st = self._state_for(ref)
            name = st.names.get(node)
            if name is None:
                raise RunNotFound(f"{ref.attempt_name} has no node {node}",
                                  hint=f"nodes are 0..{max(st.names)}")
            if not self._exists(name):
                raise RunNotFound(f"the container of node {node} of {ref.attempt_name} ({name}) is gone, "
                                  "and its log with it", hint="logs last as long as the attempt's containers")
            for ns, line in self._log_lines(name, follow=follow, tail=query.tail, since=query.since):
                if query.since is not None and ns and ns < query.since * 1e9:
                    continue        # the engine's `since` is whole seconds
                yield f"{b.rfc3339(ns)} {line}" if query.timestamps else line

    # ------------------------------------------------------------ teardown and listing

    def cancel(self, ref: b.AttemptRef, graceful: bool = False, timeout: float | None = None) -> None:
        """Tear the attempt down at once (SIGKILL + remove); ``graceful``: ``docker stop`` first,
        with ``timeout`` or the container's own stop timeout. Named volumes are never removed."""
        errors, _ = sdk.errors()
        st = self._attempts.get((ref.run, ref.attempt))
        if st is not None:
            st.cancelled = True  # before the kill: its events and exits are ours, not a failure
        if not graceful:
            slotfiles.close(ref.run, ref.attempt)    # spare nodes: idle keepers stop rather than wait
        with sdk.engine(f"cancelling {ref.attempt_name}"):
            found = self._containers(ref.run, ref.attempt)
            if graceful:
                stoppers = [threading.Thread(target=self._quiet_stop, args=(c, timeout), daemon=True) for c in found]
                for t in stoppers:
                    t.start()
                for t in stoppers:
                    t.join()
            for c in found:        # every node stops now; archiving and removal can take their time
                self._quiet_kill(c.id)
            self._archive_logs(ref, found)
            for c in found:
                self._quiet_remove_container(c.id)
            for net in self.client.networks.list(filters=attempt_filters(ref.run, ref.attempt)):
                try:
                    net.remove()
                except errors.NotFound:
                    pass
        if st is not None:
            self._stop_threads(st)

    def release(self, ref: b.AttemptRef) -> None:
        """The attempt ended: keep its logs in the run folder, free its containers and network
        (a finished container would otherwise hold the attempt's name on this host)."""
        self.cancel(ref)

    def _quiet_kill(self, cid: str) -> None:
        errors, _ = sdk.errors()
        try:
            self.client.api.kill(cid)
        except errors.NotFound:
            pass
        except errors.APIError as exc:
            if exc.status_code != 409:   # 409: not running (exited already, or being removed)
                raise

    def _archive_logs(self, ref: b.AttemptRef, found: list[Any]) -> None:
        errors, _ = sdk.errors()
        for c in found:
            node = c.labels.get(L.NODE, "")
            if not node.isdigit():
                continue
            try:
                data = self.client.api.logs(c.id, stdout=True, stderr=True, tail=b.ARCHIVE_TAIL_LINES)
            except errors.NotFound:
                continue
            except errors.APIError as exc:
                if exc.status_code != 409:
                    raise
                continue    # dead or being removed (a removal the engine had not finished): no log left
            open_store(ref.run).archive_log(ref.attempt, int(node), data)

    def _quiet_stop(self, container: Any, timeout: float | None) -> None:
        errors, _ = sdk.errors()
        try:
            container.stop(**({"timeout": int(timeout)} if timeout is not None else {}))
        except errors.NotFound:
            pass
        except errors.APIError as exc:
            if exc.status_code not in (304, 409):
                raise

    def _containers(self, run: str, attempt: int | None) -> list[Any]:
        return self.client.containers.list(all=True, filters=attempt_filters(run, attempt), ignore_removed=True)

    def attempts(self, run: str) -> list[b.AttemptRef]:
        with sdk.engine(f"listing the attempts of {run}"):
            found = {c.labels.get(L.ATTEMPT) for c in self._containers(run, None)}
        numbers = sorted(int(a) for a in found if a and a.isdigit())
        return [b.AttemptRef(self.name, run, n) for n in numbers]

    def _stop_threads(self, st: AttemptState) -> None:
        st.stop.set()
        for stream in list(st.streams):
            with contextlib.suppress(OSError, AttributeError):
                stream.close()

    def close(self) -> None:
        """Stop every background thread (events, log follower). Containers are left as they are."""
        for st in list(self._attempts.values()):
            self._stop_threads(st)
        for st in list(self._attempts.values()):
            for t in st.threads:
                t.join(timeout=5)
        self._attempts.clear()
