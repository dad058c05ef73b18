"""Kubernetes backend: an attempt is an Indexed Job plus a headless Service.

This is the Backend face; the work is done in rooms, one job each:

- cluster.py: the client, an attempt's namespace, the listings rooms share, API errors in our words;
- apply.py: create/adopt/own/patch/delete through the kinds table (kinds.py);
- record.py: the one per-attempt record (shape, teardown notes, what the watches saw);
- observe.py: list+watch threads over Pods, the Job and Nodes, and ``poll``;
- podlogs.py: index 0's log (global rank 0: the job's progress, or its output as a heartbeat) and,
  with two nodes or more, index 1's as the witness of index 0's node (base.witness_progress);
  ``wmctl logs``; the log tails kept before a teardown;
- teardown.py: cancel deletes with cascading (Foreground) and force-deletes pods left on lost
  nodes so the next attempt is not blocked; graceful stops; cut_grace.

The Kubernetes client comes through ``adaptors.kubernetes``, loaded on first use, so the CLI's
--help and dry runs never load it. The rooms load when a backend object is made: a dry run
(``render``, ``check``, ``document``, all class-level) needs only render.py and check.py.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any, Iterator

from ...errors import BackendError, CredentialsRejected, SpecError
from ...plan import AttemptContext, HostFacts, Plan
from ...serialize import dump
from ...spec import JobSpec
from ...vendors import VendorProfile
from .. import base as b
from ..base import AttemptRef, Observation
from .check import pod_problems, volume_problems
from .client import Contact, call_json
from .cluster import Cluster, api_error
from .render import KubernetesRequest, render_kubernetes

if TYPE_CHECKING:
    from .apply import Applier
    from .observe import Observer
    from .podlogs import PodLogs
    from .record import Attempt, Key
    from .teardown import Teardown

__all__ = ["KubernetesBackend"]


class _Rooms:
    """The rooms that reach the cluster, sharing one ``Cluster``. They load (and with them the
    watches, the log followers and the failure classifier) when a backend object first needs
    one: a dry run, which only renders, loads none of them."""

    def __init__(self, cluster: Cluster, watch_timeout: int, force_delete_lost: bool,
                 log_read_timeout: float | None):
        from .apply import Applier
        from .observe import Observer
        from .podlogs import LOG_READ_TIMEOUT_S, PodLogs
        from .rounds import Rounds
        from .teardown import Teardown

        self.apply = Applier(cluster)
        self.podlogs = PodLogs(cluster, LOG_READ_TIMEOUT_S if log_read_timeout is None else log_read_timeout)
        self.observe = Observer(cluster, self.podlogs, watch_timeout)
        self.teardown = Teardown(cluster, self.apply, self.podlogs, force_delete_lost)
        self.rounds = Rounds(cluster)


class KubernetesBackend(b.Backend[KubernetesRequest]):
    name = "kubernetes"
    places_nodes = True      # the scheduler honours a node anti-affinity
    remembers_exclusions = True   # nodes are machines: a lost one is avoided by the next runs too
    graceful_cancel = True   # suspend the Job: SIGTERM with the pods' grace period, then the teardown
    run_store = "orchestrator.backends.kubernetes.runstore"   # ConfigMaps: watchers on any machine, or in a pod
    cluster_watcher = True   # incluster.py: a one-replica Deployment running `wmctl watch`
    namespaced = True
    resolves_gone = True     # observe.py _resolve_gone: the Job it saw finish, or the Job controller's Event
    # pods/log's PodLogOptions: tailLines, sinceSeconds, timestamps (the kubelet keeps each line's time)
    log_options = frozenset({"tail", "since", "timestamps"})
    # spare pods wait beside the nodes' (spares.py: an Indexed Job of nodes + spares, each pod a
    # keeper; rounds.py: an in-place recovery fences the lost pod and writes the next round)
    spares = True
    replenishes_spares = True    # an elastic Indexed Job grows by one index: a new spare pod (rounds.add_spare)

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

    def placeable_hosts(self, spec: JobSpec) -> frozenset[str] | None:
        """The Ready, uncordoned nodes that match kubernetes.node_selector (taints and free room are
        not weighed: a cap, not a placement); None when the nodes cannot be read (RBAC)."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(spec.kubernetes.node_selector.items()))
        try:
            items = call_json(self.cluster.core().list_node, label_selector=selector or None,
                              what="list nodes")["items"]
        except (api_error(), BackendError):
            return None
        return frozenset(n["metadata"]["name"] for n in items if not (n.get("spec") or {}).get("unschedulable")
                         and any(c.get("type") == "Ready" and c.get("status") == "True"
                                 for c in (n.get("status") or {}).get("conditions") or []))

    def cluster_key(self) -> str | None:
        """The API server's address: the given client's, else the kubeconfig context's cluster
        server (read without the SDK), else the in-cluster service's."""
        given = self.cluster._api_client
        if given is not None:
            host = getattr(getattr(given, "configuration", None), "host", None)
            return host if isinstance(host, str) and host else None
        from ...adaptors.kubernetes import kubeconfig_server

        server = kubeconfig_server(self.cluster.context, self.cluster.kubeconfig)
        if server is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{port}"
        return server

    def __init__(self, api_client: Any = None, *, context: str | None = None,
                 kubeconfig: str | None = None, in_cluster: bool | None = None,
                 namespace: str = "default", watch_timeout: int = 30,
                 force_delete_lost: bool = True, contact: Contact | None = None,
                 log_read_timeout: float | None = None):
        self.cluster = Cluster(api_client, context=context, kubeconfig=kubeconfig, in_cluster=in_cluster,
                               namespace=namespace)
        self.contact = contact or Contact()          # poll() notices an API outage (client.Contact)
        self._settings = (watch_timeout, force_delete_lost, log_read_timeout)
        self._made: _Rooms | None = None             # the rooms, made on first use: a dry run makes none
        self._rooms_lock = threading.Lock()
        self._attempts: dict[Key, Attempt] = {}      # (run, attempt, namespace) -> its one record
        self._lock = threading.Lock()

    def _rooms(self) -> _Rooms:
        with self._rooms_lock:
            if self._made is None:
                watch_timeout, force_delete_lost, log_read_timeout = self._settings
                self._made = _Rooms(self.cluster, watch_timeout, force_delete_lost, log_read_timeout)
            return self._made

    @property
    def _apply(self) -> Applier:
        return self._rooms().apply

    @property
    def _podlogs(self) -> PodLogs:
        return self._rooms().podlogs

    @property
    def _observe(self) -> Observer:
        return self._rooms().observe

    @property
    def _teardown(self) -> Teardown:
        return self._rooms().teardown

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def api_client(self) -> Any:
        return self.cluster.api_client

    # --- the per-attempt record --------------------------------------------------------------
    def _record(self, ref: AttemptRef) -> Attempt:
        """The attempt's record, made if new (nothing is watched yet)."""
        from .record import Attempt

        key = (ref.run, ref.attempt, self.cluster.ns(ref))
        with self._lock:
            found = self._attempts.get(key)
            if found is None:
                found = self._attempts[key] = Attempt(ref)
            return found

    def _state(self, ref: AttemptRef) -> Attempt:
        """The attempt's record, its watches and log followers started (once)."""
        st = self._record(ref)
        with self._lock:
            if not st.watching:
                self._observe.start(st)
            return st

    # --- submit --------------------------------------------------------------------------
    def submit(self, plan: Plan[KubernetesRequest]) -> AttemptRef:
        from .apply import plan_manifests
        from .cluster import ATTEMPT_LABEL, RUN_LABEL

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
        try:
            self._apply.create_all(manifests, namespace, run, attempt)
        except CredentialsRejected as exc:
            raise self.cluster.named(exc) from None
        ref = AttemptRef(self.name, run, attempt, namespace)
        self._record(ref).learn(job)
        self._state(ref)          # start watching at once so nothing is missed
        return ref

    # --- observation -----------------------------------------------------------------------
    def poll(self, ref: AttemptRef) -> Observation:
        try:
            self.contact.check(self.api_client)      # an API outage is EngineUnavailable, not a quiet run
        except CredentialsRejected as exc:           # lost contact too: the run is not hung
            raise self.cluster.named(exc) from None
        st = self._state(ref)
        if st.spares and st.active is None:
            self._rooms().rounds.learn(st)            # a watcher that did not write the rounds reads them
        return self._observe.poll(st)

    # --- spare nodes (spares.py, rounds.py) ---------------------------------------------------
    def recover_in_place(self, ref: AttemptRef, node: int) -> b.InPlaceRecovery | None:
        """Lost slot ``node`` replaced by a warm spare pod: its pod deleted with grace 0 (fenced
        off), the next round written to the attempt's rounds ConfigMap; every keeper named in it
        restarts its torchrun (runtime/keeper.py). No Job or pod is created. None when no spare
        pod is running (none left, or a new one still pulling its image)."""
        st = self._state(ref)
        if not st.spares:
            return None
        if st.active is None:
            self._rooms().rounds.learn(st)
        return self._rooms().rounds.recover(st, node)

    def replenish_spare(self, ref: AttemptRef, lost: int) -> int | None:
        """A new spare: the Job's completions and parallelism raised together by one (an elastic
        Indexed Job), so the Job controller creates the new index's pod; it is scheduled, pulls
        its image and starts its keeper in the background, and is a spare once it runs. Its
        slot, or None when the Job cannot grow (RBAC, a cluster before elastic Indexed Jobs)."""
        st = self._state(ref)
        return self._rooms().rounds.add_spare(st) if st.spares else None

    def watch_stats(self, ref: AttemptRef) -> dict[str, dict[str, int]]:
        st = self._state(ref)
        return {w.name: {"relists": w.relists, "reconnects": w.reconnects} for w in st.watchers}

    # --- logs / attempts ---------------------------------------------------------------------
    def logs(self, ref: AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        query = query or b.LogQuery()
        kept = b.kept_log(ref, node, query)
        if kept is not None:   # torn down by wmctl: the pods are gone or going
            yield from kept
            return
        yield from self._podlogs.lines(ref, node, follow, query, self._record(ref).container)

    def attempts(self, run: str) -> list[AttemptRef]:
        from ... import labels as L
        from .client import call_json
        from .cluster import ATTEMPT_LABEL

        ns = self.namespace
        jobs = call_json(self.cluster.batch().list_namespaced_job, namespace=ns,
                         label_selector=L.selector(run),
                         what=f"list jobs of run {run}")["items"]
        refs = []
        for j in jobs:
            raw = ((j.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL, "")
            if raw.isdigit():
                ref = AttemptRef(self.name, run, int(raw), ns)
                self._record(ref).learn(j)
                refs.append(ref)
        return sorted(refs, key=lambda r: r.attempt)

    # --- cancel --------------------------------------------------------------------------------
    def release(self, ref: AttemptRef) -> None:
        """A finished Job stays for `kubectl` until ttlSecondsAfterFinished (the spec's
        kubernetes.ttl_seconds_after_finished) lets the cluster remove it, its pods and (owned by
        it) its Service and PodGroup. Its logs go with the pods: keep each node's tail in the
        run folder now, so `wmctl logs` still works after the TTL. With spare nodes the rounds are
        closed first: the idle spares' keepers end, so the Job can finish."""
        rec = self._record(ref)
        if rec.spares:
            self._rooms().rounds.close(ref)
        self._teardown.keep_logs(ref, rec.container)

    def note_cancel(self, ref: AttemptRef, intent: dict[str, Any]) -> None:
        """Annotate the attempt's Job with the cancel intent (a merge patch on metadata only), so
        a watcher elsewhere, sharing no run folder with this machine, reads it from the cluster
        and never resubmits. Best effort: a Job already gone, or a patch this user may not make,
        leaves the teardown to say what happened."""
        from ... import labels as L
        from .client import call_json
        from .cluster import api_error

        ns = self.cluster.ns(ref)
        body = {"metadata": {"annotations": {L.CANCEL_REQUESTED: json.dumps(intent, sort_keys=True)}}}
        try:
            call_json(self.cluster.batch().patch_namespaced_job, ref.attempt_name, ns, body,
                      what=f"annotate Job {ns}/{ref.attempt_name} with the cancel intent")
        except api_error():
            pass

    def cancel(self, ref: AttemptRef, graceful: bool = False) -> None:
        """Keep each node's log tail, then tear the attempt down (teardown.py: the Job with its
        pods, the Service, any PodGroup; pods on lost nodes force-deleted). What could not be
        done and was gone on without is kept for ``teardown_notes``; a Job that could not be
        deleted fails the teardown."""
        rec = self._record(ref)
        notes: list[str] = []
        if graceful:
            # Before the attempt is marked cancelled here: its SIGTERM checkpoint is news.
            notes += self._teardown.stop_gracefully(ref)
        if rec.watching:
            rec.mark_cancelled(f"{ref.attempt_name} cancelled")
        self._teardown.keep_logs(ref, rec.container)
        try:
            notes = self._teardown.remove(ref, rec.gang, notes)
        except CredentialsRejected as exc:
            raise self.cluster.named(exc) from None
        finally:
            with self._lock:
                rec.notes = notes
            if rec.watching:
                self._podlogs.stop(rec, join=False)

    def cut_grace(self, ref: AttemptRef, dead_hosts: list[str]) -> None:
        self._teardown.cut_grace(ref, dead_hosts, self._record(ref).container)

    def teardown_notes(self, ref: AttemptRef) -> list[str]:
        rec = self._record(ref)
        with self._lock:
            return list(rec.notes)

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
        if self.cluster.context:
            env[ENV_CONTEXT] = self.cluster.context
        return env

    def start_watcher(self, run: str, spec: JobSpec) -> str:
        from . import incluster

        k = spec.kubernetes
        if not k.watcher_image:      # api.py asks watcher_problems first; a direct caller hears the same
            raise SpecError(self.watcher_problems(spec))
        manifest = incluster.watcher_manifest(run, k.namespace, k.watcher_image, k.watcher_service_account,
                                              k.image_pull_secrets)
        incluster.start(self.cluster.api_client, manifest, run)
        name = manifest["metadata"]["name"]
        return (f"watcher Deployment {k.namespace}/{name} supervises {run} in the cluster "
                f"(`kubectl logs -n {k.namespace} deploy/{name} -f`)")

    def retire_watcher(self, run: str) -> str | None:
        from . import incluster

        return incluster.retire(self.cluster.api_client, run, self.cluster.namespace)

    def close(self) -> None:
        """Stop every background watcher (the backend object is done)."""
        with self._lock:
            states = [st for st in self._attempts.values() if st.watching]
        for st in states:
            self._podlogs.stop(st, join=True)
        for st in states:
            with st.lock:
                threads = list(st.log_threads.values())
            for t in threads:
                t.join(timeout=5)
