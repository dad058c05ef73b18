"""Kubernetes backend: an attempt is an Indexed Job plus a headless Service.

submit creates the Service, then any PodGroup, then the Job; a 409 means the object is
already there (a retry after a lost response, or a second watcher) and is adopted after its
run/attempt labels are checked. poll drains events that background list+watch threads derive
from Pods, the Job, Nodes and two logs: index 0's (global rank 0: the job's progress, or its
output as a heartbeat) and, with two nodes or more, index 1's as the witness of index 0's node
(base.witness_progress). cancel deletes with cascading (Foreground) and force-deletes pods left on lost
nodes so the next attempt is not blocked.

The Kubernetes client comes through ``adaptors.kubernetes``, loaded on first use, so the CLI's
--help and dry runs never load it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ... import labels as L
from ...adaptors import kubernetes as sdk
from ...errors import BackendError, EngineUnavailable, RunNotFound, SpecError
from ...plan import AttemptContext, HostFacts, Plan
from ...runtime.protocol import parse_progress
from ...serialize import dump
from ...spec import JobSpec
from ...state import open_store
from ...vendors import VendorProfile
from .. import base as b
from ..base import (CANCELLED, LOST, NODE_EXITED, NODE_LOST, NODE_QUEUED, NODE_STARTED, NODE_WAITING, PROGRESS,
                    SUCCEEDED, AttemptRef, Event, NodeStatus, Observation)
from .check import pod_problems, volume_problems
from ..logcursor import LogCursor, split_timestamp
from .classify import (JOB_END_CONDITIONS, device_counts, device_loss, failed_create, job_end_event, job_finished,
                       kueue_wait, newest_per_index, node_healthy, node_ready, node_statuses, pod_deleted_event,
                       pod_events, pod_index, pod_loss_evidence, since_seconds)
from .client import Backoff, Contact, call, call_json, close_stream, is_transient, request_timeout
from .kinds import KINDS, Kind, create_order
from .render import KubernetesRequest, render_kubernetes
from .nodewatch import PAGE_SIZE, PER_NAME_MAX, NodeWatch, trim_node
from .watch import ResourceWatcher

MANAGED_BY, RUN_LABEL, ATTEMPT_LABEL = L.MANAGED_BY, L.RUN, L.ATTEMPT

Obj = dict[str, Any]

# Teardown reads each pod's log tail before the pod goes; a kubelet slower than this is skipped.
ARCHIVE_TIMEOUT_S = 5.0
# A followed log that sends nothing for this long is re-opened from its cursor: a quiet log
# costs one reconnect, a half-open one no longer blocks progress detection for good.
LOG_READ_TIMEOUT_S = 60.0
# Pod index 0 is global rank 0 and the c10d store's host: when its machine dies no line of its
# log arrives. Index 1 (base.WITNESS_NODE) keeps the runtime's witness, whose log is followed too,
# for its reports about group rank 0 only (base.witness_progress); every other line there is
# rank 0's to tell, and a second copy would only duplicate or mask it.
WITNESS_INDEX = b.WITNESS_NODE


def attempt_selector(run: str, attempt: int) -> str:
    return f"{RUN_LABEL}={run},{ATTEMPT_LABEL}={attempt}"


def plan_manifests(plan: Plan[KubernetesRequest]) -> list[Obj]:
    """The manifests of a Kubernetes plan; a plan for another backend, or one without
    manifests, is refused before anything is created."""
    if not isinstance(getattr(plan, "request", None), KubernetesRequest):
        raise BackendError(f"a {getattr(plan, 'backend', '?')} plan cannot be submitted to Kubernetes",
                           hint="render the plan for the kubernetes backend")
    found = plan.resources
    if not found or not all(isinstance(m, dict) for m in found):
        raise BackendError("the plan has no Kubernetes manifests",
                           hint="render the plan for the kubernetes backend (wmctl render)")
    return found


@dataclass
class _AttemptState:
    ref: AttemptRef
    completions: int
    container: str | None
    lock: threading.RLock = field(default_factory=threading.RLock)
    pods: dict[str, Obj] = field(default_factory=dict)      # uid -> latest pod
    node_watch: NodeWatch | None = None       # the Nodes of this attempt's pods (nodewatch.py)
    node_access: bool = True        # False once listing Nodes was forbidden: pods' own evidence decides
    job: Obj | None = None
    job_absent: bool = False        # the Job watch listed no Job, or saw it deleted
    gone: dict[int, Obj] = field(default_factory=dict)      # index -> last state of a deleted pod
    resolved: list[NodeStatus] | None = None   # how an attempt found gone ended (resolve_gone)
    emitted: set[tuple[str, str]] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    failure_seen: bool = False      # a fact that explains a Failed Job was emitted
    events: list[Event] = field(default_factory=list)
    cancelled: bool = False
    cancel_seen: bool = False       # the Job's cancel annotation was reported
    watchers: list[Any] = field(default_factory=list)
    log_threads: dict[int, threading.Thread] = field(default_factory=dict)   # pod index -> its follower
    stop: threading.Event = field(default_factory=threading.Event)
    log_resps: dict[int, Any] = field(default_factory=dict)    # pod index -> its open log stream
    # what the pods cannot tell, read at most every FAILED_CREATE_EVERY_S (_due): the Job's
    # Events for FailedCreate ("events"), its Kueue Workload ("queue"); name -> last read
    read_at: dict[str, float] = field(default_factory=dict)

    def _due(self, what: str, wanted: Any) -> bool:
        """Under ``lock``: whether the rate-limited read ``what`` is wanted and due now; if so it
        counts as read."""
        now = time.monotonic()
        if not wanted or now - self.read_at.get(what, float("-inf")) < FAILED_CREATE_EVERY_S:
            return False
        self.read_at[what] = now
        return True
    devices_seen: dict[str, dict[str, int]] = field(default_factory=dict)   # pod uid -> device counts first seen


# How long a graceful cancel waits past the pods' grace period for the kubelets to report them
# ended (their status reaches the API server after the container exits).
GRACEFUL_MARGIN_S = 15.0
# The survivors' grace period once a peer is known dead (cut_grace): room to flush their logs,
# nothing more, as no checkpoint can commit without the dead peer (every rank writes its part
# before rank 0's marker). 2 s is the kubelet's own floor for a graceful stop: a shorter grace
# is raised to it (minimumGracePeriodInSeconds, pkg/kubelet/kuberuntime/kuberuntime_manager.go).
DEAD_PEER_GRACE_S = 2
GRACEFUL_POLL_S = 0.5
# While some node has no pod, the Job's Events are read this often for the Job controller's
# FailedCreate (a quota, PodSecurity, a missing PriorityClass): the only place that refusal shows.
FAILED_CREATE_EVERY_S = 2.0
GONE_POLL_S = 0.1         # teardown waits for the attempt's pods to be gone before the next one


def _graceful_intent(intent: str) -> bool:
    try:
        data = json.loads(intent)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("graceful") is True


class KubernetesBackend(b.Backend[KubernetesRequest]):
    name = "kubernetes"
    places_nodes = True      # the scheduler honours a node anti-affinity
    graceful_cancel = True   # suspend the Job: SIGTERM with the pods' grace period, then the teardown
    run_store = "orchestrator.backends.kubernetes.runstore"   # ConfigMaps: watchers on any machine, or in a pod
    cluster_watcher = True   # incluster.py: a one-replica Deployment running `wmctl watch`
    namespaced = True
    resolves_gone = True     # _resolve_gone: the Job it saw finish, or the Job controller's Event
    # pods/log's PodLogOptions: tailLines, sinceSeconds, timestamps (the kubelet keeps each line's time)
    log_options = frozenset({"tail", "since", "timestamps"})

    @classmethod
    def create(cls, options: b.BackendOptions) -> "KubernetesBackend":
        return cls(context=options.context, kubeconfig=options.kubeconfig, namespace=options.namespace or "default")

    @classmethod
    def check(cls, spec: JobSpec) -> list[tuple[str, str]]:
        return volume_problems(spec) + pod_problems(spec)

    @classmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext,
               host: HostFacts) -> Plan[KubernetesRequest]:
        return render_kubernetes(spec, profile, ctx, host)

    @classmethod
    def document(cls, plan: Plan[KubernetesRequest], output: str) -> str:
        """Manifests kubectl accepts: a List in JSON, a YAML stream under comment lines."""
        if output == "json":
            return dump({"apiVersion": "v1", "kind": "List", "items": plan.resources}, "json")
        header = "".join(f"# {note}\n" for note in
                         [f"wmctl plan: run {plan.run}, attempt {plan.attempt}, spec {plan.spec_hash}", *plan.notes])
        return header + dump(plan.resources, "yaml")

    def namespace_of(self, spec: JobSpec) -> str | None:
        return spec.kubernetes.namespace

    def __init__(self, api_client: Any = None, *, context: str | None = None,
                 kubeconfig: str | None = None, in_cluster: bool | None = None,
                 namespace: str = "default", watch_timeout: int = 30,
                 force_delete_lost: bool = True, contact: Contact | None = None,
                 log_read_timeout: float = LOG_READ_TIMEOUT_S):
        self._api_client = api_client
        self._single_try = False
        self._context, self._kubeconfig, self._in_cluster = context, kubeconfig, in_cluster
        self.namespace = namespace
        self.watch_timeout = watch_timeout
        self.force_delete_lost = force_delete_lost
        self.contact = contact or Contact()          # poll() notices an API outage (client.Contact)
        self.log_read_timeout = log_read_timeout
        self._kueue_api: tuple[str | None] | None = None   # (Kueue's preferred version or None), once asked
        self._states: dict[tuple[str, int, str], _AttemptState] = {}
        # (run, attempt, namespace) -> (completions, container name), learnt from the Job
        self._shapes: dict[tuple[str, int, str], tuple[int, str | None]] = {}
        # what each attempt's teardown could not do (forbidden or unserved steps), one line each
        self._notes: dict[tuple[str, int, str], list[str]] = {}
        # (run, attempt, namespace) -> the PodGroup the Job's pods join (None: no Volcano)
        self._gangs: dict[tuple[str, int, str], str | None] = {}
        self._lock = threading.Lock()

    # --- client ------------------------------------------------------------------------
    @property
    def api_client(self) -> Any:
        if self._api_client is None:
            self._api_client = sdk.load_api_client(self._context, self._kubeconfig, self._in_cluster)
        if not self._single_try:
            sdk.single_try(self._api_client)     # retries are client.call's and the watchers' alone
            self._single_try = True
        return self._api_client

    def _core(self) -> Any:
        client = sdk.sdk()
        return client.CoreV1Api(self.api_client)

    def _batch(self) -> Any:
        client = sdk.sdk()
        return client.BatchV1Api(self.api_client)

    def _custom(self) -> Any:
        client = sdk.sdk()
        return client.CustomObjectsApi(self.api_client)

    # --- submit --------------------------------------------------------------------------
    def submit(self, plan: Plan[KubernetesRequest]) -> AttemptRef:
        manifests = plan_manifests(plan)
        jobs = [m for m in manifests if m.get("kind") == "Job"]
        if len(jobs) != 1:
            raise BackendError(f"a Kubernetes plan needs exactly one Job, found {len(jobs)}")
        job = jobs[0]
        labels = (job.get("metadata") or {}).get("labels") or {}
        run, attempt_raw = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL)
        if not run or attempt_raw is None or not str(attempt_raw).isdigit():
            raise BackendError(f"the Job manifest lacks the {RUN_LABEL} / {ATTEMPT_LABEL} labels",
                               hint="render manifests with wmctl's renderer")
        attempt = int(attempt_raw)
        namespace = (job.get("metadata") or {}).get("namespace") or plan.request.namespace or self.namespace
        made = [(m, self._create_or_adopt(m, namespace, run, attempt))
                for m in sorted(manifests, key=lambda m: create_order(m.get("kind")))]
        self._own(made, namespace)
        ref = AttemptRef(self.name, run, attempt, namespace)
        self._learn_shape(ref, job)
        self._state(ref)          # start watching at once so nothing is missed
        return ref

    def _own(self, made: list[tuple[Obj, Obj]], namespace: str) -> None:
        """Make the Job the owner of the attempt's other objects (the kinds table says which).
        They are created before the Job (DNS and the gang must exist before its pods), so the
        reference is patched in once the Job has a uid. Best effort: an object left unowned is
        still deleted by cancel; only the TTL's cleanup would miss it."""
        ApiException = sdk.api_exception()
        job = next((obj for m, obj in made if m.get("kind") == "Job"), None)
        meta = (job or {}).get("metadata") or {}
        if not meta.get("uid"):
            return
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        for m, obj in made:
            kind = KINDS.get(m.get("kind") or "")
            refs = ((obj.get("metadata") or {}).get("ownerReferences")) or []
            if kind is None or not kind.owned or any(r.get("uid") == owner["uid"] for r in refs):
                continue
            name = obj["metadata"]["name"]
            try:
                call(self._patcher(kind, m), name, namespace, {"metadata": {"ownerReferences": [*refs, owner]}},
                     what=f"set the owner of {kind.kind} {namespace}/{name}")
            except ApiException:
                pass        # 403 (no patch verb) or 404 (already gone): see the docstring

    def _patcher(self, kind: Kind, m: Obj):
        """patch(name, namespace, body) for a kind, from the kinds table."""
        if kind.api is not None:
            api = getattr(sdk.sdk(), kind.api)(self.api_client)
            return getattr(api, f"patch_namespaced_{kind.method}")
        group, version = m["apiVersion"].split("/")
        custom, plural = self._custom(), kind.plural
        return lambda n, ns, body, **kw: custom.patch_namespaced_custom_object(group, version, ns, plural, n,
                                                                               body, **kw)

    def _learn_shape(self, ref: AttemptRef, job: Obj) -> None:
        spec = job.get("spec") or {}
        containers = (((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}])
        key = (ref.run, ref.attempt, ref.namespace or self.namespace)
        self._shapes[key] = (int(spec.get("completions") or 1), containers[0].get("name"))
        # the Volcano PodGroup its pods join, if the spec asked for Volcano (render.py)
        tmeta = (spec.get("template") or {}).get("metadata") or {}
        self._gangs[key] = ((tmeta.get("annotations") or {}).get(L.VOLCANO_GROUP)
                            if ((spec.get("template") or {}).get("spec") or {}).get("schedulerName") == "volcano"
                            else None)

    def _shape(self, ref: AttemptRef) -> tuple[int, str | None]:
        """How many nodes the attempt's Job has, and its container's name (0, None: unknown, as for
        an attempt this object neither submitted nor listed; the pods then tell)."""
        return self._shapes.get((ref.run, ref.attempt, ref.namespace or self.namespace), (0, None))

    def _create_or_adopt(self, m: Obj, namespace: str, run: str, attempt: int) -> Obj:
        ApiException = sdk.api_exception()

        kind = m.get("kind")
        name = (m.get("metadata") or {}).get("name")
        create, read = self._crud(kind, m)
        what = f"create {kind} {namespace}/{name}"
        try:
            return call(create, namespace, m, what=what)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"Kubernetes refused to {what}: {exc.status} {_reason(exc)}",
                                   hint="check the manifest (wmctl render) and your RBAC") from None
        existing = call(read, name, namespace, what=f"read {kind} {namespace}/{name}")
        meta = existing.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(RUN_LABEL) != run or labels.get(ATTEMPT_LABEL) != str(attempt) \
                or meta.get("deletionTimestamp"):
            raise BackendError(
                f"{kind} {namespace}/{name} already exists and is not attempt {attempt} of run "
                f"{run!r}" + (" (it is being deleted)" if meta.get("deletionTimestamp") else ""),
                hint=f"pick another run name, or delete it: kubectl -n {namespace} delete "
                f"{(kind or 'object').lower()} {name}")
        return existing

    def _crud(self, kind: str | None, m: Obj):
        """(create(namespace, body) -> dict, read(name, namespace) -> dict) for a kind."""
        def raw(fn, *args, **kw):
            resp = fn(*args, _preload_content=False, **kw)
            try:
                return json.loads(resp.data)
            finally:
                resp.release_conn()
        # the caller's call() retries; raw() only skips the client's model deserialisation
        found = KINDS.get(kind or "")
        if found is None:
            raise BackendError(f"the Kubernetes backend cannot create a {kind}",
                               hint=f"only {', '.join(KINDS)} manifests are supported")
        if found.api is not None:
            api = getattr(sdk.sdk(), found.api)(self.api_client)
            create_fn = getattr(api, f"create_namespaced_{found.method}")
            read_fn = getattr(api, f"read_namespaced_{found.method}")
            return (lambda ns, b, **kw: raw(create_fn, ns, b, **kw), lambda n, ns, **kw: raw(read_fn, n, ns, **kw))
        group, version = m["apiVersion"].split("/")
        custom, plural = self._custom(), found.plural
        return (lambda ns, b, **kw: custom.create_namespaced_custom_object(group, version, ns, plural, b, **kw),
                lambda n, ns, **kw: custom.get_namespaced_custom_object(group, version, ns, plural, n, **kw))

    # --- observation -----------------------------------------------------------------------
    def _state(self, ref: AttemptRef) -> _AttemptState:
        key = (ref.run, ref.attempt, ref.namespace or self.namespace)
        with self._lock:
            st = self._states.get(key)
            if st is None:
                st = _AttemptState(ref, *self._shape(ref))
                self._states[key] = st
                self._start_watchers(st)
            return st

    def _start_watchers(self, st: _AttemptState) -> None:

        ns = st.ref.namespace or self.namespace
        core, batch = self._core(), self._batch()
        sel = attempt_selector(st.ref.run, st.ref.attempt)
        st.node_watch = NodeWatch(core.list_node, lambda names: self._nodes_changed(st, names),
                                  watch_timeout=self.watch_timeout,
                                  on_forbidden=lambda exc: self._nodes_forbidden(st))
        st.watchers = [
            st.node_watch,
            ResourceWatcher(batch.list_namespaced_job,
                            {"namespace": ns, "field_selector": f"metadata.name={st.ref.attempt_name}"},
                            lambda items: self._job_sync(st, items),
                            lambda t, o: self._job_event(st, t, o), name="job",
                            watch_timeout=self.watch_timeout),
            ResourceWatcher(core.list_namespaced_pod, {"namespace": ns, "label_selector": sel},
                            lambda items: self._pods_sync(st, items),
                            lambda t, o: self._pod_event(st, t, o), name="pods",
                            watch_timeout=self.watch_timeout),
        ]
        for w in st.watchers:
            w.start()
        self._start_log_followers(st)

    def _start_log_followers(self, st: _AttemptState) -> None:
        """Follow index 0's log, and index 1's (the witness, base.witness_progress) once the attempt is
        known to have two nodes or more: at once for an attempt this object submitted, else when
        the Job tells its completions."""
        with st.lock:
            wanted = [0, WITNESS_INDEX] if st.completions > WITNESS_INDEX else [0]
            for index in wanted:
                if index in st.log_threads or st.stop.is_set():
                    continue
                t = threading.Thread(target=self._follow_log, args=(st, index), daemon=True,
                                     name="wmctl-rank0-log" if index == 0 else f"wmctl-witness{index}-log")
                st.log_threads[index] = t
                t.start()

    def _emit(self, st: _AttemptState, facts: list[tuple[tuple[str, str], Event]],
              terminating: bool = False) -> None:
        for key, ev in facts:
            if key in st.emitted:
                continue
            st.emitted.add(key)
            if key[0] == "lost":
                st.lost.add(key[1])
            # What can explain a Failed Job. A non-zero exit of a pod being deleted cannot: it
            # is the SIGTERM of a teardown (the Job controller's, after the failure).
            if ev.kind not in (NODE_STARTED, PROGRESS, NODE_EXITED, NODE_WAITING, NODE_QUEUED) or (
                    ev.kind == NODE_EXITED and ev.exit_code != 0 and not terminating):
                st.failure_seen = True
            st.events.append(ev)

    def _evaluate(self, st: _AttemptState, pod: Obj) -> None:

        if st.cancelled:
            return
        host = (pod.get("spec") or {}).get("nodeName") or ""
        known, node = st.node_watch.lookup(host) if st.node_watch and host else (False, None)
        facts = pod_events(pod, node, nodes_known=known, node_access=st.node_access, now=time.time())
        if node is not None and node_healthy(node):
            # a device plugin's unhealthy device lowers the node's allocatable (classify.device_loss)
            counts = device_counts(pod, node)
            first = st.devices_seen.setdefault(pod["metadata"]["uid"], counts)
            lost = device_loss(pod, first, counts)
            if lost is not None:
                facts.append((("lost", pod["metadata"]["uid"]), Event(
                    NODE_LOST, node=pod_index(pod), host=node["metadata"]["name"], reason="DeviceUnhealthy",
                    message=lost)))
        self._emit(st, facts, terminating=bool(pod["metadata"].get("deletionTimestamp")))

    def _deleted(self, st: _AttemptState, pod: Obj) -> None:

        idx = pod_index(pod)
        if idx is not None:
            st.gone[idx] = pod
        fact = pod_deleted_event(pod, cancelled=st.cancelled, job_finished=job_finished(st.job),
                                 failure_seen=st.failure_seen, now=time.time())
        if fact:
            self._emit(st, [fact])

    def _pods_sync(self, st: _AttemptState, items: list[Obj]) -> None:
        with st.lock:
            fresh = {p["metadata"]["uid"]: p for p in items}
            gone = [old for uid, old in st.pods.items() if uid not in fresh]
            st.pods.update(fresh)
            self._scope_nodes(st, items)
            for p in items:                   # exits first: they may explain the deletions
                self._evaluate(st, p)
            for old in gone:                  # deleted while we were not watching
                del st.pods[old["metadata"]["uid"]]
                self._deleted(st, old)

    def _pod_event(self, st: _AttemptState, etype: str, pod: Obj) -> None:
        with st.lock:
            uid = pod["metadata"]["uid"]
            if etype == "DELETED":
                st.pods.pop(uid, None)
                self._evaluate(st, pod)        # its last state may carry the exit
                self._deleted(st, pod)
            else:
                st.pods[uid] = pod
                self._scope_nodes(st, [pod])
                self._evaluate(st, pod)

    @staticmethod
    def _scope_nodes(st: _AttemptState, pods: list[Obj]) -> None:
        """Watch the nodes these pods were scheduled to (nodewatch.py: only this attempt's)."""
        if st.node_watch is not None:
            st.node_watch.add({(p.get("spec") or {}).get("nodeName") or "" for p in pods} - {""})

    def _nodes_changed(self, st: _AttemptState, names: set[str]) -> None:
        with st.lock:
            for p in list(st.pods.values()):
                if (p.get("spec") or {}).get("nodeName") in names:
                    self._evaluate(st, p)

    def _nodes_forbidden(self, st: _AttemptState) -> None:
        """This user may not read Nodes (the built-in edit/admin roles): judge node loss from the
        pods' own conditions from now on (classify.pod_loss_evidence)."""
        with st.lock:
            if st.node_access:
                st.node_access = False
                for p in list(st.pods.values()):
                    self._evaluate(st, p)

    def _job_sync(self, st: _AttemptState, items: list[Obj]) -> None:
        with st.lock:
            st.job = items[0] if items else st.job
            st.job_absent = not items
            if st.job and not st.completions:
                st.completions = int((st.job.get("spec") or {}).get("completions") or 1)
                self._start_log_followers(st)

    def _job_event(self, st: _AttemptState, etype: str, job: Obj) -> None:
        with st.lock:
            if etype != "DELETED":
                st.job = job
            st.job_absent = etype == "DELETED"
            intent = ((job.get("metadata") or {}).get("annotations") or {}).get(L.CANCEL_REQUESTED)
            if intent and not st.cancelled and not st.cancel_seen:
                # Another machine's `wmctl cancel` (its run folder is not ours): the Job says so.
                # A graceful one keeps the attempt's news coming: its SIGTERM checkpoint is next.
                st.cancel_seen = True
                st.cancelled = not _graceful_intent(intent)
                st.events.append(Event(CANCELLED, message=f"cancel requested on the Job: {intent}"))
            if not st.completions:
                st.completions = int((job.get("spec") or {}).get("completions") or 1)
                self._start_log_followers(st)

    def _follow_log(self, st: _AttemptState, index: int) -> None:
        """Follow pod ``index``'s log for WMCTL-PROGRESS lines (index 0: all of them; the
        witness: _read_log); resume after drops without repeats or gaps, by timestamp
        (classify.LogCursor), across kubelet log rotations."""
        ApiException = sdk.api_exception()
        iter_resp_lines = sdk.iter_resp_lines
        core = self._core()
        ns = st.ref.namespace or self.namespace
        uid_done: set[str] = set()
        cursors: dict[str, LogCursor] = {}
        output_at: dict[int, float] = {}
        delays = Backoff(0.05, 2.0)      # reconnects: jittered, growing, at least a 429's Retry-After
        while not st.stop.is_set():
            with st.lock:
                cands = [p for p in st.pods.values() if pod_index(p) == index
                         and p["metadata"]["uid"] not in uid_done
                         and _container_started(p)]
                pod = max(cands, key=lambda p: p["metadata"].get("creationTimestamp") or "",
                          default=None)
            if pod is None:
                st.stop.wait(0.05)
                continue
            uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
            cursor = cursors.setdefault(uid, LogCursor())
            kwargs: dict[str, Any] = {"follow": True, "timestamps": True, "_preload_content": False,
                                      "_request_timeout": request_timeout(self.log_read_timeout)}
            since = since_seconds(cursor, time.time())
            if since is not None:
                kwargs["since_seconds"] = since
            if st.container:
                kwargs["container"] = st.container
            try:
                resp = core.read_namespaced_pod_log(name, ns, **kwargs)
                with st.lock:
                    st.log_resps[index] = resp
                delays.reset()
                try:
                    if st.stop.is_set():
                        # close() ran while the request was on its way: it had no response to
                        # shut, and a quiet log would block this read for as long as the pod runs
                        break
                    self._read_log(st, index, iter_resp_lines(resp), pod["spec"].get("nodeName"), cursor,
                                   output_at)
                finally:
                    with st.lock:
                        st.log_resps.pop(index, None)
                    close_stream(resp)         # it may end mid-stream: on stop, or a bad line
                # a clean end: the container terminated or the pod went away
                with st.lock:
                    cur = st.pods.get(uid)
                if cur is None or _container_terminated(cur):
                    uid_done.add(uid)
                else:
                    st.stop.wait(0.05)
            except ApiException as exc:
                if sdk.api_status(exc) == 404:
                    uid_done.add(uid)
                st.stop.wait(0.05 if sdk.api_status(exc) in (400, 404) else
                             delays.delay(exc) if is_transient(exc) else 0.5)
            except sdk.connection_errors():
                st.stop.wait(delays.delay())   # dropped or timed-out stream: reconnect from the cursor
            except ValueError:
                st.stop.wait(delays.delay())

    def _read_log(self, st: _AttemptState, index: int, lines: Iterator[str], host: str | None,
                  cursor: LogCursor, output_at: dict[int, float]) -> None:
        """Turn the new lines of pod ``index``'s log stream into events: index 0's into PROGRESS
        (or, without progress lines, OUTPUT heartbeat) events; the witness's only into the
        PROGRESS events it exists for (base.witness_progress)."""
        for raw in lines:
            stamp, line = split_timestamp(raw)
            if not cursor.fresh(stamp, line):
                continue            # read before a reconnect
            prog = parse_progress(line)
            ev: Event | None = None
            if index == 0:
                ev = (Event(PROGRESS, node=0, host=host, progress=prog) if prog is not None
                      else b.output_event(output_at, 0, host, line))
            elif prog is not None and b.witness_progress(prog):
                ev = Event(PROGRESS, node=index, host=host, progress=prog)
            if ev is not None:
                with st.lock:
                    if not st.cancelled:
                        st.events.append(ev)
            if st.stop.is_set():
                break

    def poll(self, ref: AttemptRef) -> Observation:
        self.contact.check(self.api_client)      # an API outage is EngineUnavailable, not a quiet run
        st = self._state(ref)
        with st.lock:
            seen = st.node_watch.nodes() if st.node_watch else []
            if not st.node_access or any(node_ready(n)[0] == "False" for n in seen):
                # a deletion no kubelet confirms, or a not-ready node outlasting the pods'
                # toleration (classify.not_ready_tolerated), changes nothing on the pod: time tells
                for p in list(st.pods.values()):
                    self._evaluate(st, p)
            unseen = (st.job_absent and not st.pods and not st.gone
                      and st.resolved is None and not st.cancelled and st.watchers[2].synced.is_set())
        if unseen:
            self._resolve_gone(st)
        self._read_failed_create(st)
        self._read_queue(st)
        with st.lock:
            events, st.events = st.events, []
            nodes = (st.resolved if st.resolved is not None else
                     node_statuses(list(st.pods.values()), st.completions, st.lost, st.gone))
        return Observation(events, nodes)

    def _read_failed_create(self, st: _AttemptState) -> None:
        """While the Job has fewer pods than nodes, say why from its Events (classify.failed_create):
        a pod the API server refused is never created, so no pod can tell. Rate-limited; a user who
        may not list Events (403) waits without the reason (restart.pending_timeout needs one)."""
        ApiException = sdk.api_exception()
        with st.lock:
            # a suspended Job (queued by Kueue, or a graceful cancel) creates no pods on purpose
            short = (st.job is not None and not job_finished(st.job) and not st.cancelled and st.completions
                     and not (st.job.get("spec") or {}).get("suspend")
                     and len(newest_per_index(list(st.pods.values()))) < st.completions)
            if not st._due("events", short):
                return
        ns, name = st.ref.namespace or self.namespace, st.ref.attempt_name
        try:
            items = call_json(self._core().list_namespaced_event, namespace=ns,
                              field_selector=f"involvedObject.kind=Job,involvedObject.name={name}",
                              what=f"list the Events of Job {ns}/{name}")["items"]
        except ApiException:
            return
        why = failed_create(items)
        if why is not None:
            with st.lock:
                self._emit(st, [(("waiting", f"create|{why}"), Event(NODE_WAITING, reason="FailedCreate",
                                                                     message=why))])

    def _read_queue(self, st: _AttemptState) -> None:
        """While Kueue holds the Job (suspended, a LocalQueue label, no pod yet), say why from its
        Workload (classify.kueue_wait): a full queue waits as long as it takes (NODE_QUEUED); a
        queue that does not exist or is stopped, or no Kueue at all, needs a person (NODE_WAITING:
        restart.pending_timeout applies). Rate-limited like the FailedCreate read. Workloads are
        readable with Kueue's batch-user role, not the built-in edit role: without it (403) the
        wait is said without Kueue's reason."""
        ApiException = sdk.api_exception()
        with st.lock:
            job = st.job or {}
            meta = job.get("metadata") or {}
            queue = (meta.get("labels") or {}).get(L.KUEUE_QUEUE)
            held = (queue and not job_finished(job) and not st.cancelled and not st.pods
                    and (job.get("spec") or {}).get("suspend"))
            if not st._due("queue", held):
                return
        ns = st.ref.namespace or self.namespace
        version = self._kueue_version()
        if version is None:
            wait: tuple[bool, str, str] | None = (
                True, "NoKueue", f"the Job is queued for Kueue LocalQueue {queue!r}, but this cluster serves no "
                f"{L.KUEUE_GROUP} API (Kueue is not installed): nothing will admit it; drop kubernetes.queue")
        else:
            try:
                items = call_json(self._custom().list_namespaced_custom_object, L.KUEUE_GROUP, version, ns,
                                  "workloads", label_selector=f"{L.KUEUE_JOB_UID}={meta.get('uid')}",
                                  what=f"list the Kueue Workloads of Job {ns}/{meta.get('name')}")["items"]
                wait = kueue_wait(items)
            except ApiException as exc:
                if sdk.api_status(exc) != 403:
                    return
                wait = (False, "", f"LocalQueue {queue!r} holds the Job; why is on its Workload, which this user "
                        f"may not read (get/list on workloads.{L.KUEUE_GROUP}: Kueue's batch-user role)")
        if wait is None:
            return
        needs_person, reason, message = wait
        ev = Event(NODE_WAITING if needs_person else NODE_QUEUED, reason=f"Kueue {reason}".strip(), message=message)
        with st.lock:
            self._emit(st, [(("queued", f"{reason}|{message}"), ev)])

    def _kueue_version(self) -> str | None:
        """The version of the Kueue API the cluster prefers (discovery, readable by every user),
        or None when it serves none; asked once per watcher."""
        if self._kueue_api is None:
            ApiException = sdk.api_exception()
            try:
                groups = call_json(sdk.sdk().ApisApi(self.api_client).get_api_versions,
                                   what="list the API groups").get("groups") or []
            except ApiException:
                return None          # asked again on the next read
            found = next((g for g in groups if g.get("name") == L.KUEUE_GROUP), None)
            self._kueue_api = ((found.get("preferredVersion") or {}).get("version") if found else None,)
        return self._kueue_api[0]

    def _resolve_gone(self, st: _AttemptState) -> None:
        """The attempt has no Job and no pod, and this watcher never saw them: the
        TTL-after-finished controller removed a finished Job (with its pods) while nobody
        watched, or someone deleted it. The Job controller's own Event on the Job says how it
        ended while the API server keeps Events (--event-ttl, 1 h by default); else the end is
        unknown and reported as a loss (a watcher with --auto-resume resumes from the newest
        checkpoint)."""
        ApiException = sdk.api_exception()
        ns, name = st.ref.namespace or self.namespace, st.ref.attempt_name
        with st.lock:
            seen = job_finished(st.job)       # seen finished, then deleted before its pods were listed
            cond: Obj = next((c for c in ((st.job or {}).get("status") or {}).get("conditions") or []
                         if JOB_END_CONDITIONS.get(c.get("type") or "") == seen), {})
        end: tuple[str, str, str] | None = (seen, cond.get("reason") or "", cond.get("message") or "") if seen else None
        if end is None:
            try:
                items = call_json(self._core().list_namespaced_event, namespace=ns,
                                  field_selector=f"involvedObject.kind=Job,involvedObject.name={name}",
                                  what=f"list the Events of Job {ns}/{name}")["items"]
            except ApiException:
                items = []          # Events not readable here (403): the end stays unknown
            end = job_end_event(items)
        n = max(st.completions, 1)
        gone = "its Job and pods are gone (ttlSecondsAfterFinished, or deleted outside wmctl)"
        with st.lock:
            if end is not None and end[0] == "Complete":
                st.resolved = [NodeStatus(i, SUCCEEDED, None, 0, "Completed") for i in range(n)]
                st.events.append(Event(NODE_EXITED, node=0, exit_code=0, reason="Completed",
                                       message=f"the Job completed; {gone}"))
                return
            why = (f"the Job failed ({end[1]}: {end[2]}) and {gone} before a watcher saw why" if end
                   else f"{gone}, and no Event says how it ended")
            st.resolved = [NodeStatus(i, LOST, None, None, "JobGone") for i in range(n)]
            st.events.append(Event(NODE_LOST, reason="JobGone", message=why))

    def watch_stats(self, ref: AttemptRef) -> dict[str, dict[str, int]]:
        st = self._state(ref)
        return {w.name: {"relists": w.relists, "reconnects": w.reconnects} for w in st.watchers}

    # --- logs / attempts ---------------------------------------------------------------------
    def _pod_for(self, ref: AttemptRef, node: int) -> Obj:

        ns = ref.namespace or self.namespace
        items = self._attempt_pods(ref)
        pods = [p for p in items if pod_index(p) == node]
        if not pods:
            raise RunNotFound(f"no pod for node {node} of {ref.attempt_name} in namespace {ns}",
                              hint="check the node index (0-based) and the attempt (wmctl status)")
        return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def logs(self, ref: AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        ApiException = sdk.api_exception()
        iter_resp_lines = sdk.iter_resp_lines
        query = query or b.LogQuery()

        archived = open_store(ref.run).archived_log(ref.attempt, node)
        if archived is not None:   # torn down by wmctl: the pods are gone or going
            yield from b.kept_lines(archived, query, what=ref.attempt_name)
            return
        pod = self._pod_for(ref, node)
        kwargs: dict[str, Any] = {"follow": follow, "_preload_content": False}
        if not follow:
            kwargs["_request_timeout"] = request_timeout()
        # PodLogOptions (k8s.io/api/core/v1 types.go): tailLines, sinceSeconds (>= 1), timestamps
        if query.tail is not None:
            kwargs["tail_lines"] = query.tail
        if query.since is not None:
            kwargs["since_seconds"] = max(1, math.ceil(time.time() - query.since))
        if query.timestamps:
            kwargs["timestamps"] = True
        container = self._shape(ref)[1] or pod["spec"]["containers"][0]["name"]
        kwargs["container"] = container
        try:
            resp = self._core().read_namespaced_pod_log(pod["metadata"]["name"],
                                                        pod["metadata"]["namespace"], **kwargs)
        except ApiException as exc:
            raise BackendError(f"cannot read logs of node {node} ({pod['metadata']['name']}): "
                               f"{_reason(exc)}") from None
        try:
            yield from iter_resp_lines(resp)
        finally:
            close_stream(resp)      # a caller that stops reading leaves the stream mid-way

    def attempts(self, run: str) -> list[AttemptRef]:

        ns = self.namespace
        jobs = call_json(self._batch().list_namespaced_job, namespace=ns,
                         label_selector=L.selector(run),
                         what=f"list jobs of run {run}")["items"]
        refs = []
        for j in jobs:
            raw = ((j.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL, "")
            if raw.isdigit():
                ref = AttemptRef(self.name, run, int(raw), ns)
                self._learn_shape(ref, j)
                refs.append(ref)
        return sorted(refs, key=lambda r: r.attempt)

    # --- cancel --------------------------------------------------------------------------------
    def release(self, ref: AttemptRef) -> None:
        """A finished Job stays for `kubectl` until ttlSecondsAfterFinished (the spec's
        kubernetes.ttl_seconds_after_finished) lets the cluster remove it, its pods and (owned by
        it) its Service and PodGroup. Its logs go with the pods: keep each node's tail in the
        run folder now, so `wmctl logs` still works after the TTL."""
        self._archive_logs(ref)

    def note_cancel(self, ref: AttemptRef, intent: dict[str, Any]) -> None:
        """Annotate the attempt's Job with the cancel intent (a merge patch on metadata only), so
        a watcher elsewhere, sharing no run folder with this machine, reads it from the cluster
        and never resubmits. Best effort: a Job already gone, or a patch this user may not make,
        leaves the teardown to say what happened."""
        ApiException = sdk.api_exception()
        ns = ref.namespace or self.namespace
        body = {"metadata": {"annotations": {L.CANCEL_REQUESTED: json.dumps(intent, sort_keys=True)}}}
        try:
            call_json(self._batch().patch_namespaced_job, ref.attempt_name, ns, body,
                      what=f"annotate Job {ns}/{ref.attempt_name} with the cancel intent")
        except ApiException:
            pass

    def cancel(self, ref: AttemptRef, graceful: bool = False) -> None:
        """Keep each node's log tail, then delete the Job (Foreground: its pods go first), the
        Service and any PodGroup, and force-delete pods on lost nodes (their kubelet can never
        confirm a graceful delete).

        Best effort per step: a step answered 404 is already done; 403 or 405 (RBAC grants less,
        a kind not served) is noted (``teardown_notes``) and the remaining steps still run. Only
        a Job that could not be deleted fails the teardown, after every other step was tried:
        its pods would keep running beside the next attempt."""
        ApiException = sdk.api_exception()

        ns = ref.namespace or self.namespace
        name = ref.attempt_name
        key = (ref.run, ref.attempt, ns)
        notes: list[str] = []
        if graceful:
            # Before the attempt is marked cancelled here: its SIGTERM checkpoint is news.
            notes += self._stop_gracefully(ref, ns, name)
        with self._lock:
            st = self._states.get(key)
        if st is not None:
            with st.lock:
                if not st.cancelled:
                    st.cancelled = True
                    st.events.append(Event(CANCELLED, message=f"{name} cancelled"))
        core, batch = self._core(), self._batch()
        fatal: list[str] = []

        def step(what: str, fn, *args, essential: bool = False, **kw) -> Any:
            try:
                return call_json(fn, *args, what=what, **kw)
            except ApiException as exc:
                if exc.status == 404:
                    return None               # already gone: that step is done
                line = f"cannot {what}: {exc.status} {_reason(exc)}"
                (fatal if essential or exc.status not in (403, 405) else notes).append(line)
            except EngineUnavailable:
                raise                         # no API at all: no later step could run either
            except BackendError as exc:       # transient failures outlasted call()'s retries
                fatal.append(exc.message)
            return None

        self._archive_logs(ref)
        step(f"delete Job {ns}/{name}", batch.delete_namespaced_job, name, ns,
             propagation_policy="Foreground", essential=True)
        step(f"delete Service {ns}/{name}", core.delete_namespaced_service, name, ns)
        group = self._gangs.get(key)
        if group:      # only a spec that asked for Volcano has one: without its CRD the call is a 403
            podgroup = KINDS["PodGroup"]
            api_group, version = (podgroup.api_version or "").split("/")
            step(f"delete PodGroup {ns}/{group}", self._custom().delete_namespaced_custom_object,
                 api_group, version, ns, podgroup.plural, group)
        # pods: graceful on healthy nodes; grace 0 where no kubelet will ever confirm
        listed = step(f"list pods of {name}", core.list_namespaced_pod, namespace=ns,
                      label_selector=attempt_selector(ref.run, ref.attempt))
        pods = (listed or {}).get("items") or []
        lost = self._on_lost_nodes(pods)
        for p in pods:
            pname = p["metadata"]["name"]
            if p["metadata"]["uid"] in lost and self.force_delete_lost:
                step(f"force-delete pod {ns}/{pname}", core.delete_namespaced_pod, pname, ns,
                     grace_period_seconds=0)
            elif not p["metadata"].get("deletionTimestamp"):
                step(f"delete pod {ns}/{pname}", core.delete_namespaced_pod, pname, ns)
        notes += self._await_pods_gone(ref, ns, [] if fatal else pods, step)   # nothing listed: nothing to wait for
        with self._lock:
            self._notes[key] = notes
        if st is not None:
            self._stop_state(st, join=False)
        if fatal:
            raise BackendError(f"teardown of {ns}/{name} is incomplete: " + "; ".join(fatal + notes),
                               hint=f"grant the verbs of {_rbac_manifest()} (shipped with wmctl), or delete it by "
                               f"hand: kubectl -n {ns} delete job {name} --cascade=foreground")

    def _await_pods_gone(self, ref: AttemptRef, ns: str, pods: list[Obj], step) -> list[str]:
        """Wait until no pod of the attempt is left, so the next attempt's pods never start beside
        (or queue behind) this one's: a pod 0 pending behind its predecessor's terminating pod is
        a late rendezvous host, and two attempts' ranks must never share a node's devices. Pods
        found on lost nodes meanwhile are force-deleted (no kubelet will confirm them). Bounded
        by the pods' grace period plus a margin; past it, a note says what was left."""
        ApiException = sdk.api_exception()
        grace = max([float((p.get("spec") or {}).get("terminationGracePeriodSeconds") or 30) for p in pods],
                    default=0.0)
        deadline = time.monotonic() + grace + GRACEFUL_MARGIN_S
        selector = attempt_selector(ref.run, ref.attempt)
        forced: set[str] = set()
        while pods:
            try:
                pods = call_json(self._core().list_namespaced_pod, namespace=ns, label_selector=selector,
                                 what=f"list pods of {ref.attempt_name}")["items"]
            except ApiException as exc:
                return [f"cannot see the pods of {ref.attempt_name} go: {exc.status} {_reason(exc)}"]
            if not pods:
                return []
            if self.force_delete_lost:
                for p in pods:
                    meta = p["metadata"]
                    if meta["uid"] not in forced and meta["uid"] in self._on_lost_nodes([p]):
                        forced.add(meta["uid"])
                        step(f"force-delete pod {ns}/{meta['name']}", self._core().delete_namespaced_pod,
                             meta["name"], ns, grace_period_seconds=0)
            if time.monotonic() >= deadline:
                names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
                return [f"pods of {ref.attempt_name} still terminating {grace + GRACEFUL_MARGIN_S:.0f} s after "
                        f"their deletion ({names}): the next attempt may start beside them"]
            time.sleep(GONE_POLL_S)
        return []

    def cut_grace(self, ref: AttemptRef, dead_hosts: list[str]) -> None:
        """A peer is known dead: delete the attempt's pods before the Job's own teardown, those on
        ``dead_hosts`` with grace 0 (no kubelet there will confirm, and the Job's pods must not
        hold the next attempt's place), the survivors with DEAD_PEER_GRACE_S instead of
        kubernetes.termination_grace_period (90 s by default): their SIGTERM checkpoint needs the
        dead peer too. A pod already terminating takes the shorter grace (the API server
        shortens a pending deletion: staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete).
        Best effort: cancel() follows and reports what is left."""
        ApiException = sdk.api_exception()
        ns = ref.namespace or self.namespace
        core = self._core()
        try:
            pods = self._attempt_pods(ref)
        except (ApiException, BackendError):
            return
        self._archive_logs(ref)          # the survivors' last words, before they go
        for p in pods:
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            grace = 0 if (p.get("spec") or {}).get("nodeName") in dead_hosts else DEAD_PEER_GRACE_S
            try:
                call_json(core.delete_namespaced_pod, p["metadata"]["name"], ns, grace_period_seconds=grace,
                          what=f"delete pod {ns}/{p['metadata']['name']}")
            except (ApiException, BackendError):
                pass

    def _stop_gracefully(self, ref: AttemptRef, ns: str, name: str) -> list[str]:
        """``cancel --graceful``: suspend the Job. The Job controller then deletes its active pods
        with their termination grace period and creates none (KEP-2232; job_controller.go
        manageJob on a suspended Job), each kubelet sends SIGTERM, and the job writes its SIGTERM
        checkpoint and exits. Wait for every pod to end, at most the grace period plus a margin;
        the teardown then removes what is left. What could not be done is returned as notes (a
        user who may not patch Jobs gets the plain teardown, itself a graceful pod delete)."""
        ApiException = sdk.api_exception()
        try:
            job = call_json(self._batch().patch_namespaced_job, name, ns, {"spec": {"suspend": True}},
                            what=f"suspend Job {ns}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return []
            return [f"cannot suspend Job {ns}/{name} for a graceful stop: {exc.status} {_reason(exc)}; "
                    "its pods were deleted with their grace period instead, without waiting for them"]
        grace = float(((job.get("spec") or {}).get("template") or {}).get("spec", {})
                      .get("terminationGracePeriodSeconds") or 30)
        deadline = time.monotonic() + grace + GRACEFUL_MARGIN_S
        selector = attempt_selector(ref.run, ref.attempt)
        while time.monotonic() < deadline:
            try:
                pods = call_json(self._core().list_namespaced_pod, namespace=ns, label_selector=selector,
                                 what=f"list pods of {name}")["items"]
            except ApiException as exc:
                return [f"cannot watch the pods of {name} end: {exc.status} {_reason(exc)}"]
            if all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods):
                return []
            time.sleep(GRACEFUL_POLL_S)
        return [f"pods of {name} still running {grace + GRACEFUL_MARGIN_S:.0f} s after SIGTERM; deleted"]

    def teardown_notes(self, ref: AttemptRef) -> list[str]:
        with self._lock:
            return list(self._notes.get((ref.run, ref.attempt, ref.namespace or self.namespace), []))

    def _on_lost_nodes(self, pods: list[Obj]) -> set[str]:
        """Uids of the pods whose node is lost: from the Nodes when this user may list them, else
        from the pods' own evidence (classify.pod_loss_evidence)."""
        ApiException = sdk.api_exception()
        nodes: dict[str, Obj] | None = None
        try:
            nodes = self._read_nodes({p["spec"].get("nodeName") for p in pods} - {None, ""})
        except ApiException as exc:
            if exc.status != 403:
                raise BackendError(f"cannot list nodes: {exc.status} {_reason(exc)}") from None
        now = time.time()
        out = set()
        for p in pods:
            host = p["spec"].get("nodeName")
            if not host:
                continue
            if (not node_healthy(nodes.get(host)) if nodes is not None
                    else pod_loss_evidence(p, now) is not None):
                out.add(p["metadata"]["uid"])
        return out

    def _read_nodes(self, names: set[str]) -> dict[str, Obj]:
        """The named Nodes that exist: each read by name when they are few, else one list in
        pages (limit/continue), so a teardown never pulls a whole cluster's Nodes at once."""
        ApiException = sdk.api_exception()
        core = self._core()
        out: dict[str, Obj] = {}
        if len(names) <= PER_NAME_MAX:
            for name in sorted(names):
                try:
                    out[name] = call_json(core.read_node, name, what=f"read node {name}")
                except ApiException as exc:
                    if exc.status != 404:          # 404: the node is gone, which is the answer
                        raise
            return out
        token, restarts = None, 0
        while True:
            kw: dict[str, Any] = {"limit": PAGE_SIZE, **({"_continue": token} if token else {})}
            try:
                body = call_json(core.list_node, what="list nodes", **kw)
            except ApiException as exc:
                if exc.status != 410 or not token or restarts >= 3:
                    raise
                out, token, restarts = {}, None, restarts + 1    # the token expired: from the start
                continue
            out.update((n["metadata"]["name"], trim_node(n)) for n in body.get("items") or []
                       if n["metadata"]["name"] in names)
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return out

    def _attempt_pods(self, ref: AttemptRef) -> list[Obj]:
        """Every pod of the attempt, as the API lists them now (raises its errors)."""
        return list(call_json(self._core().list_namespaced_pod, namespace=ref.namespace or self.namespace,
                              label_selector=attempt_selector(ref.run, ref.attempt),
                              what=f"list pods of {ref.attempt_name}")["items"])

    def _archive_logs(self, ref: AttemptRef) -> None:
        """Copy each node's log tail into the run folder before anything is deleted: a failed
        pod is removed the moment the Job's deletion reaches it (terminal pods need no grace),
        and its log with it. The reads run in parallel, bounded by ARCHIVE_TIMEOUT_S. Best
        effort: whatever fails here must not keep the attempt from being torn down."""
        ApiException = sdk.api_exception()
        try:
            pods = self._attempt_pods(ref)
            lost = self._on_lost_nodes(pods)
        except (ApiException, BackendError):
            return          # teardown reports these itself when it lists the same objects
        # no kubelet serves the log of a pod on a lost node: asking would only wait
        readable = [p for p in pods if _container_started(p) and p["metadata"]["uid"] not in lost]
        newest = newest_per_index(readable)
        readers = [threading.Thread(target=self._archive_log, args=(ref, i, p), daemon=True,
                                    name=f"wmctl-archive-{p['metadata']['name']}")
                   for i, p in newest.items()]
        for t in readers:
            t.start()
        deadline = time.monotonic() + ARCHIVE_TIMEOUT_S
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))

    def _archive_log(self, ref: AttemptRef, node: int, pod: Obj) -> None:
        ApiException = sdk.api_exception()

        container = self._shape(ref)[1] or pod["spec"]["containers"][0]["name"]
        try:
            resp = self._core().read_namespaced_pod_log(
                pod["metadata"]["name"], pod["metadata"]["namespace"], container=container,
                tail_lines=b.ARCHIVE_TAIL_LINES, _preload_content=False,
                _request_timeout=ARCHIVE_TIMEOUT_S)
            try:
                data = resp.read()
            finally:
                resp.release_conn()
        except ApiException:
            return              # the pod went first (404) or its container never started (400)
        except sdk.connection_errors():
            return              # the kubelet did not answer in time: nothing to keep
        open_store(ref.run).archive_log(ref.attempt, node, data)

    def _stop_state(self, st: _AttemptState, join: bool) -> None:
        st.stop.set()
        for w in st.watchers:
            w.stop(join=join)
        with st.lock:
            resps = list(st.log_resps.values())
        for resp in resps:
            _shutdown_resp(resp)

    # --- the run's own watcher in the cluster (incluster.py) ---------------------------------
    @classmethod
    def watcher_problems(cls, spec: JobSpec) -> list[tuple[str, str]]:
        if not spec.kubernetes.watcher_image:
            return [("kubernetes.watcher_image", "--in-cluster runs the watcher in a pod: name an image with wmctl "
                     "installed (pip install wmctl), e.g. registry.example.com/wmctl:0.9")]
        return []

    def store_environment(self, spec: JobSpec) -> dict[str, str]:
        # The watcher pod reads its run in the job's namespace (incluster.watcher_manifest), on the
        # cluster the job runs on: not wherever this machine's current context points.
        from .runstore import ENV_CONTEXT, ENV_NAMESPACE

        env = {ENV_NAMESPACE: spec.kubernetes.namespace}
        if self._context:
            env[ENV_CONTEXT] = self._context
        return env

    def start_watcher(self, run: str, spec: JobSpec) -> str:
        from . import incluster

        k = spec.kubernetes
        if not k.watcher_image:      # api.py asks watcher_problems first; a direct caller hears the same
            raise SpecError(self.watcher_problems(spec))
        manifest = incluster.watcher_manifest(run, k.namespace, k.watcher_image, k.watcher_service_account,
                                              k.image_pull_secrets)
        incluster.start(self.api_client, manifest, run)
        name = manifest["metadata"]["name"]
        return (f"watcher Deployment {k.namespace}/{name} supervises {run} in the cluster "
                f"(`kubectl logs -n {k.namespace} deploy/{name} -f`)")

    def retire_watcher(self, run: str) -> str | None:
        from . import incluster

        return incluster.retire(self.api_client, run, self.namespace)

    def close(self) -> None:
        """Stop every background watcher (the backend object is done)."""
        with self._lock:
            states = list(self._states.values())
        for st in states:
            self._stop_state(st, join=True)
        for st in states:
            with st.lock:
                threads = list(st.log_threads.values())
            for t in threads:
                t.join(timeout=5)


def _shutdown_resp(resp: Any) -> None:
    """Unblock a thread reading a streaming response (as kubernetes.watch.Watch.stop does)."""
    import socket

    if resp is None:
        return
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _container_started(pod: Obj) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


def _container_terminated(pod: Obj) -> bool:
    css = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(css) and all("terminated" in (cs.get("state") or {}) for cs in css)


def _reason(exc: Any) -> str:
    """The message of a Status body, else the HTTP reason."""
    try:
        body = json.loads(getattr(exc, "body", "") or "{}")
        return body.get("message") or str(getattr(exc, "reason", ""))
    except ValueError:
        return str(getattr(exc, "reason", ""))


def _rbac_manifest() -> str:
    from ...resources import rbac_manifest

    return rbac_manifest()
