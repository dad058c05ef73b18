"""Helpers for backend simulations: poll a backend until a condition holds; run a Supervisor on
a thread while the test drives the fake cluster."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from orchestrator.backends.base import PROGRESS, Event, Observation
from orchestrator.state import LocalRunStore, RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView


class Collector:
    """Accumulates every event a backend reports across polls."""

    def __init__(self, backend, ref):
        self.backend, self.ref = backend, ref
        self.events: list[Event] = []
        self._last: Observation | None = None

    @property
    def last(self) -> Observation:
        """The latest poll's observation (until() polls before each test of its predicate)."""
        assert self._last is not None, "read before the first poll()"
        return self._last

    def poll(self) -> Observation:
        self._last = self.backend.poll(self.ref)
        self.events.extend(self._last.events)
        return self._last

    def until(self, pred: Callable[["Collector"], object], timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if pred(self):
                return True
            time.sleep(0.02)
        self.poll()
        return bool(pred(self))

    def kinds(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def progress(self) -> list[dict[str, Any]]:
        """The payloads of the progress events so far (each one carries its line's payload)."""
        out = []
        for e in self.kinds(PROGRESS):
            assert e.progress is not None, e
            out.append(e.progress)
        return out


def run_supervisor(sup: Supervisor) -> tuple[threading.Thread, dict]:
    """Start ``sup.run()`` on a daemon thread; return the thread and a dict that gets the run's
    outcome under "outcome" when it returns. The test drives the cluster, joins the thread and
    asserts it ended (``not thread.is_alive()``) before it reads the outcome."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("outcome", sup.run()), daemon=True)
    thread.start()
    return thread, result


def start_supervisor(spec: Any, backend: Any, profile: Any = None,
                     spec_path: str = "sim.yaml") -> tuple[threading.Thread, dict, LocalRunStore, list[str]]:
    """A watcher of ``spec`` on ``backend`` as `wmctl submit --auto-resume` runs one (a fresh
    record in the local run store, polling every 0.02 s), started on a thread (run_supervisor).
    Returns the thread, the result dict, the store and the lines it says."""
    store = LocalRunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path=spec_path, overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[str] = []
    sup = Supervisor(spec, profile or load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    thread, result = run_supervisor(sup)
    return thread, result, store, lines


def running_pods(fake_api, job: str) -> list[dict]:
    """The fake cluster's Running pods of Job ``job``."""
    return [p for p in fake_api.store.list("pods")[0]
            if p["metadata"]["labels"].get("job-name") == job and p["status"].get("phase") == "Running"]


def node_of_index(pods: list[dict], index: int) -> str:
    """The node the pod of completion index ``index`` runs on."""
    return next(p["spec"]["nodeName"] for p in pods
                if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == str(index))


def backdate_lease(fake_api, run: str, seconds: float, *, namespace: str) -> None:
    """The holder's last beat on run's cluster store (in ``namespace``) was ``seconds`` ago (as if
    it died then)."""
    def age(cm):
        lease = json.loads(cm["data"]["lease.json"])
        lease["beat"] -= seconds
        cm["data"]["lease.json"] = json.dumps(lease)
    fake_api.store.update("configmaps", namespace, f"wmctl-run-{run}.lease", age)
