"""A run's state kept in the cluster (a RunStore of ConfigMaps), for watchers that outlive a laptop.

With ``WMCTL_RUN_STORE=kubernetes`` every wmctl process keeps and reads run state in the cluster,
in the namespace ``WMCTL_RUN_STORE_NAMESPACE`` (default: the pod's own namespace in a pod, else
the kubeconfig context's, else ``default``). Then `wmctl status/logs/cancel/watch` from any
machine with the kubeconfig read and act on the same run, and a watcher that died (a closed
laptop, a rescheduled watcher pod) is replaced by one that adopts the running attempt instead of
submitting another.

One run's objects, each labelled ``wmctl.io/run=<run>`` and ``wmctl.io/store=<part>``:

    wmctl-run-<run>              record.json: the RunRecord (a replace is atomic: old or new)
    wmctl-run-<run>.lease        the watcher lease (holder, pid, host, started, beat)
    wmctl-run-<run>.reconcile    the readers' gate: a `status`/`list` folding what it saw into the record
    wmctl-run-<run>.cancel       the cancel intent; created once, so the first canceller wins
    wmctl-run-<run>.m-<n>        kept progress events, JSON lines, a chunk at most CHUNK_BYTES
    wmctl-run-<run>.log-<a>-<n>  a torn-down node's output, its last LOG_TAIL_BYTES

The lease follows client-go's leader election (k8s.io/client-go/tools/leaderelection,
leaderelection.go tryAcquireOrRenew): read the lock object; a holder that renewed within the lease
duration keeps it; otherwise take it with an update that carries the resourceVersion just read,
so of two candidates the API server lets one win and answers the other 409 Conflict (optimistic
concurrency: "Resource versions" in the API concepts documentation). A renewal that meets a
conflict means another watcher took a lease this one let go stale: this one stops (RunExists)
rather than supervise beside it. Unlike client-go, a one-shot reader (`wmctl status`) has no
observation window, so staleness is judged from the beat's own timestamp, as the local store does
for a run folder shared between hosts: clocks must roughly agree (LEASE_STALE_S is 60 s).

Readers (`status`, `list`) never take the lease. One that reconciles a run nobody watches does it
behind the readers' gate, taken the same way (create, or replace carrying the resourceVersion
read): it takes the gate, then looks at the lease; a starting watcher takes the lease, then waits
for the gate to be free. Whichever order their writes reach the API server in, either the reader
sees the watcher's lease and records nothing, or the watcher waits for the reader's record and
decides from it: never both, and never a watcher refused because someone looked. A gate held
longer than READER_RECONCILE_S is a reader that died with it: free.

Each write of a ConfigMap is a write of the whole object to etcd, so step events (one a step, each
rewriting its chunk) are written together every METRICS_FLUSH_S, when the watcher beats or lets
go, while the events that tell the run's story (start, checkpoint, resume, failure, exit) are
written at once: a watcher that dies loses at most that many seconds of step lines, which the
job's own log still holds.

ConfigMaps hold at most 1 MiB of data (pkg/apis/core/validation/validation.go ValidateConfigMap,
MaxSecretSize, which the API server enforces for ConfigMaps too): events are kept in chunks and a
node's log by its tail.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

from ... import labels as L
from ...adaptors.kubernetes import api_exception, api_status, load_api_client, sdk, single_try
from ...resources import rbac_manifest
from ...errors import BackendError, EngineUnavailable, RunExists, RunNotFound
from ...exclusions import Exclusion, ExclusionStore, decode, encode
from ...state import (LEASE_BEAT_S, LEASE_STALE_S, READER_QUEUE_S, READER_RECONCILE_S, Lease, RunRecord, RunStore,
                      parse_metrics, parse_record)
from .client import call_json
from .credentials import Credentials, describe_source

ENV_NAMESPACE = "WMCTL_RUN_STORE_NAMESPACE"
ENV_CONTEXT = "WMCTL_RUN_STORE_CONTEXT"
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
STORE_LABEL = "wmctl.io/store"
CHUNK_BYTES = 256 * 1024
METRICS_FLUSH_S = 10.0          # step events wait at most this long for one write of their chunk
LOG_TAIL_BYTES = 512 * 1024
RECORD_KEY, LEASE_KEY, CANCEL_KEY, EVENTS_KEY, LOG_KEY = "record.json", "lease.json", "cancel.json", "events", "log"
GATE_KEY = "reconcile.json"
GATE_POLL_S = 0.2               # how often a reader or a starting watcher looks at the gate again


def store_namespace(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get(ENV_NAMESPACE):
        return env[ENV_NAMESPACE]
    try:
        with open(POD_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        pass
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, current = config.list_kube_config_contexts()
    except (ConfigException, OSError, ValueError):
        return "default"         # no usable kubeconfig: loading the API client says why
    want = env.get(ENV_CONTEXT)
    chosen = next((c for c in contexts or [] if c.get("name") == want), None) if want else current
    return ((chosen or {}).get("context") or {}).get("namespace") or "default"


def store_client(context: str | None = None) -> Any:
    """The run store's own ApiClient, made as the engine's is (cluster.Cluster.api_client): a 401
    loads the kubeconfig (or the in-cluster service account) again and sends the request once
    more (credentials.py: a tokenFile rewritten, an oidc id-token or an exec plugin's certificate
    renewed), and retries are client.call's alone. A watcher's lease beats through this client for
    as long as the run lasts: without the reload an expired token cost it the lease."""
    client = load_api_client(context)
    source, _ = describe_source(context, None, None)
    Credentials(client, lambda: load_api_client(context), source).install()
    return single_try(client)


def _call(fn: Any, *args: Any, what: str, **kwargs: Any) -> Any:
    """``call_json``, with a refusal by RBAC said in one line (the callers read 404/409 themselves)."""
    try:
        return call_json(fn, *args, what=what, **kwargs)
    except api_exception() as exc:
        if api_status(exc) not in (401, 403):
            raise
        raise BackendError(f"Kubernetes refused to {what}: {api_status(exc)} {getattr(exc, 'reason', '')}".rstrip(),
                           hint="run state kept in the cluster needs get/list/create/update/delete on ConfigMaps "
                                f"there (the built-in `edit` role, or {rbac_manifest()}); or unset "
                                "WMCTL_RUN_STORE to keep it on this machine") from None


class ClusterRunStore(RunStore):
    """The RunStore interface over ConfigMaps in one namespace (see the module's docstring)."""

    def __init__(self, run: str, *, api_client: Any = None, namespace: str | None = None):
        super().__init__(run)
        self.namespace = namespace or store_namespace()
        self._client = api_client
        self._lease: Lease | None = None
        self._lease_rv: str | None = None
        self._chunk: tuple[int, str] | None = None      # (index, text) of the metrics chunk being filled
        self._unwritten: list[str] = []                  # step events waiting for the next write
        # When the chunk was last written (monotonic); never yet, so the first event goes at once.
        # Not 0.0: monotonic() counts from boot, and a watcher started within METRICS_FLUSH_S of
        # its machine's boot would hold its first events back.
        self._written_at = float("-inf")
        self._lost: str | None = None                   # why this watcher's lease is gone: it writes no more

    # --- plumbing --------------------------------------------------------------------------------
    def _core(self) -> Any:
        if self._client is None:
            self._client = store_client(os.environ.get(ENV_CONTEXT) or None)
        return sdk().CoreV1Api(self._client)

    def name(self, part: str = "") -> str:
        # A dot before the part: run names are DNS labels (no dot), so run `x`'s `x.lease` can
        # never be the record of a run named `x-lease` (a ConfigMap name may hold dots).
        return f"wmctl-run-{self.run}" + (f".{part}" if part else "")

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return _call(self._core().read_namespaced_config_map, name, self.namespace,
                             what=f"read ConfigMap {self.namespace}/{name}")
        except api_exception() as exc:
            if exc.status == 404:
                return None
            raise

    def _body(self, name: str, part: str, data: dict[str, str], rv: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace,
                                "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE, L.RUN: self.run, STORE_LABEL: part}}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}

    def _create(self, name: str, part: str, data: dict[str, str]) -> dict[str, Any]:
        return _call(self._core().create_namespaced_config_map, self.namespace, self._body(name, part, data),
                         what=f"create ConfigMap {self.namespace}/{name}")

    def _replace(self, name: str, part: str, data: dict[str, str], rv: str | None = None) -> dict[str, Any]:
        return _call(self._core().replace_namespaced_config_map, name, self.namespace,
                         self._body(name, part, data, rv), what=f"replace ConfigMap {self.namespace}/{name}")

    def _put(self, name: str, part: str, data: dict[str, str]) -> None:
        """Create or replace, unconditionally: the last writer wins, as with a file renamed into place."""
        try:
            self._replace(name, part, data)
            return
        except api_exception() as exc:
            if exc.status != 404:
                raise
        try:
            self._create(name, part, data)
        except api_exception() as exc:
            if exc.status != 409:
                raise
            # Created meanwhile: by our own create whose answer was lost (its retry met it), or
            # by another writer. Last writer wins, as above.
            self._replace(name, part, data)

    def _list(self, part: str) -> list[dict[str, Any]]:
        sel = f"{L.RUN}={self.run},{STORE_LABEL}={part}"
        return _call(self._core().list_namespaced_config_map, self.namespace, label_selector=sel,
                         what=f"list ConfigMaps of run {self.run}")["items"]

    # --- the record ------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self._read(self.name()) is not None

    def load(self) -> RunRecord:
        cm = self._read(self.name())
        if cm is None:
            known = ", ".join(list_cluster_runs(self._core(), self.namespace)) or "none"
            raise RunNotFound(f"no run named {self.run!r} in namespace {self.namespace} (known runs: {known})")
        return parse_record(lambda: (cm.get("data") or {})[RECORD_KEY], self.run,
                            f"ConfigMap {self.namespace}/{self.name()}",
                            hint=f"the run's objects are untouched; look at it with `kubectl get configmap -n "
                                 f"{self.namespace} {self.name()} -o yaml`")

    def _guard(self) -> None:
        """Before a write: a watcher renews its lease if due (as every write can come after a long
        stall, a suspended laptop) and one that lost it writes nothing over its successor's state."""
        if self._lost:
            raise RunExists(self._lost, hint="this watcher stops so that two never supervise one run")
        self.beat()

    def save(self, record: RunRecord) -> None:
        self._guard()
        self._put(self.name(), "record", {RECORD_KEY: json.dumps(asdict(record), indent=1)})

    # --- the watcher lease -----------------------------------------------------------------------
    def _read_lease(self) -> tuple[Lease | None, str | None]:
        cm = self._read(self.name("lease"))
        if cm is None:
            return None, None
        rv = cm["metadata"].get("resourceVersion")
        try:
            d = json.loads((cm.get("data") or {})[LEASE_KEY])
            return Lease(int(d["pid"]), str(d["host"]), float(d["started"]), float(d["beat"])), rv
        except (KeyError, ValueError, TypeError):
            return None, rv            # released (empty) or unreadable: free to take

    def _lease_data(self, lease: Lease) -> dict[str, str]:
        return {LEASE_KEY: json.dumps(asdict(lease))}

    def acquire_watcher(self) -> str | None:
        if self._lease is not None:
            return None
        held, rv = self._read_lease()
        note = None
        if held is not None:
            if held.age() < LEASE_STALE_S:
                raise RunExists(f"run {self.run!r} is already {held.describe()}",
                                hint="stop that watcher first, or use `wmctl status` to look without acting; its "
                                     f"lease goes stale {LEASE_STALE_S:.0f} s after its last beat")
            note = f"took over the stale lease of {held.pid}@{held.host} (last beat {held.age():.0f}s ago)"
        mine = Lease.mine()
        try:
            if rv is None:
                made = self._create(self.name("lease"), "lease", self._lease_data(mine))
            else:
                made = self._replace(self.name("lease"), "lease", self._lease_data(mine), rv)
        except api_exception() as exc:
            if exc.status not in (409,):
                raise
            # Another watcher created or renewed the lease between our read and our write; or our
            # own write was applied and only its answer lost (the retry met the new version).
            other, other_rv = self._read_lease()
            if other == mine:
                self._lease, self._lease_rv, self._lost = mine, other_rv, None
                return note
            who = other.describe() if other else "another watcher"
            raise RunExists(f"run {self.run!r} is already {who}",
                            hint="stop that watcher first, or use `wmctl status` to look without acting") from None
        self._lease, self._lease_rv, self._lost = mine, made["metadata"].get("resourceVersion"), None
        # A reader that took the gate before this lease was written may be recording what it saw
        # of the run: let it finish, so this watcher reads that and decides from it.
        deadline = time.monotonic() + READER_RECONCILE_S
        while self._gate_holder() is not None:
            if time.monotonic() >= deadline:
                self.release_watcher()
                raise RunExists(f"run {self.run!r} is being checked by `wmctl status` or `list` for over "
                                f"{READER_RECONCILE_S:.0f} s (the cluster answers slowly)",
                                hint=f"try again in a moment; `wmctl status {self.run}` shows what it recorded")
            time.sleep(GATE_POLL_S)
        return note

    # --- the readers' gate -----------------------------------------------------------------------
    def _read_gate(self) -> tuple[dict[str, Any] | None, str | None, bool]:
        """(the reader holding the gate, None when it is free or its holder stale; the object's
        resourceVersion; whether the object exists)."""
        cm = self._read(self.name("reconcile"))
        if cm is None:
            return None, None, False
        rv = cm["metadata"].get("resourceVersion")
        try:
            held = json.loads((cm.get("data") or {})[GATE_KEY])
            age = time.time() - float(held["time"])
        except (KeyError, ValueError, TypeError):
            return None, rv, True          # let go (empty) or unreadable: free
        return (held if isinstance(held, dict) and age < READER_RECONCILE_S else None), rv, True

    def _gate_holder(self) -> dict[str, Any] | None:
        return self._read_gate()[0]

    def _take_gate(self) -> str | None:
        """Take the readers' gate if it is free: its new resourceVersion, or None when another
        reader holds it (or took it between our read and our write)."""
        held, rv, exists = self._read_gate()
        if held is not None:
            return None
        mine = Lease.mine()
        data = {GATE_KEY: json.dumps({"pid": mine.pid, "host": mine.host, "time": mine.beat})}
        try:
            made = (self._replace(self.name("reconcile"), "reconcile", data, rv) if exists
                    else self._create(self.name("reconcile"), "reconcile", data))
        except api_exception() as exc:
            if exc.status != 409:
                raise
            return None
        return str(made["metadata"].get("resourceVersion") or "")

    @contextmanager
    def reconciling(self) -> Iterator[str | None]:
        """Behind the readers' gate, never the watcher's lease (see the module's docstring): a
        watcher starting meanwhile waits for this reader instead of being refused."""
        deadline = time.monotonic() + READER_QUEUE_S
        try:
            rv = self._take_gate()
            while rv is None and time.monotonic() < deadline:
                time.sleep(GATE_POLL_S)
                rv = self._take_gate()
        except EngineUnavailable:
            raise
        except BackendError as exc:     # RBAC (401/403, see _call): may read the run, not write it
            yield (f"not checked against where it runs: {exc.message}; only a user who may write "
                   f"ConfigMaps in namespace {self.namespace} records its true state")
            return
        if rv is None:
            yield ""                    # another reader is still at it: the record as it stands
            return
        try:
            yield "" if self.lease() is not None else None
        finally:
            try:
                self._replace(self.name("reconcile"), "reconcile", {}, rv or None)
            except api_exception() as exc:
                if exc.status not in (404, 409):     # gone, or taken over as stale: not ours to free
                    raise

    def beat(self) -> None:
        if self._unwritten and time.monotonic() - self._written_at >= METRICS_FLUSH_S:
            self.flush_metrics()
        if self._lease is None or time.time() - self._lease.beat < LEASE_BEAT_S:
            return
        renewed = Lease.mine(started=self._lease.started)
        try:
            made = self._replace(self.name("lease"), "lease", self._lease_data(renewed), self._lease_rv)
        except api_exception() as exc:
            if exc.status not in (404, 409):
                raise
            other, other_rv = self._read_lease()
            if other == renewed:      # applied, its answer lost: the retry met our own new version
                self._lease, self._lease_rv = renewed, other_rv
                return
            self._lease = None
            who = other.describe() if other else "nobody (the lease was deleted)"
            self._lost = f"run {self.run!r} lost its watcher lease: now {who}"
            raise RunExists(self._lost,
                            hint="this watcher stops so that two never supervise one run; `wmctl status` "
                                 "shows who watches it") from None
        self._lease, self._lease_rv = renewed, made["metadata"].get("resourceVersion")

    def release_watcher(self) -> None:
        try:
            self.flush_metrics()
        except (api_exception(), BackendError):
            self._unwritten = []          # not kept: the job's own log still holds those step lines
        if self._lease is None:
            return
        try:
            self._replace(self.name("lease"), "lease", {}, self._lease_rv)
        except api_exception() as exc:
            if exc.status not in (404, 409):    # gone, or already someone else's: nothing of ours to give up
                raise
        self._lease = self._lease_rv = None

    def lease(self) -> Lease | None:
        if self._lease is not None:
            return self._lease
        held, _ = self._read_lease()
        return held if held is not None and held.age() < LEASE_STALE_S else None

    def watcher_log(self) -> Path:
        """A detached watcher's lines stay on the machine that started it (in a pod: its stdout)."""
        return Path(tempfile.gettempdir()) / f"wmctl-{self.run}-watcher.log"

    # --- cancel ----------------------------------------------------------------------------------
    def request_cancel(self, *, by: str, graceful: bool) -> dict[str, Any]:
        intent = {"time": time.time(), "by": by, "graceful": graceful}
        try:
            self._create(self.name("cancel"), "cancel", {CANCEL_KEY: json.dumps(intent)})
            return intent
        except api_exception() as exc:
            if exc.status != 409:
                raise
        return self.cancel_intent() or intent      # the first canceller's intent stands

    def cancel_intent(self) -> dict[str, Any] | None:
        cm = self._read(self.name("cancel"))
        if cm is None:
            return None
        try:
            data = json.loads((cm.get("data") or {})[CANCEL_KEY])
        except (KeyError, ValueError, TypeError):
            return {"time": time.time(), "by": "an unreadable cancel ConfigMap", "graceful": False}
        return data if isinstance(data, dict) else {"time": time.time(), "by": "?", "graceful": False}

    # --- metrics ---------------------------------------------------------------------------------
    def _chunks(self) -> list[tuple[int, str]]:
        out = []
        for cm in self._list("metrics"):
            suffix = cm["metadata"]["name"].rsplit("-", 1)[-1]
            if suffix.isdigit():
                out.append((int(suffix), (cm.get("data") or {}).get(EVENTS_KEY, "")))
        return sorted(out)

    def append_metric(self, event: dict[str, Any]) -> None:
        self._guard()
        self._unwritten.append(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
        if event.get("event") != "step" or time.monotonic() - self._written_at >= METRICS_FLUSH_S:
            self.flush_metrics()

    def flush_metrics(self) -> None:
        """Write the events kept back (one write per chunk they fill)."""
        if not self._unwritten:
            return
        if self._chunk is None:
            chunks = self._chunks()
            self._chunk = chunks[-1] if chunks else (0, "")
        index, text = self._chunk
        for line in self._unwritten:
            if text and len(text.encode()) + len(line.encode()) > CHUNK_BYTES:
                self._put(self.name(f"m-{index}"), "metrics", {EVENTS_KEY: text})
                index, text = index + 1, ""
            text += line
        self._put(self.name(f"m-{index}"), "metrics", {EVENTS_KEY: text})
        self._chunk, self._unwritten, self._written_at = (index, text), [], time.monotonic()

    def metrics(self) -> list[dict[str, Any]]:
        return [item for _, text in self._chunks() for item in parse_metrics(text.splitlines())]

    # --- logs of torn-down nodes -----------------------------------------------------------------
    def archive_log(self, attempt: int, node: int, data: bytes) -> None:
        self._guard()
        tail = data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")
        cut = len(data) > LOG_TAIL_BYTES
        encoded = tail.encode("utf-8")
        if len(encoded) > LOG_TAIL_BYTES:        # each undecodable byte became U+FFFD: three bytes
            tail, cut = encoded[-LOG_TAIL_BYTES:].decode("utf-8", errors="ignore"), True
        if cut:
            tail = tail.split("\n", 1)[-1]       # start on a whole line
        self._put(self.name(f"log-{attempt}-{node}"), "log", {LOG_KEY: tail})

    def archived_log(self, attempt: int, node: int) -> list[str] | None:
        cm = self._read(self.name(f"log-{attempt}-{node}"))
        if cm is None:
            return None
        return (cm.get("data") or {}).get(LOG_KEY, "").splitlines()

    # --- delete ----------------------------------------------------------------------------------
    def delete(self) -> None:
        # The record goes first: without it there is no run (list_cluster_runs), whatever is left.
        names = [self.name()] + [cm["metadata"]["name"] for part in ("lease", "reconcile", "cancel", "metrics", "log")
                                 for cm in self._list(part)]
        for name in names:
            try:
                _call(self._core().delete_namespaced_config_map, name, self.namespace,
                          what=f"delete ConfigMap {self.namespace}/{name}")
            except api_exception() as exc:
                if api_status(exc) != 404:
                    raise


def open_store(run: str) -> ClusterRunStore:
    return ClusterRunStore(run)


def list_runs() -> list[str]:
    return list_cluster_runs()


def list_cluster_runs(core: Any = None, namespace: str | None = None) -> list[str]:
    """Runs whose record is kept in ``namespace``."""
    ns = namespace or store_namespace()
    if core is None:
        core = sdk().CoreV1Api(store_client(os.environ.get(ENV_CONTEXT) or None))
    items = _call(core.list_namespaced_config_map, ns, label_selector=f"{STORE_LABEL}=record",
                      what=f"list runs in namespace {ns}")["items"]
    return sorted(((cm["metadata"].get("labels") or {}).get(L.RUN, "") for cm in items), key=str)



# --- remembered exclusions (orchestrator/exclusions.py), beside the runs --------------------------

EXCLUSIONS_NAME = "wmctl-exclusions"     # no run's object: those are all wmctl-run-<run>...
EXCLUSIONS_KEY = "exclusions.json"
EXCLUSIONS_TRIES = 20                    # writers racing on one object: each retry reads it again,
EXCLUSIONS_BACKOFF_S = 0.05              # after a random pause of up to this much times the tries so far


class ClusterExclusionStore(ExclusionStore):
    """The remembered exclusions of every cluster in one ConfigMap of the run store's namespace,
    changed with a replace that carries the resourceVersion read (a racing writer's 409 makes this
    one read again): the ConfigMap's own lock, as the watcher lease takes it."""

    def __init__(self, *, api_client: Any = None, namespace: str | None = None):
        self._cms = ClusterRunStore("", api_client=api_client, namespace=namespace)
        self.where = f"ConfigMap {self._cms.namespace}/{EXCLUSIONS_NAME}"

    def _get(self) -> tuple[list[Exclusion], str | None, bool]:
        cm = self._cms._read(EXCLUSIONS_NAME)
        if cm is None:
            return [], None, False
        text = (cm.get("data") or {}).get(EXCLUSIONS_KEY, "")
        return decode(text, self.where), cm["metadata"].get("resourceVersion"), True

    def load(self) -> list[Exclusion]:
        return self._get()[0]

    def update(self, change: Callable[[list[Exclusion]], list[Exclusion]]) -> list[Exclusion]:
        for tries in range(EXCLUSIONS_TRIES):
            if tries:
                time.sleep(random.uniform(0, EXCLUSIONS_BACKOFF_S * tries))
            entries, rv, exists = self._get()
            new = change(entries)
            data = {EXCLUSIONS_KEY: encode(new)}
            try:
                if exists:
                    self._cms._replace(EXCLUSIONS_NAME, "exclusions", data, rv)
                else:
                    self._cms._create(EXCLUSIONS_NAME, "exclusions", data)
                return new
            except api_exception() as exc:
                if exc.status != 409:
                    raise
        raise BackendError(f"could not change {self.where}: {EXCLUSIONS_TRIES} writers raced for it",
                           hint="try again")


def open_exclusions() -> ClusterExclusionStore:
    return ClusterExclusionStore()
