"""Spare nodes at run time (docs/spares.md, spares.py for the plan): the attempt's rounds in its
ConfigMap ``<attempt>-rounds``, read and written through the API; an in-place recovery (the lost
slot's pod fenced off, the next round written), the close that lets idle spares end, and a new
spare index in the background (an elastic Indexed Job: completions and parallelism raised
together, pkg/controller/job: "elastic Indexed Jobs", GA in 1.31).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ... import failures as F
from ... import layout
from ...errors import BackendError
from ...launch import fence_epoch
from ...resources import rbac_manifest
from ...runtime.keeper import CLOSED, KEEPER_EXIT, newest_of
from ...runtime.protocol import ENV_FENCE_EPOCH, ENV_RESUME
from ..base import NODE_EXITED, AttemptRef, Event, InPlaceRecovery
from .classify import exit_info, newest_per_index, node_ready, pod_index
from .client import call_json
from .cluster import Cluster, Obj, api_error
from .record import Attempt
from .spares import ROUND_KEY, round_doc, rounds_name

# A slot's recent output, kept by its log follower (podlogs.py) for the next keeper_exit line to be
# judged by: torchrun's report and every local rank's traceback before it (as many lines as the
# supervisor reads for the failure's report, joberror.LOG_TAIL_LINES), each line's start only: at
# most 400 kB per slot, a few kB as tracebacks go.
TAIL_LINES = 400
TAIL_LINE_CHARS = 1000


def _warm(pod: Obj | None) -> bool:
    """A spare that can take a lost node's place now: its pod runs (image pulled, keeper up)."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") == "Running"


class Rounds:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def data(self, ref: AttemptRef) -> dict[str, str] | None:
        """The rounds ConfigMap's data; None when the attempt has none (no spares, or gone)."""
        name = rounds_name(ref.attempt_name)
        try:
            cm = call_json(self.cluster.core().read_namespaced_config_map, name, self.cluster.ns(ref),
                           what=f"read ConfigMap {name}")
        except api_error():
            return None
        data = cm.get("data")
        return data if isinstance(data, dict) else {}

    def learn(self, st: Attempt) -> None:
        """The current round's slots, read from the cluster (a watcher that did not write them); at
        most every FAILED_CREATE_EVERY_S while there are none to read."""
        with st.lock:
            if not st._due("rounds", True):
                return
        data = self.data(st.ref)
        current = newest_of(data) if data else None
        if current is not None:
            with st.lock:
                st.round, st.active = int(current["round"]), [int(s) for s in current["active"]]

    def _write(self, ref: AttemptRef, patch: dict[str, str]) -> None:
        name = rounds_name(ref.attempt_name)
        ns = self.cluster.ns(ref)
        try:
            call_json(self.cluster.core().patch_namespaced_config_map, name, ns, {"data": patch},
                      what=f"write ConfigMap {ns}/{name}")
        except api_error() as exc:
            raise BackendError(f"cannot write the rounds of {ref.attempt_name} (ConfigMap {ns}/{name}): "
                               f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', '')}".rstrip(),
                               hint=f"grant the verbs of {rbac_manifest()} (shipped with wmctl): patch on "
                               "configmaps") from None

    def recover(self, st: Attempt, node: int) -> InPlaceRecovery | None:
        """Lost slot ``node`` replaced by a warm spare: its pod deleted at once (grace 0: a frozen
        or cut-off node is fenced off, and a dead node's pod needs no kubelet to confirm), then the
        next round written with the spare in its place. No Job or pod is created. None when no
        spare is warm (none left, or still pulling its image: never waited for here)."""
        ref = st.ref
        data = self.data(ref)
        current = newest_of(data) if data else None
        if current is None or node not in current["active"]:
            return None
        used = {int(s) for k, v in (data or {}).items() if k.startswith("round-")
                for s in json.loads(v).get("active", [])}
        with st.lock:
            pods = newest_per_index(list(st.pods.values()))
            completions = st.completions
        idle = [i for i in range(completions) if i not in used and i in pods]
        warm = [i for i in idle if _warm(pods.get(i))]
        if not warm:
            return None
        spare = warm[0]
        self.fence(st, node)
        active = [spare if s == node else int(s) for s in current["active"]]
        n = int(current["round"]) + 1
        env = {ENV_RESUME: "1", ENV_FENCE_EPOCH: str(fence_epoch(ref.attempt, n))}
        self._write(ref, {ROUND_KEY.format(n=n): round_doc(
            n, active, layout.round_rendezvous_id(ref.run, ref.attempt, n), env, time.time())})
        with st.lock:
            st.round, st.active = n, active
        return InPlaceRecovery(round=n, lost=node, spare=spare, spares_left=len(warm) - 1)

    def fence(self, st: Attempt, node: int) -> None:
        """Every pod of slot ``node`` deleted with grace 0 (best effort: one already gone is fine)."""
        ns = self.cluster.ns(st.ref)
        with st.lock:
            victims = [p["metadata"]["name"] for p in st.pods.values() if pod_index(p) == node]
        for name in victims:
            try:
                call_json(self.cluster.core().delete_namespaced_pod, name, ns, grace_period_seconds=0,
                          what=f"delete pod {ns}/{name}")
            except (api_error(), BackendError):
                pass

    def close(self, ref: AttemptRef) -> None:
        """The attempt is over: idle spares' keepers end (exit 0). Best effort."""
        try:
            self._write(ref, {CLOSED: "1"})
        except BackendError:
            pass

    def add_spare(self, st: Attempt) -> int | None:
        """One more index (a new spare slot) through an elastic Indexed Job: completions and
        parallelism raised together by one; the Job controller creates its pod, which pulls and
        starts in the background. Returns the new slot, None when the Job could not grow."""
        ref = st.ref
        ns = self.cluster.ns(ref)
        try:
            job = call_json(self.cluster.batch().read_namespaced_job, ref.attempt_name, ns,
                            what=f"read Job {ns}/{ref.attempt_name}")
            spec: dict[str, Any] = job.get("spec") or {}
            slot = int(spec.get("completions") or 0)
            call_json(self.cluster.batch().patch_namespaced_job, ref.attempt_name, ns,
                      {"spec": {"completions": slot + 1, "parallelism": slot + 1,
                                "maxFailedIndexes": int(spec.get("maxFailedIndexes") or 0) + 1}},
                      what=f"grow Job {ns}/{ref.attempt_name} by one spare index")
        except (api_error(), BackendError):
            return None
        with st.lock:
            st.completions = max(st.completions, slot + 1)
        return slot


def store_lost(pod: Obj, node: Obj | None, *, deleted: bool, nodes_known: bool = True) -> str | None:
    """Why the store's pod can serve the rendezvous no more (None: it can): deleted, ended, or its
    node gone or not ready. Every keeper's torchrun then loses the rendezvous; its own end would
    come only after the keepers' hold (``hold_s``), so the watcher says it at once."""
    name = (pod.get("metadata") or {}).get("name")
    host = (pod.get("spec") or {}).get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if deleted:
        why = "its pod was deleted"
    elif phase in ("Succeeded", "Failed"):
        code, reason = exit_info(pod)
        why = f"its pod ended ({phase}{f', exit {code}' if code is not None else ''}{f': {reason}' if reason else ''})"
    elif host and node is None and nodes_known:
        why = f"its node {host} no longer exists"
    elif host and node is not None and node_ready(node)[0] != "True":
        why = f"its node {host} Ready={node_ready(node)[0]}"
    else:
        return None
    return (f"the c10d store of the spare nodes (pod {name}) is gone: {why}; every node loses the rendezvous, "
            "so a new attempt replaces this one")


def failed_indexes(job: Obj | None) -> set[int]:
    """The Job's ``status.failedIndexes`` ("0,2-3": backoffLimitPerIndex), as index numbers."""
    out: set[int] = set()
    for part in str(((job or {}).get("status") or {}).get("failedIndexes") or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def keeper_exit(payload: dict[str, Any], tail: list[str], node: int, host: str | None, current: int,
                active: list[int] | None) -> Event | None:
    """A keeper's ``keeper_exit`` line (runtime/keeper.py: its torchrun failed, and it holds for a
    newer round before its pod fails: spares.hold_s) as that slot's NODE_EXITED at once, when the
    line is of the current round, the slot is one of the round's, and the output before it
    (``tail``) is the job's own error (failures.own_error). Else None and the hold stands: most
    often a peer died under this slot, and the watcher's evidence of that death comes later than
    the survivor's exit; reading it as the job's error would stop the run, where waiting for the
    keeper's own end costs only the hold."""
    code, round_ = _int(payload.get("exit_code")), _int(payload.get("round"))
    if (payload.get("event") != KEEPER_EXIT or code is None or round_ != current or active is None
            or node not in active or _int(payload.get("slot")) not in (None, node)):
        return None
    error = F.own_error(code, payload.get("signal") is not None, tail)
    if error is None:
        return None
    when = payload.get("time")
    return Event(NODE_EXITED, time=float(when) if isinstance(when, (int, float)) and not isinstance(when, bool)
                 else time.time(), node=node, host=host, exit_code=code,
                 message=f"torchrun exited with {code} on {host or f'node {node}'} in round {round_} (said by its "
                 f"keeper at once, not after its hold): {error.summary}")


def keeper_said(st: Attempt, payload: dict[str, Any], tail: list[str], node: int, host: str | None) -> None:
    """Under ``st.lock``: a ``keeper_exit`` line read from slot ``node``'s log, judged against the
    current round (keeper_exit), its NODE_EXITED among the attempt's events; kept for later while
    the rounds are not known yet (a watcher adopting the attempt reads the logs from their start
    before its first poll reads the rounds: keeper_exits_due)."""
    if st.active is None:
        st.keeper_exits.append((payload, tail, node, host))
        return
    ended = keeper_exit(payload, tail, node, host, st.round, st.active)
    if ended is not None and not st.cancelled:
        st.failure_seen = True
        st.events.append(ended)


def keeper_exits_due(st: Attempt) -> None:
    """Under ``st.lock``: the keepers' lines kept while the rounds were not known, judged once they are."""
    if st.active is not None and st.keeper_exits:
        kept, st.keeper_exits = st.keeper_exits, []
        for payload, tail, node, host in kept:
            keeper_said(st, payload, tail, node, host)
