"""Observation: background list+watch threads over an attempt's Pods, its Job and the Nodes its pods
run on (plus the log followers of podlogs.py) turn what they see into events on the attempt's
record; ``poll`` drains them and adds what only a read can tell (the Job controller's FailedCreate,
Kueue's reason for holding the Job, how an attempt found gone ended).
"""

from __future__ import annotations

import json
import time

from ... import labels as L
from ...adaptors import kubernetes as sdk
from ...errors import BackendError
from ..base import (LOST, NODE_EXITED, NODE_LOST, NODE_QUEUED, NODE_STARTED, NODE_WAITING, PROGRESS, SUCCEEDED,
                    WITNESS_EVENTS, CANCELLED, Event, NodeStatus, Observation)
from . import admission
from .classify import (JOB_END_CONDITIONS, device_counts, device_loss, exit_info, failed_create, job_end_event,
                       job_finished, job_suspended_by, kueue_wait, newest_per_index, node_healthy, node_ready,
                       node_statuses, pod_deleted_event, pod_events, pod_index)
from .client import call_json
from .cluster import Cluster, Obj, api_error, attempt_selector
from .nodewatch import NodeWatch
from .podlogs import PodLogs
from .record import Attempt, spares_of
from .rounds import failed_indexes, keeper_exits_due, store_lost
from .spares import STORE_ROLE
from .watch import ResourceWatcher


def _past_member(ev: Event, nodes: list[NodeStatus]) -> bool:
    """A runtime's liveness report (node_silent, node_beat) about a host no slot of the current
    round runs on: an older round's (the replaced node's silence, printed before its keeper
    stopped the runtime and read after the recovery) is no news of this round."""
    host = (ev.progress or {}).get("host") if ev.kind == PROGRESS else None
    return bool(host) and (ev.progress or {}).get("event") in WITNESS_EVENTS and host not in {n.host for n in nodes}


def _store_pod(pod: Obj) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(L.ROLE) == STORE_ROLE


def _graceful_intent(intent: str) -> bool:
    try:
        data = json.loads(intent)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("graceful") is True


class Observer:
    def __init__(self, cluster: Cluster, podlogs: PodLogs, watch_timeout: int = 30):
        self.cluster = cluster
        self.podlogs = podlogs
        self.watch_timeout = watch_timeout
        self._kueue_api: tuple[str | None] | None = None   # (Kueue's preferred version or None), once asked
        self._job_read_for: set[str] = set()        # pods whose deletion had the Job read again (_why_deleted)

    def start(self, st: Attempt) -> None:
        """Start the attempt's watches and log followers (once: under the caller's lock)."""
        st.watching = True
        ns = self.cluster.ns(st.ref)
        core, batch = self.cluster.core(), self.cluster.batch()
        sel = attempt_selector(st.ref.run, st.ref.attempt)
        st.node_watch = NodeWatch(core.list_node, lambda names: self._nodes_changed(st, names),
                                  watch_timeout=self.watch_timeout,
                                  on_forbidden=lambda exc: self._nodes_forbidden(st))
        st.pod_watch = ResourceWatcher(core.list_namespaced_pod, {"namespace": ns, "label_selector": sel},
                                       lambda items: self._pods_sync(st, items),
                                       lambda t, o: self._pod_event(st, t, o), name="pods",
                                       watch_timeout=self.watch_timeout)
        st.watchers = [
            st.node_watch,
            ResourceWatcher(batch.list_namespaced_job,
                            {"namespace": ns, "field_selector": f"metadata.name={st.ref.attempt_name}"},
                            lambda items: self._job_sync(st, items),
                            lambda t, o: self._job_event(st, t, o), name="job",
                            watch_timeout=self.watch_timeout),
            st.pod_watch,
        ]
        for w in st.watchers:
            w.start()
        self.podlogs.start_followers(st)

    # --- what the watches see -----------------------------------------------------------------
    @staticmethod
    def _emit(st: Attempt, facts: list[tuple[tuple[str, str], Event]], terminating: bool = False) -> None:
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

    def _why_deleted(self, st: Attempt, pod: Obj) -> None:
        """A pod deleted by someone and ended, while the Job looks neither finished nor suspended:
        the Job watch is a separate stream, and a suspension (Kueue evicting the Workload) can
        come after its pods' SIGTERM exits. Read the Job once for that pod, so the exit is judged
        with what made the Job controller delete it."""
        uid = pod["metadata"].get("uid") or ""
        job = st.job or {}
        if (not pod["metadata"].get("deletionTimestamp") or uid in self._job_read_for or st.cancelled
                or (job.get("spec") or {}).get("suspend") or job_finished(job) or exit_info(pod)[0] in (None, 0)):
            return
        self._job_read_for.add(uid)
        try:
            st.job = call_json(self.cluster.batch().read_namespaced_job, st.ref.attempt_name, self.cluster.ns(st.ref),
                               what=f"read Job {st.ref.attempt_name}")
        except api_error():
            return

    def _evaluate(self, st: Attempt, pod: Obj) -> None:
        if st.cancelled:
            return
        self._why_deleted(st, pod)
        host = (pod.get("spec") or {}).get("nodeName") or ""
        known, node = st.node_watch.lookup(host) if st.node_watch and host else (False, None)
        suspended = self._suspended(st)
        facts = pod_events(pod, node, nodes_known=known, node_access=st.node_access, now=time.time(),
                           suspended=suspended)
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

    @staticmethod
    def _suspended(st: Attempt) -> str | None:
        """Why the Job was suspended under the attempt by someone else (classify.job_suspended_by)."""
        queue = (((st.job or {}).get("metadata") or {}).get("labels") or {}).get(L.KUEUE_QUEUE)
        return None if st.cancel_seen or st.cancelled else job_suspended_by(st.job, queue)

    def _deleted(self, st: Attempt, pod: Obj) -> None:
        idx = pod_index(pod)
        if idx is not None:
            st.gone[idx] = pod
        if self._suspended(st) is not None:
            return                  # the suspension deleted it (_evaluate said so)
        fact = pod_deleted_event(pod, cancelled=st.cancelled, job_finished=job_finished(st.job),
                                 failure_seen=st.failure_seen, now=time.time())
        if fact:
            self._emit(st, [fact])

    def _store_seen(self, st: Attempt, pod: Obj | None, deleted: bool = False) -> None:
        """Under ``st.lock``: the spare nodes' c10d store pod as the watch sees it; its loss is the
        attempt's (spares.store_lost), said once, unless the attempt is over or being torn down."""
        if pod is not None:
            st.store = pod
            self._scope_nodes(st, [pod])
        pod = st.store
        if pod is None or st.cancelled or job_finished(st.job):
            return
        host = (pod.get("spec") or {}).get("nodeName") or ""
        known, node = st.node_watch.lookup(host) if st.node_watch and host else (False, None)
        why = store_lost(pod, node, deleted=deleted, nodes_known=known and st.node_access)
        if why is not None:
            self._emit(st, [(("lost", pod["metadata"]["uid"]), Event(
                NODE_LOST, node=None, host=host or None, reason="StoreLost", message=why, time=time.time()))])

    def _pods_sync(self, st: Attempt, items: list[Obj]) -> None:
        stores = [p for p in items if _store_pod(p)]
        items = [p for p in items if not _store_pod(p)]
        with st.lock:
            if stores:
                self._store_seen(st, stores[0])
            elif st.store is not None:
                self._store_seen(st, None, deleted=True)
            fresh = {p["metadata"]["uid"]: p for p in items}
            gone = [old for uid, old in st.pods.items() if uid not in fresh]
            st.pods.update(fresh)
            self._scope_nodes(st, items)
            for p in items:                   # exits first: they may explain the deletions
                self._evaluate(st, p)
            for old in gone:                  # deleted while we were not watching
                del st.pods[old["metadata"]["uid"]]
                self._deleted(st, old)

    def _pod_event(self, st: Attempt, etype: str, pod: Obj) -> None:
        if _store_pod(pod):      # the spare nodes' c10d store (spares.py): no node of the attempt
            with st.lock:
                self._store_seen(st, pod, deleted=etype == "DELETED")
            return
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
    def _scope_nodes(st: Attempt, pods: list[Obj]) -> None:
        """Watch the nodes these pods were scheduled to (nodewatch.py: only this attempt's)."""
        if st.node_watch is not None:
            st.node_watch.add({(p.get("spec") or {}).get("nodeName") or "" for p in pods} - {""})

    def _nodes_changed(self, st: Attempt, names: set[str]) -> None:
        with st.lock:
            if st.store is not None and (st.store.get("spec") or {}).get("nodeName") in names:
                self._store_seen(st, None)
            for p in list(st.pods.values()):
                if (p.get("spec") or {}).get("nodeName") in names:
                    self._evaluate(st, p)

    def _nodes_forbidden(self, st: Attempt) -> None:
        """This user may not read Nodes (the built-in edit/admin roles): judge node loss from the
        pods' own conditions from now on (classify.pod_loss_evidence)."""
        with st.lock:
            if st.node_access:
                st.node_access = False
                for p in list(st.pods.values()):
                    self._evaluate(st, p)

    def _job_sync(self, st: Attempt, items: list[Obj]) -> None:
        with st.lock:
            st.job = items[0] if items else st.job
            st.job_absent = not items
            if st.job and not st.completions:
                st.completions = int((st.job.get("spec") or {}).get("completions") or 1)
                st.spares = spares_of(st.job)
                self.podlogs.start_followers(st)

    def _job_event(self, st: Attempt, etype: str, job: Obj) -> None:
        with st.lock:
            if etype != "DELETED":
                st.job = job
                if self._suspended(st) is not None:      # the pods' ends may have come first
                    for p in list(st.pods.values()):
                        self._evaluate(st, p)
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
                st.spares = spares_of(job)
                self.podlogs.start_followers(st)
            elif st.spares and etype != "DELETED":
                grown = int((job.get("spec") or {}).get("completions") or 1)
                if grown > st.completions:       # a spare index added (rounds.add_spare)
                    st.completions = grown
                    self.podlogs.start_followers(st)

    # --- poll ---------------------------------------------------------------------------------
    def poll(self, st: Attempt) -> Observation:
        with st.lock:
            seen = st.node_watch.nodes() if st.node_watch else []
            if not st.node_access or any(node_ready(n)[0] == "False" for n in seen):
                # a deletion no kubelet confirms, or a not-ready node outlasting the pods'
                # toleration (classify.not_ready_tolerated), changes nothing on the pod: time tells
                for p in list(st.pods.values()):
                    self._evaluate(st, p)
            unseen = (st.job_absent and not st.pods and not st.gone and st.resolved is None
                      and not st.cancelled and st.pod_watch is not None and st.pod_watch.synced.is_set())
        if unseen:
            self._resolve_gone(st)
        self._read_failed_create(st)
        self._read_queue(st)
        with st.lock:
            keeper_exits_due(st)       # keepers' words read before the rounds were known (rounds.py)
            events, st.events = st.events, []
            settling = False
            if st.resolved is not None:
                nodes = st.resolved
            else:
                nodes = node_statuses(list(st.pods.values()), st.completions, st.lost, st.gone)
                # rank 0's last lines before its end (podlogs.hold_end)
                events, nodes, settling = self.podlogs.hold_end(st, events, nodes)
            if st.active is not None:
                # spare nodes: the current round's slots only; an idle spare, or a slot an in-place
                # recovery replaced (its fenced pod's end, its failed index), is no news
                active = set(st.active)
                nodes = [n for n in nodes if n.node in active]
                events = [e for e in events if (e.node is None or e.node in active) and not _past_member(e, nodes)]
        return Observation(events, nodes, settling)

    def _read_failed_create(self, st: Attempt) -> None:
        """While the Job has fewer pods than nodes, say why from its Events (classify.failed_create):
        a pod the API server refused is never created, so no pod can tell. Rate-limited; a user who
        may not list Events (403) waits without the reason (restart.pending_timeout needs one)."""
        with st.lock:
            # a suspended Job (queued by Kueue, or a graceful cancel) creates no pods on purpose
            short = (st.job is not None and not job_finished(st.job) and not st.cancelled and st.completions
                     and not (st.job.get("spec") or {}).get("suspend")
                     # a slot lost with spares (its index failed) gets no pod: nothing to explain
                     and len(newest_per_index(list(st.pods.values()))) < st.completions - len(failed_indexes(st.job)))
            if not st._due("events", short):
                return
        try:
            items = self.cluster.job_events(st.ref)
        except (api_error(), BackendError):
            return      # 403; or throttled (429) or out past call()'s retries: read again when due
        why = failed_create(items)
        if why is not None:
            reason, message = admission.explain(why)     # PodSecurity ends the attempt at once
            with st.lock:
                self._emit(st, [(("waiting", f"create|{why}"), Event(NODE_WAITING, reason=reason,
                                                                     message=message))])

    def _read_queue(self, st: Attempt) -> None:
        """While Kueue holds the Job (suspended, a LocalQueue label, no pod yet), say why from its
        Workload (classify.kueue_wait): a full queue waits as long as it takes (NODE_QUEUED); a
        queue that does not exist or is stopped, or no Kueue at all, needs a person (NODE_WAITING:
        restart.pending_timeout applies). Rate-limited like the FailedCreate read. Workloads are
        readable with Kueue's batch-user role, not the built-in edit role: without it (403) the
        wait is said without Kueue's reason."""
        with st.lock:
            job = st.job or {}
            meta = job.get("metadata") or {}
            queue = (meta.get("labels") or {}).get(L.KUEUE_QUEUE)
            held = (queue and not job_finished(job) and not st.cancelled and not st.pods
                    and (job.get("spec") or {}).get("suspend"))
            if not st._due("queue", held):
                return
        ns = self.cluster.ns(st.ref)
        version = self._kueue_version()
        if version is None:
            wait: tuple[bool, str, str] | None = (
                True, "NoKueue", f"the Job is queued for Kueue LocalQueue {queue!r}, but this cluster serves no "
                f"{L.KUEUE_GROUP} API (Kueue is not installed): nothing will admit it; drop kubernetes.queue")
        else:
            try:
                items = call_json(self.cluster.custom().list_namespaced_custom_object, L.KUEUE_GROUP, version, ns,
                                  "workloads", label_selector=f"{L.KUEUE_JOB_UID}={meta.get('uid')}",
                                  what=f"list the Kueue Workloads of Job {ns}/{meta.get('name')}")["items"]
                wait = kueue_wait(items)
            except BackendError:
                return      # throttled (429) or out past call()'s retries: read again when due
            except api_error() as exc:
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
            try:
                groups = call_json(self.cluster.api("ApisApi").get_api_versions,
                                   what="list the API groups").get("groups") or []
            except (api_error(), BackendError):
                return None          # asked again on the next read
            found = next((g for g in groups if g.get("name") == L.KUEUE_GROUP), None)
            self._kueue_api = ((found.get("preferredVersion") or {}).get("version") if found else None,)
        return self._kueue_api[0]

    def _resolve_gone(self, st: Attempt) -> None:
        """The attempt has no Job and no pod, and this watcher never saw them: the
        TTL-after-finished controller removed a finished Job (with its pods) while nobody
        watched, or someone deleted it. The Job controller's own Event on the Job says how it
        ended while the API server keeps Events (--event-ttl, 1 h by default); else the end is
        unknown and reported as a loss (a watcher with --auto-resume resumes from the newest
        checkpoint)."""
        with st.lock:
            seen = job_finished(st.job)       # seen finished, then deleted before its pods were listed
            cond: Obj = next((c for c in ((st.job or {}).get("status") or {}).get("conditions") or []
                              if JOB_END_CONDITIONS.get(c.get("type") or "") == seen), {})
        end: tuple[str, str, str] | None = (seen, cond.get("reason") or "", cond.get("message") or "") if seen else None
        if end is None:
            try:
                items = self.cluster.job_events(st.ref)
            except BackendError:
                return              # throttled or out of reach: resolved on a later poll
            except api_error():
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
