"""A scripted cluster behind the fake API server: Job controller, garbage collector,
scheduler, kubelets, node lifecycle controller, taint manager and pod GC.

Controllers act on the store through ``Api`` (the same code path as a client's request) once
per ``tick()``; tests call ``tick()`` themselves or ``start()`` a background thread. Every
Kubernetes duration (node-monitor-grace-period, tolerationSeconds, image pull back-off) is
multiplied by ``Timings.scale`` so a node failure plays out in seconds. Per-pod behaviour
(how long a container runs, its exit code, OOM, log lines) is scripted in real seconds.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .agent import at_rendezvous
from .api import RESOURCES, Api
from .store import ApiError, Obj, now_rfc3339

POD = RESOURCES[("v1", "pods")]
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


@dataclass
class Timings:
    scale: float = 0.01                     # real seconds per Kubernetes second
    node_monitor_grace_period: float = 40.0  # Kubernetes seconds (50 from 1.32)
    node_monitor_period: float = 5.0         # how often the node lifecycle controller looks
    image_pull_backoff_after: float = 10.0   # ErrImagePull -> ImagePullBackOff

    def real(self, k8s_seconds: float) -> float:
        return k8s_seconds * self.scale


@dataclass
class PodScript:
    """What a pod's containers do once started (real seconds)."""

    run_seconds: float | None = 0.2          # None: run until deleted
    exit_code: int = 0
    reason: str | None = None                # e.g. "OOMKilled"; default Completed / Error
    # (offset s, line) or (offset s, line, stamp lag s): api.Api.append_log's stamp_lag_s
    logs: list[tuple[float, str] | tuple[float, str, float]] = field(default_factory=list)
    start_delay: float = 0.0                 # bound -> running
    sigterm_exit_code: int = 143
    # After SIGTERM (a graceful delete): how long the container takes to exit (real seconds; None:
    # it ignores SIGTERM and is killed when the grace period ends) and what it prints meanwhile.
    sigterm_seconds: float | None = 0.0
    sigterm_logs: list[tuple[float, str]] = field(default_factory=list)   # (offset after SIGTERM, line)
    # torchrun's agent waits at the rendezvous for every pod of its Job first, and gives up after
    # the timeouts on its own command line (agent.py); the script's clock starts once it completes
    rendezvous: bool = False


@dataclass
class NodeState:
    alive: bool = True                        # kubelet posting status
    last_heartbeat: float = field(default_factory=time.monotonic)
    taint_times: dict[str, float] = field(default_factory=dict)  # taint key -> monotonic


@dataclass
class PodRuntime:
    script: PodScript
    bound_at: float
    started_at: float | None = None
    logs_sent: int = 0
    pull_failed_at: float | None = None
    sigterm_at: float | None = None
    sigterm_logs_sent: int = 0
    rdzv_done: bool = False


_QTY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(q: Any) -> float:
    if isinstance(q, (int, float)):
        return float(q)
    m = _QTY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        return 0.0
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def pod_requests(pod: Obj) -> dict[str, float]:
    total: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in req.items():
            total[k] = total.get(k, 0.0) + quantity(v)
    return total


def _match_expr(labels: dict[str, str], expr: Obj) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    val = None if key is None else labels.get(key)
    if op == "In":
        return val in values
    if op == "NotIn":
        return val not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and val is not None and values:
        try:
            return int(val) > int(values[0]) if op == "Gt" else int(val) < int(values[0])
        except ValueError:
            return False
    return False


def node_fits_affinity(pod: Obj, node: Obj) -> bool:
    labels = dict((node.get("metadata") or {}).get("labels") or {})
    name = node["metadata"]["name"]
    spec = pod.get("spec") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if req:
        terms = req.get("nodeSelectorTerms") or []
        ok = False
        for term in terms:
            exprs = term.get("matchExpressions") or []
            fields = term.get("matchFields") or []
            if all(_match_expr(labels, e) for e in exprs) and \
                    all(_match_expr({"metadata.name": name}, f) for f in fields):
                ok = True
                break
        if not ok:
            return False
    return True


def tolerates(pod: Obj, taint: Obj) -> Obj | None:
    """The toleration that tolerates ``taint``, or None."""
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return t
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return t
    return None


def _set_condition(conds: list[Obj], cond: Obj) -> list[Obj]:
    out = [c for c in conds if c.get("type") != cond["type"]]
    old = next((c for c in conds if c.get("type") == cond["type"]), None)
    if old and old.get("status") == cond.get("status") and old.get("reason") == cond.get("reason"):
        return conds
    cond.setdefault("lastTransitionTime", now_rfc3339())
    out.append(cond)
    return out


def _job_status(spec: Obj, status: Obj, active: list[Obj], succeeded_idx: list[int], n_failed: int,
                new_conds: list[Obj], failed_idx: list[int] | None = None) -> Obj:
    """The Job's status as the controller writes it from what _sync_job found."""
    new_status: Obj = {
        "active": len(active), "succeeded": len(succeeded_idx), "failed": n_failed,
        "ready": sum(1 for p in active if (p.get("status") or {}).get("phase") == "Running"),
        "startTime": status.get("startTime") or now_rfc3339(),
    }
    if spec.get("completionMode") == "Indexed" and succeeded_idx:
        new_status["completedIndexes"] = _compress_indexes(succeeded_idx)
    if failed_idx is not None:       # with backoffLimitPerIndex the controller always writes it ("" for none)
        new_status["failedIndexes"] = _compress_indexes(failed_idx)
    if new_conds:
        new_status["conditions"] = new_conds
    if any(c["type"] == "Complete" and c["status"] == "True" for c in new_conds):
        new_status["completionTime"] = status.get("completionTime") or now_rfc3339()
    for k, v in list(new_status.items()):
        if v == 0 and k in ("active", "succeeded", "failed", "ready"):
            new_status.pop(k)      # the real controller omits zero counters
    return new_status


def _compress_indexes(idx: list[int]) -> str:
    idx = sorted(set(idx))
    parts, i = [], 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ",".join(parts)


def _controlled_by(obj: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


def _is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Cluster:
    def __init__(self, api: Api, timings: Timings | None = None):
        self.api = api
        self.store = api.store
        self.timings = timings or Timings()
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodRuntime] = {}
        self.bad_images: set[str] = set()
        self.rate_limited_images: dict[str, float] = {}     # image -> real seconds its pulls get 429
        # image -> the runtime's error for every pull of it (containerd's words, e.g. "x509:
        # certificate signed by unknown authority", "no space left on device")
        self.pull_failures: dict[str, str] = {}
        # node -> (reason, message) its kubelet's admission refuses every new pod with
        self.admission_rejections: dict[str, tuple[str, str]] = {}
        # Kueue (where its CRDs are installed): LocalQueue name -> the scheduler's "no" for the
        # workloads queued there (the flavor assigner's message), until the test clears it
        self.kueue_full: dict[str, str] = {}
        self.default_script = PodScript()
        self._scripts: list[tuple[Callable[[Obj], bool], PodScript]] = []
        self._job_pods: dict[str, dict[str, bool]] = {}   # job uid -> pod uid -> counted failed
        self._pod_index: dict[str, int] = {}               # pod uid -> its completion index (Indexed Jobs)
        self._marked_not_ready: set[str] = set()          # nodes whose pods MarkPodsNotReady flipped
        self._finished_at: dict[str, float] = {}           # job uid -> when the TTL controller saw it finish
        self.timeline: list[tuple[float, str, str]] = []   # (time.time(), what, detail)
        self._lock = threading.RLock()
        self.error: BaseException | None = None            # what killed the controller thread
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- scripting -----------------------------------------------------------------
    def script(self, *, job: str | None = None, index: int | None = None,
               when: Callable[[Obj], bool] | None = None, **kw: Any) -> PodScript:
        """Behaviour for pods matching job name / completion index / predicate (last wins)."""
        s = PodScript(**kw)

        def pred(pod: Obj) -> bool:
            labels = pod["metadata"].get("labels") or {}
            if job is not None and labels.get("job-name") != job:
                return False
            if index is not None and labels.get(INDEX_KEY) != str(index):
                return False
            return when(pod) if when else True
        with self._lock:
            self._scripts.append((pred, s))
        return s

    def _script_for(self, pod: Obj) -> PodScript:
        for pred, s in reversed(self._scripts):
            if pred(pod):
                return s
        return self.default_script

    def note(self, what: str, detail: str = "") -> None:
        self.timeline.append((time.time(), what, detail))

    # --- nodes -----------------------------------------------------------------------
    def add_node(self, name: str, labels: dict[str, str] | None = None,
                 capacity: dict[str, str] | None = None) -> Obj:
        cap = {"cpu": "16", "memory": "64Gi", "pods": "110", **(capacity or {})}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "kubernetes.io/os": "linux",
                                                      **(labels or {})}},
                "spec": {},
                "status": {"capacity": cap, "allocatable": dict(cap),
                           "conditions": [self._ready_cond("True", "KubeletReady",
                                                           "kubelet is posting ready status")],
                           "addresses": [{"type": "InternalIP", "address": f"10.0.0.{len(self.nodes) + 1}"},
                                         {"type": "Hostname", "address": name}]}}
        with self._lock:
            self.nodes[name] = NodeState()
            return self.api.create(RESOURCES[("v1", "nodes")], None, node)

    @staticmethod
    def _ready_cond(status: str, reason: str, message: str) -> Obj:
        now = now_rfc3339()
        return {"type": "Ready", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    def kill_node(self, name: str) -> None:
        """The machine dies: its kubelet stops posting status; pod statuses freeze."""
        with self._lock:
            self.nodes[name].alive = False
            self.note("node_killed", name)

    def set_node_ready(self, name: str, ready: bool, reason: str = "KubeletNotReady") -> None:
        """A live kubelet reports Ready=False (e.g. runtime down) or True again."""
        with self._lock:
            st = "True" if ready else "False"
            msg = "kubelet is posting ready status" if ready else "container runtime is down"
            self._update_node_ready(name, st, "KubeletReady" if ready else reason, msg)
            self.note("node_ready" if ready else "node_not_ready", name)

    def set_devices(self, name: str, resource: str, healthy: int, capacity: int | None = None) -> None:
        """A device plugin's report: pkg/kubelet/cm/devicemanager/manager.go counts a resource's
        healthy devices, and the kubelet's node status (pkg/kubelet/nodestatus/setters.go
        MachineInfo) sets status.allocatable[resource] to that count while status.capacity keeps
        every registered device: a device the plugin marks Unhealthy (an Xid, a GPU off the bus)
        drops allocatable, not capacity."""
        with self._lock:
            def mut(n: Obj) -> None:
                st = n["status"]
                if capacity is not None or resource not in (st.get("capacity") or {}):
                    st.setdefault("capacity", {})[resource] = str(capacity if capacity is not None else healthy)
                st.setdefault("allocatable", {})[resource] = str(healthy)
            self.store.update("nodes", None, name, mut)
            self.note("devices", f"{name} {resource}={healthy}")

    def set_node_condition(self, name: str, ctype: str, status: str, reason: str = "", message: str = "") -> None:
        """What a node-problem-detector does (k8s.io/node-problem-detector pkg/exporters/k8sexporter/
        condition/manager.go: it patches the Node's status.conditions with its own condition types,
        True while the problem lasts, e.g. the kernel monitor's KernelDeadlock)."""
        with self._lock:
            cond = {"type": ctype, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now_rfc3339()}
            self.store.update("nodes", None, name, lambda n: n["status"].__setitem__(
                "conditions", _set_condition(n["status"].get("conditions") or [], cond)))
            self.note("node_condition", f"{name} {ctype}={status}")

    def delete_node(self, name: str) -> None:
        with self._lock:
            self.store.remove("nodes", None, name)
            self.nodes.pop(name, None)
            self.note("node_deleted", name)

    def taint_out_of_service(self, name: str) -> None:
        with self._lock:
            taint = {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute",
                     "timeAdded": now_rfc3339()}
            self.store.update("nodes", None, name, lambda n: n["spec"].setdefault(
                "taints", []).append(taint))

    def _update_node_ready(self, name: str, status: str, reason: str, message: str) -> None:
        def mut(n: Obj) -> None:
            conds = n["status"].get("conditions") or []
            n["status"]["conditions"] = _set_condition(
                conds, self._ready_cond(status, reason, message))
            taints = [t for t in n["spec"].get("taints") or []
                      if t["key"] not in (UNREACHABLE, NOT_READY)]
            key = None if status == "True" else UNREACHABLE if status == "Unknown" else NOT_READY
            if key:
                for effect in ("NoSchedule", "NoExecute"):
                    taints.append({"key": key, "effect": effect, "timeAdded": now_rfc3339()})
            if taints:
                n["spec"]["taints"] = taints
            else:
                n["spec"].pop("taints", None)
        state = self.nodes.get(name)
        if state is not None:
            now = time.monotonic()
            keep = {k: v for k, v in state.taint_times.items() if k not in (UNREACHABLE, NOT_READY)}
            if status == "Unknown":
                keep[UNREACHABLE] = state.taint_times.get(UNREACHABLE, now)
            elif status == "False":
                keep[NOT_READY] = state.taint_times.get(NOT_READY, now)
            state.taint_times = keep
        self.store.update("nodes", None, name, mut)

    # --- driving ---------------------------------------------------------------------
    def start(self, interval: float = 0.02) -> "Cluster":
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.tick()
                except ApiError:
                    continue      # raced with a client's delete; the next tick converges
                except BaseException as exc:     # a bug in the fake: say so in run_until, not silently
                    self.error = exc
                    raise
        self._thread = threading.Thread(target=loop, name="fake-cluster", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self._thread = None

    def tick(self) -> None:
        with self._lock:
            self._job_controller()
            self._kueue()
            self._ttl_after_finished()
            self._garbage_collector()
            self._scheduler()
            self._kubelets()
            self._node_lifecycle()
            self._taint_manager()
            self._pod_gc()

    def run_until(self, predicate: Callable[[], bool], timeout: float = 60.0,
                  interval: float = 0.01) -> bool:
        """Tick (when no background thread runs) until ``predicate()`` holds. ``timeout`` only
        bounds a test that fails: a condition met returns at once. (10 s was too short for a
        supervisor thread on a CI machine running four workers on two cores: its first list and
        watch took 7 s there, and the wait failed a test that was only slow.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError("the fake cluster's controller thread died") from self.error
            if self._thread is None:
                self.tick()
            if predicate():
                return True
            time.sleep(interval)
        return predicate()

    # --- job controller ----------------------------------------------------------------
    def _job_controller(self) -> None:
        jobs, _ = self.store.list("jobs")
        for job in jobs:
            try:
                self._sync_job(job)
            except ApiError as err:
                if err.code not in (404, 409):
                    raise

    def _sync_job(self, job: Obj) -> None:
        meta, spec, status = job["metadata"], job["spec"], job.get("status") or {}
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        # pkg/controller/job/job_controller.go getPodsForJob (ControllerRefManager.ClaimPods): the
        # Job's pods are those it controls (ownerReference controller: true). Another object it
        # merely owns (the spare nodes' store pod, owned so that it goes with the Job) is not one.
        pods, _ = self.store.list("pods", ns, lambda p: _controlled_by(p, uid))
        seen = self._track_failed_pods(uid, pods)
        conds = status.get("conditions") or []
        finished = any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conds)
        active = [p for p in pods if not _is_terminal(p) and not p["metadata"].get("deletionTimestamp")]
        completions = int(spec.get("completions") or 1)
        succeeded_idx = sorted({int((p["metadata"].get("annotations") or {}).get(INDEX_KEY, -1))
                                for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"})
        n_failed = sum(1 for v in seen.values() if v)
        failed_idx = self._failed_indexes(spec, seen, succeeded_idx)
        new_conds = list(conds)
        if meta.get("deletionTimestamp"):
            return
        # pkg/controller/job/job_controller.go (1.31+, delayTerminalCondition: JobPodReplacementPolicy
        # and JobManagedBy on): a failing Job first gets FailureTarget, recorded before its pods'
        # tracking finalizers are removed (so before any of them can vanish); its active pods are
        # deleted; Failed (same reason) is added only once none is still terminating
        # (enactJobFinished). A pod stuck terminating on a dead node holds Failed back.
        target = next((c for c in conds if c["type"] == "FailureTarget" and c["status"] == "True"), None)
        if not finished and target is None and n_failed > int(spec.get("backoffLimit", 6)):
            new_conds = _set_condition(new_conds, {
                "type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit", "lastProbeTime": now_rfc3339()})
            target = new_conds[-1]
            self.store.update("jobs", ns, name, lambda j: j["status"].__setitem__("conditions", new_conds))
            self.note("job_failure_target", name)
        if not finished and target is None and failed_idx:
            # job_controller.go syncJob, hasBackoffLimitPerIndex: more failed indexes than
            # maxFailedIndexes fails the Job at once (its running pods deleted); else failed
            # indexes fail it once every index has either succeeded or failed
            over = spec.get("maxFailedIndexes") is not None and len(failed_idx) > int(spec["maxFailedIndexes"])
            if over or len(failed_idx) + len(succeeded_idx) >= completions:
                reason, message = (("MaxFailedIndexesExceeded",
                                    "Job has exceeded the specified maximal number of failed indexes") if over
                                   else ("FailedIndexes", "Job has failed indexes"))
                new_conds = _set_condition(new_conds, {"type": "FailureTarget", "status": "True", "reason": reason,
                                                       "message": message, "lastProbeTime": now_rfc3339()})
                target = new_conds[-1]
                self.store.update("jobs", ns, name, lambda j: j["status"].__setitem__("conditions", new_conds))
                self.note("job_failure_target", name)
        if target is not None and not finished:
            for p in active:
                self.api.delete_pod(ns, p["metadata"]["name"], None)
            active = []
            left, _ = self.store.list("pods", ns, lambda p: _controlled_by(p, uid))
            if not [p for p in left if p["metadata"].get("deletionTimestamp") and not _is_terminal(p)]:
                new_conds = _set_condition(new_conds, {
                    "type": "Failed", "status": "True", "reason": target.get("reason"),
                    "message": target.get("message"), "lastProbeTime": now_rfc3339()})
                finished = True
                self.note("job_failed", name)
                self._record_job_finished(job, "Warning", target.get("reason") or "", target.get("message") or "")
        if finished or target is not None or spec.get("suspend"):
            for p in active:
                self.api.delete_pod(ns, p["metadata"]["name"], None)
            active = []
            if spec.get("suspend") and not finished:
                new_conds = _set_condition(new_conds, {"type": "Suspended", "status": "True",
                                                       "reason": "JobSuspended",
                                                       "message": "Job suspended"})
        else:
            self._start_missing_pods(job, active, succeeded_idx + failed_idx, seen)
            if len(succeeded_idx) >= completions:
                for ctype in ("SuccessCriteriaMet", "Complete"):
                    new_conds = _set_condition(new_conds, {
                        "type": ctype, "status": "True", "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": now_rfc3339()})
                self.note("job_complete", name)
                self._record_job_finished(job, "Normal", "Completed", "Job completed")
        new_status = _job_status(spec, status, active, succeeded_idx, n_failed, new_conds,
                                 failed_idx if spec.get("backoffLimitPerIndex") is not None else None)
        if new_status != {k: v for k, v in status.items()}:
            self.store.update("jobs", ns, name, lambda j: j.__setitem__("status", new_status))

    def _failed_indexes(self, spec: Obj, seen: dict[str, bool], succeeded_idx: list[int]) -> list[int]:
        """With backoffLimitPerIndex (pkg/controller/job/backoff_utils.go, indexed_job_utils.go
        calculateFailedIndexes): an index whose pods failed more than backoffLimitPerIndex times
        is failed, gets no new pod, and is listed in status.failedIndexes. (Without a
        podFailurePolicy every failure counts; a pod that vanished or is terminating before it
        succeeded counts as failed, as _track_failed_pods says.)"""
        limit = spec.get("backoffLimitPerIndex")
        if limit is None or spec.get("completionMode") != "Indexed":
            return []
        counts: dict[int, int] = {}
        for puid, failed in seen.items():
            idx = self._pod_index.get(puid)
            if failed and idx is not None:
                counts[idx] = counts.get(idx, 0) + 1
        return sorted(i for i, n in counts.items() if n > int(limit) and i not in succeeded_idx)

    def _track_failed_pods(self, uid: str, pods: list[Obj]) -> dict[str, bool]:
        """The Job's pods ever seen, by uid, each marked True once it failed: a pod that vanished
        or is terminating before succeeding counts as failed."""
        seen = self._job_pods.setdefault(uid, {})
        present = {p["metadata"]["uid"] for p in pods}
        for puid in list(seen):
            if puid not in present and not seen[puid]:
                seen[puid] = True
        for p in pods:
            puid = p["metadata"]["uid"]
            raw = (p["metadata"].get("annotations") or {}).get(INDEX_KEY)
            if raw is not None and str(raw).isdigit():
                self._pod_index[puid] = int(raw)
            phase = (p.get("status") or {}).get("phase")
            failed = phase == "Failed" or (bool(p["metadata"].get("deletionTimestamp"))
                                           and phase != "Succeeded")
            seen[puid] = seen.get(puid, False) or failed
        return seen

    def _start_missing_pods(self, job: Obj, active: list[Obj], succeeded_idx: list[int],
                            seen: dict[str, bool]) -> None:
        """Create a pod for each index neither finished (``succeeded_idx``: succeeded, or failed
        past backoffLimitPerIndex) nor running, up to the parallelism; the new pods join
        ``active`` and ``seen``. An elastic Indexed Job (completions and parallelism raised
        together) gets its new indexes' pods here too."""
        ns, spec = job["metadata"]["namespace"], job["spec"]
        completions = int(spec.get("completions") or 1)
        active_idx = {int((p["metadata"].get("annotations") or {}).get(INDEX_KEY, -1))
                      for p in active}
        for idx in range(completions):
            if idx in succeeded_idx or idx in active_idx:
                continue
            if len(active) >= int(spec.get("parallelism") or completions):
                break
            try:
                created = self.api.create(POD, ns, self._pod_from_template(job, idx))
            except ApiError as err:
                if err.code in (404, 409):
                    raise
                # pkg/controller/controller_utils.go RealPodControl.CreatePodsWithGenerateName:
                # a refused create is a Warning Event "FailedCreate", "Error creating: <err>",
                # on the Job; the controller requeues the Job with backoff and tries again.
                self._record_event(job, "Warning", "FailedCreate", f"Error creating: {err.message}")
                break
            seen[created["metadata"]["uid"]] = False
            self._pod_index[created["metadata"]["uid"]] = idx
            active.append(created)

    def _record_event(self, job: Obj, etype: str, reason: str, message: str, *, kind: str = "Job",
                      api_version: str = "batch/v1", component: str = "job-controller") -> None:
        """An Event on the Job, through staging/src/k8s.io/client-go/tools/record/events_cache.go
        (EventCorrelator): a repeat of the same message on the same object is one Event whose
        count and lastTimestamp grow (eventLogger); once 10 different messages with the same
        reason were recorded on it (EventAggregator, maxEvents 10 in 10 minutes), the rest go to
        one "(combined from similar events): <message>" Event whose count grows."""
        meta, now = job["metadata"], now_rfc3339()
        similar, _ = self.store.list("events", meta["namespace"], lambda e: (
            (e.get("involvedObject") or {}).get("uid") == meta["uid"] and e.get("reason") == reason))
        combined = "(combined from similar events): "
        same = [e for e in similar if e.get("message") == message or e.get("message", "").startswith(combined)]
        if not same and len(similar) >= 10:
            message = combined + message
        if same:
            self.store.update("events", meta["namespace"], same[0]["metadata"]["name"], lambda e: e.update(
                count=int(e.get("count") or 1) + 1, lastTimestamp=now,
                message=combined + message if e.get("message", "").startswith(combined) else e.get("message")))
            return
        self.api.create(RESOURCES[("v1", "events")], meta["namespace"], {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": api_version, "kind": kind, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": etype, "count": 1,
            "source": {"component": component}, "firstTimestamp": now, "lastTimestamp": now})

    def _record_job_finished(self, job: Obj, etype: str, reason: str, message: str) -> None:
        """pkg/controller/job/job_controller.go recordJobFinished: a Normal "Completed" / "Job
        completed" Event, or a Warning with the Failed condition's reason and message. Events
        outlive their Job for the apiserver's --event-ttl (1 h by default); the fake keeps them."""
        meta, now = job["metadata"], now_rfc3339()
        self.api.create(RESOURCES[("v1", "events")], meta["namespace"], {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": etype, "count": 1,
            "source": {"component": "job-controller"}, "firstTimestamp": now, "lastTimestamp": now})

    # --- Kueue ---------------------------------------------------------------------------------
    def _kueue(self) -> None:
        """Kueue, where its CRDs are installed (kubernetes-sigs/kueue):
        - pkg/controller/jobframework/reconciler.go: a Job labelled kueue.x-k8s.io/queue-name
          (created suspended: its webhook, and wmctl's render, see to that) gets a Workload owned
          by the Job (controller owner), labelled kueue.x-k8s.io/job-uid with the Job's uid, named
          by pkg/controller/jobframework/workload_names.go ("job-<name>-" + 5 hex of the sha1 of
          kind, group, name and uid); once the Workload is admitted the Job is unsuspended
          (startJob).
        - pkg/controller/core/workload_controller.go Reconcile: a Workload whose LocalQueue does
          not exist gets QuotaReserved=False, reason Inadmissible, "LocalQueue <q> doesn't exist".
        - pkg/scheduler/scheduler.go requeueAndUpdate: a Workload the ClusterQueue cannot fit gets
          QuotaReserved=False, reason Pending, with the flavor assigner's message, and a Warning
          Event "Pending" on the Workload (here: the message a test put in kueue_full).
        - pkg/workload/workload.go SetQuotaReservation / SyncAdmittedCondition: admitted, it has
          QuotaReserved=True ("Quota reserved in ClusterQueue <cq>") and Admitted=True ("The
          workload is admitted").
        The flavor assigner itself (quotas, flavors, cohorts) is not modelled: a test says whether
        a queue is full."""
        import hashlib

        if "workloads.kueue.x-k8s.io" not in self.api.crds:
            return
        workloads = RESOURCES[("kueue.x-k8s.io/v1beta1", "workloads")]
        jobs, _ = self.store.list("jobs")
        for job in jobs:
            meta = job["metadata"]
            queue = (meta.get("labels") or {}).get("kueue.x-k8s.io/queue-name")
            done = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                       for c in (job.get("status") or {}).get("conditions") or [])
            if not queue or done or meta.get("deletionTimestamp"):
                continue
            ns, uid = meta["namespace"], meta["uid"]
            found, _ = self.store.list("workloads", ns, lambda w, uid=uid: (
                (w["metadata"].get("labels") or {}).get("kueue.x-k8s.io/job-uid") == uid))
            if not found:
                digest = hashlib.sha1("\n".join(("Job", "batch", meta["name"], uid)).encode()).hexdigest()
                body = {
                    "metadata": {"name": f"job-{meta['name']}"[:247] + f"-{digest[:5]}", "namespace": ns,
                                 "labels": {"kueue.x-k8s.io/job-uid": uid},
                                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                      "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
                    "spec": {"queueName": queue, "podSets": [{"name": "main",
                                                              "count": int(job["spec"].get("parallelism") or 1)}]}}
                self._try(lambda ns=ns, body=body: self.api.create(workloads, ns, body))
                continue
            wl = found[0]
            if (wl.get("spec") or {}).get("active") is False:
                self._kueue_deactivated(job, wl)
                continue
            conds = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
            if (conds.get("Admitted") or {}).get("status") == "True":
                if job["spec"].get("suspend"):
                    self._try(lambda ns=ns, name=meta["name"]: self.store.update(
                        "jobs", ns, name, lambda j: j["spec"].update(suspend=False)))
                    self.note("kueue_admitted", meta["name"])
                continue
            try:
                lq = self.store.get("localqueues", ns, queue)
            except ApiError:
                lq = None
            if lq is None:
                self._workload_conditions(wl, [("QuotaReserved", "False", "Inadmissible",
                                                f"LocalQueue {queue} doesn't exist")])
            elif queue in self.kueue_full:
                message = self.kueue_full[queue]
                if self._workload_conditions(wl, [("QuotaReserved", "False", "Pending", message)]):
                    self._record_event(wl, "Warning", "Pending", message, kind="Workload",
                                       api_version="kueue.x-k8s.io/v1beta1", component="kueue-admission")
            else:
                cq = (lq.get("spec") or {}).get("clusterQueue") or ""
                self._workload_conditions(wl, [("QuotaReserved", "True", "QuotaReserved",
                                                f"Quota reserved in ClusterQueue {cq}"),
                                               ("Admitted", "True", "Admitted", "The workload is admitted")],
                                          admission={"clusterQueue": cq})

    def _kueue_deactivated(self, job: Obj, wl: Obj) -> None:
        """A Workload someone set ``spec.active: false`` (kubernetes-sigs/kueue
        pkg/controller/core/workload_controller.go Reconcile, the !Active branch): it is evicted,
        condition Evicted=True reason Deactivated, "The workload is deactivated", its quota
        released (QuotaReserved=False, Admitted=False, status.admission cleared), and it is not
        queued again while inactive. The job reconciler (pkg/controller/jobframework/reconciler.go:
        an evicted workload's job is stopped, StopJob) suspends the Job: the Job controller then
        deletes its pods with their grace period. Nothing unsuspends it (an admitted, active
        workload is what the reconciler starts)."""
        if self._workload_conditions(wl, [("Evicted", "True", "Deactivated", "The workload is deactivated"),
                                          ("QuotaReserved", "False", "Pending", "The workload is deactivated"),
                                          ("Admitted", "False", "NoReservation", "The workload has no reservation")]):
            meta = wl["metadata"]
            self._try(lambda: self.store.update("workloads", meta["namespace"], meta["name"],
                                                lambda o: (o.get("status") or {}).pop("admission", None)))
        if not job["spec"].get("suspend"):
            jm = job["metadata"]
            self._try(lambda: self.store.update("jobs", jm["namespace"], jm["name"],
                                                lambda j: j["spec"].update(suspend=True)))
            self.note("kueue_stopped", jm["name"])

    def _workload_conditions(self, wl: Obj, conds: list[tuple[str, str, str, str]],
                             admission: Obj | None = None) -> bool:
        """Set conditions as apimachinery's meta.SetStatusCondition does (reason and message
        always, lastTransitionTime only when the status changes). True when something changed."""
        def mut(o: Obj) -> None:
            status = o.setdefault("status", {})
            current = {c["type"]: c for c in status.get("conditions") or []}
            for ctype, cstatus, reason, message in conds:
                old = current.get(ctype) or {}
                since = old.get("lastTransitionTime") if old.get("status") == cstatus else now_rfc3339()
                current[ctype] = {"type": ctype, "status": cstatus, "reason": reason, "message": message,
                                  "lastTransitionTime": since}
            status["conditions"] = list(current.values())
            if admission is not None:
                status["admission"] = admission
        meta = wl["metadata"]
        have = {c["type"]: (c.get("status"), c.get("reason"), c.get("message"))
                for c in (wl.get("status") or {}).get("conditions") or []}
        if all(have.get(t) == (st, r, m) for t, st, r, m in conds):
            return False
        self._try(lambda: self.store.update("workloads", meta["namespace"], meta["name"], mut))
        return True

    # --- TTL-after-finished controller ------------------------------------------------------
    def _ttl_after_finished(self) -> None:
        """pkg/controller/ttlafterfinished/ttlafterfinished_controller.go: a finished Job (Complete
        or Failed) with spec.ttlSecondsAfterFinished, not already being deleted, is deleted with
        Foreground propagation (its pods first) once finish time + TTL has passed. Upstream takes
        the finish time from the condition's lastTransitionTime; the fake's timestamps have 1 s
        resolution, so it uses the moment it first saw the condition (scaled like every duration)."""
        now = time.monotonic()
        jobs, _ = self.store.list("jobs")
        for job in jobs:
            meta, spec = job["metadata"], job["spec"]
            ttl = spec.get("ttlSecondsAfterFinished")
            finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                           for c in (job.get("status") or {}).get("conditions") or [])
            if ttl is None or not finished or meta.get("deletionTimestamp"):
                continue
            seen = self._finished_at.setdefault(meta["uid"], now)
            if now - seen >= self.timings.real(float(ttl)):
                self._try(lambda m=meta: self.api.delete(RESOURCES[("batch/v1", "jobs")], m["namespace"],
                                                         m["name"], None, "Foreground"))
                self.note("ttl_deleted", meta["name"])

    def _pod_from_template(self, job: Obj, idx: int) -> Obj:
        import copy
        meta, spec = job["metadata"], job["spec"]
        tmpl = copy.deepcopy(spec["template"])
        tmeta, tspec = tmpl.get("metadata") or {}, tmpl["spec"]
        indexed = spec.get("completionMode") == "Indexed"
        labels = dict(tmeta.get("labels") or {})
        annotations = dict(tmeta.get("annotations") or {})
        if indexed:
            labels[INDEX_KEY] = str(idx)
            annotations[INDEX_KEY] = str(idx)
            tspec.setdefault("hostname", f"{meta['name']}-{idx}")
            for c in tspec.get("containers") or []:
                env = c.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                        "apiVersion": "v1",
                        "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": f"{meta['name']}-{idx}-" if indexed else f"{meta['name']}-",
                             "namespace": meta["namespace"], "labels": labels,
                             "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": tspec}

    # --- garbage collector ---------------------------------------------------------------
    def _garbage_collector(self) -> None:
        jobs, _ = self.store.list("jobs")
        live = {j["metadata"]["uid"] for j in jobs}
        pods, _ = self.store.list("pods")
        for job in jobs:
            m = job["metadata"]
            if not m.get("deletionTimestamp") or "foregroundDeletion" not in (m.get("finalizers") or []):
                continue
            deps = [p for p in pods if any(r.get("uid") == m["uid"]
                                           for r in p["metadata"].get("ownerReferences") or [])]
            for p in deps:
                if not p["metadata"].get("deletionTimestamp"):
                    self._try(lambda p=p: self.api.delete_pod(p["metadata"]["namespace"],
                                                               p["metadata"]["name"], None))
            if not deps:
                self._try(lambda m=m: self.store.remove("jobs", m["namespace"], m["name"]))
        # pkg/controller/garbagecollector/garbagecollector.go attemptToDeleteItem: an object whose
        # every owner (by uid) is gone is deleted (Background): the Service and PodGroup wmctl
        # makes the Job's dependents go with it, whoever deletes the Job (the TTL controller).
        for plural in ("services", "podgroups", "configmaps", "workloads"):
            deps, _ = self.store.list(plural)
            for d in deps:
                owners = [r for r in d["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"]
                if owners and not any(r.get("uid") in live for r in owners):
                    self._try(lambda d=d, plural=plural: self.store.remove(
                        plural, d["metadata"]["namespace"], d["metadata"]["name"]))
                    self.note("gc_deleted", f"{plural}/{d['metadata']['name']}")
        for p in pods:
            refs = [r for r in p["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"]
            if refs and not any(r["uid"] in live for r in refs) and not p["metadata"].get("deletionTimestamp"):
                self._try(lambda p=p: self.api.delete_pod(p["metadata"]["namespace"],
                                                           p["metadata"]["name"], None))

    @staticmethod
    def _try(fn: Callable[..., object]) -> None:
        """Call ``fn()``, a 404 ignored. (``...``: the callers bind loop variables through lambda
        defaults, for ruff's B023, and mypy infers such lambdas only against ``...``.)"""
        try:
            fn()
        except ApiError as err:
            if err.code != 404:
                raise

    # --- scheduler -----------------------------------------------------------------------
    def _scheduler(self) -> None:
        pods, _ = self.store.list("pods")
        nodes, _ = self.store.list("nodes")
        usage: dict[str, dict[str, float]] = {n["metadata"]["name"]: {} for n in nodes}
        count: dict[str, int] = {n["metadata"]["name"]: 0 for n in nodes}
        for p in pods:
            nn = p["spec"].get("nodeName")
            if nn in usage and not _is_terminal(p):
                count[nn] += 1
                for k, v in pod_requests(p).items():
                    usage[nn][k] = usage[nn].get(k, 0.0) + v
        for p in pods:
            if p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp") or _is_terminal(p):
                continue
            fits = []
            why: dict[str, int] = {}     # the FitError's per-reason node counts
            for n in nodes:
                name = n["metadata"]["name"]
                ready = next((c["status"] for c in n["status"].get("conditions") or []
                              if c["type"] == "Ready"), "Unknown")
                untolerated = [t for t in n["spec"].get("taints") or []
                               if t["effect"] in ("NoSchedule", "NoExecute") and not tolerates(p, t)]
                if n["spec"].get("unschedulable"):
                    why["node(s) were unschedulable"] = why.get("node(s) were unschedulable", 0) + 1
                    continue
                if untolerated or ready != "True":
                    t = untolerated[0] if untolerated else {"key": "node.kubernetes.io/not-ready"}
                    key = f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"
                    why[key] = why.get(key, 0) + 1
                    continue
                if not node_fits_affinity(p, n):
                    key = "node(s) didn't match Pod's node affinity/selector"
                    why[key] = why.get(key, 0) + 1
                    continue
                alloc = {k: quantity(v) for k, v in (n["status"].get("allocatable") or {}).items()}
                req = pod_requests(p)
                short = sorted(k for k, v in req.items() if v > alloc.get(k, 0.0) - usage[name].get(k, 0.0) + 1e-9)
                if short:
                    why[f"Insufficient {short[0]}"] = why.get(f"Insufficient {short[0]}", 0) + 1
                    continue
                fits.append((count[name], name))
            if not fits:
                # pkg/scheduler/schedule_one.go handleSchedulingFailure: PodScheduled=False, reason
                # Unschedulable, the FitError's message ("0/N nodes are available: ..."), kept on
                # the pod while it waits; the scheduler retries when the cluster changes.
                # pkg/scheduler/framework/types.go FitError.Error: the reasons sorted, each
                # with its node count.
                reasons = ", ".join(sorted(f"{c} {r}" for r, c in why.items()))
                msg = f"0/{len(nodes)} nodes are available" + (f": {reasons}." if reasons else "")
                self.store.update("pods", p["metadata"]["namespace"], p["metadata"]["name"],
                                  lambda o, msg=msg: o["status"].__setitem__("conditions", _set_condition(
                                      o["status"].get("conditions") or [],
                                      {"type": "PodScheduled", "status": "False",
                                       "reason": "Unschedulable", "message": msg})))
                continue
            _, chosen = min(fits)
            count[chosen] += 1
            for k, v in pod_requests(p).items():
                usage[chosen][k] = usage[chosen].get(k, 0.0) + v

            def bind(o: Obj, chosen: str = chosen) -> None:
                o["spec"]["nodeName"] = chosen
                o["status"]["conditions"] = _set_condition(
                    o["status"].get("conditions") or [], {"type": "PodScheduled", "status": "True"})
            self.store.update("pods", p["metadata"]["namespace"], p["metadata"]["name"], bind)

    # --- kubelets -----------------------------------------------------------------------------
    def _kubelets(self) -> None:
        pods, _ = self.store.list("pods")
        now = time.monotonic()
        for p in pods:
            nn = p["spec"].get("nodeName")
            state = self.nodes.get(nn or "")
            if state is None or not state.alive:
                continue      # unscheduled, or the kubelet is gone: status frozen
            uid = p["metadata"]["uid"]
            rt = self.pods.get(uid)
            if rt is None:
                rt = self.pods[uid] = PodRuntime(self._script_for(p), bound_at=now)
            try:
                self._run_pod(p, rt, now)
            except ApiError as err:
                if err.code != 404:
                    raise

    def _container_statuses(self, p: Obj, state: Obj, ready: bool) -> list[Obj]:
        return [{"name": c["name"], "image": c.get("image", ""), "imageID": "",
                 "ready": ready, "restartCount": 0, "started": "running" in state,
                 "state": state} for c in p["spec"]["containers"]]

    def _stop_deleted_pod(self, p: Obj, rt: PodRuntime, now: float) -> None:
        """Graceful deletion: stop containers, report a terminal phase, confirm removal."""
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        status = p.get("status") or {}
        if not _is_terminal(p):
            running = status.get("phase") == "Running"
            ended = self._after_sigterm(p, rt, now) if running else "exited"
            if ended is None:
                return
            code = (rt.script.sigterm_exit_code if ended == "exited" else 137) if running else 0
            self.note("pod_stopped", f"{name} {code}")
            term = {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                   "startedAt": now_rfc3339(), "finishedAt": now_rfc3339()}}

            def stop(o: Obj) -> None:
                o["status"]["phase"] = "Failed" if code or not running else "Succeeded"
                o["status"]["containerStatuses"] = self._container_statuses(o, term, False)
            self.store.update("pods", ns, name, stop)
        self.store.remove("pods", ns, name)
        self.pods.pop(p["metadata"]["uid"], None)

    def _run_pod(self, p: Obj, rt: PodRuntime, now: float) -> None:
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        status = p.get("status") or {}
        s = rt.script
        if p["metadata"].get("deletionTimestamp"):
            self._stop_deleted_pod(p, rt, now)
            return
        if _is_terminal(p):
            return
        container = p["spec"]["containers"][0]["name"]
        rejected = self.admission_rejections.get(p["spec"].get("nodeName") or "")
        if status.get("phase") == "Pending" and rejected is not None:
            # pkg/kubelet/kubelet.go HandlePodAdditions -> canAdmitPod -> rejectPod: a pod the
            # kubelet's admission refuses (pkg/kubelet/lifecycle/predicate.go: the device
            # manager's "UnexpectedAdmissionError", "OutOf<resource>") is set Failed with that
            # reason and "Pod was rejected: <message>"; no container ever starts.
            reason, message = rejected
            self.note("pod_rejected", f"{name} {reason}")
            self.store.update("pods", ns, name, lambda o: o["status"].update(
                phase="Failed", reason=reason, message=f"Pod was rejected: {message}"))
            return
        if status.get("phase") == "Pending":
            if self._pull_fails(p, rt, now):
                return
            if now - rt.bound_at < s.start_delay:
                return
            rt.started_at = now
            started = now_rfc3339()

            def run(o: Obj) -> None:
                st = o["status"]
                st["phase"] = "Running"
                st["startTime"] = started
                st["hostIP"] = "10.0.0.1"
                st["podIP"] = f"10.244.0.{len(self.pods) % 250 + 2}"
                st["containerStatuses"] = self._container_statuses(
                    o, {"running": {"startedAt": started}}, True)
                conds = st.get("conditions") or []
                for t in ("Initialized", "ContainersReady", "Ready"):
                    conds = _set_condition(conds, {"type": t, "status": "True"})
                st["conditions"] = conds
            self.store.update("pods", ns, name, run)
            self.note("pod_running", name)
        if rt.started_at is None:
            rt.started_at = now
        if at_rendezvous(self, p, rt, now):
            return
        s = rt.script                       # an agent that gave up has its exit scripted
        elapsed = now - rt.started_at
        done = s.run_seconds is not None and elapsed >= s.run_seconds
        while rt.logs_sent < len(s.logs) and (done or s.logs[rt.logs_sent][0] <= elapsed):
            self.api.append_log(ns, name, container, *s.logs[rt.logs_sent][1:])
            rt.logs_sent += 1
        if not done:
            return
        code = s.exit_code if s.reason != "OOMKilled" or s.exit_code else 137
        reason = s.reason or ("Completed" if code == 0 else "Error")
        started = (status.get("startTime") or now_rfc3339())
        term = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                               "finishedAt": now_rfc3339()}}

        def finish(o: Obj) -> None:
            o["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            o["status"]["containerStatuses"] = self._container_statuses(o, term, False)
            conds = o["status"].get("conditions") or []
            for t in ("ContainersReady", "Ready"):
                conds = _set_condition(conds, {"type": t, "status": "False",
                                               "reason": "PodCompleted" if code == 0 else "PodFailed"})
            o["status"]["conditions"] = conds
        self.store.update("pods", ns, name, finish)
        self.note("pod_exited", f"{name} {code} {reason}")

    def _pull_fails(self, p: Obj, rt: PodRuntime, now: float) -> bool:
        """The image pull of a pending pod fails this time (its waiting state written): True."""
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        image = p["spec"]["containers"][0].get("image") or ""
        if image in self.rate_limited_images and now - rt.bound_at < self.rate_limited_images[image]:
            # pkg/kubelet/images/image_manager.go: a failed pull is ErrImagePull with the
            # runtime's error as the message, then ImagePullBackOff ('Back-off pulling image')
            # until the next try; the kubelet keeps retrying. A registry's 429 (containerd's
            # wording) passes once the registry lets the node in again.
            msg = (f'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to '
                   f'copy: httpReadSeeker: failed open: unexpected status code https://{image.split("/")[0]}'
                   "/v2/: 429 Too Many Requests - Server message: toomanyrequests: retry later")
            wait = {"waiting": {"reason": "ErrImagePull", "message": msg}}
            self.store.update("pods", ns, name, lambda o: o["status"].__setitem__(
                "containerStatuses", self._container_statuses(o, wait, False)))
            return True
        failing = self.bad_images | set(self.pull_failures)
        if any(c.get("image") in failing for c in p["spec"]["containers"]):
            rt.pull_failed_at = rt.pull_failed_at or now
            late = now - rt.pull_failed_at >= self.timings.real(self.timings.image_pull_backoff_after)
            reason = "ImagePullBackOff" if late else "ErrImagePull"
            # pkg/kubelet/images/image_manager.go EnsureImageExists: ErrImagePull with the
            # runtime's error, then ImagePullBackOff ('Back-off pulling image') between tries
            cause = self.pull_failures.get(image or "", "not found")
            msg = (f'Back-off pulling image "{image}"' if late else
                   f'failed to pull and unpack image "{image}": {cause}')
            wait = {"waiting": {"reason": reason, "message": msg}}
            self.store.update("pods", ns, name, lambda o: o["status"].__setitem__(
                "containerStatuses", self._container_statuses(o, wait, False)))
            return True
        return False

    def _after_sigterm(self, p: Obj, rt: PodRuntime, now: float) -> str | None:
        """A running container of a pod being deleted gracefully: the kubelet stops it with the
        image's stop signal (SIGTERM) and waits up to the pod's grace period before SIGKILL
        (pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer: StopContainer with the
        grace period as its timeout). What the container prints meanwhile reaches its log.
        None while it runs, then "exited" (by itself) or "killed" (at the end of the grace)."""
        s = rt.script
        if rt.sigterm_at is None:
            rt.sigterm_at = now
        since = now - rt.sigterm_at
        grace = float(p["metadata"].get("deletionGracePeriodSeconds")
                      or (p.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        exited = s.sigterm_seconds is not None and since >= s.sigterm_seconds
        killed = since >= self.timings.real(grace)
        container = p["spec"]["containers"][0]["name"]
        while rt.sigterm_logs_sent < len(s.sigterm_logs) and (
                exited or s.sigterm_logs[rt.sigterm_logs_sent][0] <= since) and not (killed and not exited):
            self.api.append_log(p["metadata"]["namespace"], p["metadata"]["name"], container,
                                s.sigterm_logs[rt.sigterm_logs_sent][1])
            rt.sigterm_logs_sent += 1
        return "exited" if exited else "killed" if killed else None

    # --- node lifecycle controller --------------------------------------------------------------
    def _node_lifecycle(self) -> None:
        """pkg/controller/nodelifecycle/node_lifecycle_controller.go monitorNodeHealth: a node
        whose kubelet stopped posting for node-monitor-grace-period goes Ready=Unknown; on a
        node that is not Ready (Unknown, or False as a live kubelet reported), the next pass
        (every node-monitor-period) marks its pods not ready (MarkPodsNotReady)."""
        now = time.monotonic()
        grace = self.timings.real(self.timings.node_monitor_grace_period)
        for name, st in list(self.nodes.items()):
            if st.alive:
                st.last_heartbeat = now
            try:
                node = self.store.get("nodes", None, name)
            except ApiError:
                continue
            ready: Obj = next((c for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), {})
            if not st.alive and ready.get("status") != "Unknown" and now - st.last_heartbeat > grace:
                self._update_node_ready(name, "Unknown", "NodeStatusUnknown",
                                        "Kubelet stopped posting node status.")
                self.note("node_unknown", name)
                ready = {"status": "Unknown"}
            since = st.taint_times.get(UNREACHABLE if ready.get("status") == "Unknown" else NOT_READY)
            if ready.get("status") in ("Unknown", "False") and since is not None \
                    and now - since >= self.timings.real(self.timings.node_monitor_period) \
                    and name not in self._marked_not_ready:
                self._mark_pods_not_ready(name)
            elif ready.get("status") == "True":
                self._marked_not_ready.discard(name)

    def _mark_pods_not_ready(self, name: str) -> None:
        """pkg/controller/util/node/controller_utils.go MarkPodsNotReady: only an existing Ready
        condition flips to False (UpdateStatus), its reason untouched; nothing else changes."""
        self._marked_not_ready.add(name)
        pods, _ = self.store.list("pods", None, lambda p: p["spec"].get("nodeName") == name)
        for p in pods:
            if _is_terminal(p) or not any(c.get("type") == "Ready" for c in p["status"].get("conditions") or []):
                continue

            def flip(o: Obj) -> None:
                conds = []
                for c in o["status"].get("conditions") or []:
                    if c.get("type") == "Ready" and c.get("status") != "False":
                        c = {**c, "status": "False", "lastTransitionTime": now_rfc3339()}
                    conds.append(c)
                o["status"]["conditions"] = conds
            self._try(lambda p=p: self.store.update("pods", p["metadata"]["namespace"], p["metadata"]["name"], flip))
        self.note("pods_marked_not_ready", name)

    # --- taint manager -------------------------------------------------------------------------
    def _taint_manager(self) -> None:
        now = time.monotonic()
        nodes, _ = self.store.list("nodes")
        for n in nodes:
            taints = [t for t in n["spec"].get("taints") or [] if t["effect"] == "NoExecute"]
            if not taints:
                continue
            name = n["metadata"]["name"]
            st = self.nodes.get(name)
            pods, _ = self.store.list("pods", None, lambda p, name=name: p["spec"].get("nodeName") == name)
            for p in pods:
                if p["metadata"].get("deletionTimestamp"):
                    continue
                evict_at = None
                for t in taints:
                    tol = tolerates(p, t)
                    if tol is None:
                        evict_at = now
                        break
                    if tol.get("tolerationSeconds") is not None:
                        added = (st.taint_times.get(t["key"], now) if st else now)
                        at = added + self.timings.real(float(tol["tolerationSeconds"]))
                        evict_at = at if evict_at is None else min(evict_at, at)
                if evict_at is None or now < evict_at:
                    continue
                ns, pname = p["metadata"]["namespace"], p["metadata"]["name"]
                self.store.update("pods", ns, pname, lambda o: o["status"].__setitem__(
                    "conditions", _set_condition(o["status"].get("conditions") or [], {
                        "type": "DisruptionTarget", "status": "True",
                        "reason": "DeletionByTaintManager",
                        "message": "Taint manager: deleting due to NoExecute taint"})))
                self.api.delete_pod(ns, pname, None)
                self.note("taint_evicted", pname)

    # --- pod GC --------------------------------------------------------------------------------
    def _pod_gc(self) -> None:
        nodes, _ = self.store.list("nodes")
        by_name = {n["metadata"]["name"]: n for n in nodes}
        pods, _ = self.store.list("pods")
        for p in pods:
            nn = p["spec"].get("nodeName")
            if not nn:
                continue
            node = by_name.get(nn)
            orphaned = node is None
            oos = node is not None and any(t["key"] == OUT_OF_SERVICE for t in node["spec"].get("taints") or []) \
                and p["metadata"].get("deletionTimestamp") is not None
            if not (orphaned or oos):
                continue
            ns, pname = p["metadata"]["namespace"], p["metadata"]["name"]

            def mark(o: Obj, orphaned: bool = orphaned) -> None:
                o["status"]["conditions"] = _set_condition(o["status"].get("conditions") or [], {
                    "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists" if orphaned else
                    "PodGC: node is out of service"})
                if not _is_terminal(o):
                    o["status"]["phase"] = "Failed"
            self._try(lambda ns=ns, pname=pname, mark=mark: self.store.update("pods", ns, pname, mark))
            self._try(lambda ns=ns, pname=pname: self.store.remove("pods", ns, pname))
            self.pods.pop(p["metadata"]["uid"], None)
            self.note("podgc_deleted", pname)
