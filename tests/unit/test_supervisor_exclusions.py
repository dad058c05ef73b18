"""The supervisor remembers a node it left for a node failure (restart.remember_exclusions) and
the next run on the same cluster avoids it from its first attempt; nothing else is remembered,
another cluster's memory is never applied, and a remembered node never keeps a job from being placed."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import exclusions as X
from orchestrator.backends import base as b

from .test_supervisor import START, done, progress, running, supervise, waiting

DAY = 24 * 3600.0


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    monkeypatch.delenv("WMCTL_RUN_STORE", raising=False)
    return tmp_path


def lose_host_1(kind=b.NODE_LOST, reason="NodeNotReady"):
    return {0: [([progress("checkpoint", 10)], running()),
                ([progress("step", 12), b.Event(kind, START + 1, 1, "host-1", reason=reason)], running())],
            1: [([progress("resume", 10)], running()), ([progress("step", 20)], done())]}


def test_a_lost_node_is_remembered_and_the_next_run_avoids_it_from_its_first_attempt(home):
    outcome, _, record, lines, clock = supervise(lose_host_1(), remembers="https://a:6443")
    assert outcome.exit_code == 0, record.final_report
    [kept] = X.active(X.LocalExclusionStore().load(), "https://a:6443", clock())
    assert (kept.node, kept.kind, kept.run, kept.attempt) == ("host-1", "node_lost", "sup", 0)
    assert kept.expires == kept.at + DAY and kept.evidence
    assert any("host-1 remembered as excluded on https://a:6443 for 24 h" in ln for ln in lines), lines
    # the next run, on the same cluster: its attempt 0 already keeps off host-1, and says why
    outcome, backend, record, lines, _ = supervise({0: [([progress("step", 3)], done())]}, remembers="https://a:6443")
    assert outcome.exit_code == 0
    assert backend.submitted[0].excluded_nodes == ("host-1",)
    assert record.attempts[0].remembered_nodes == ["host-1"]
    assert any("remembered exclusions applied" in ln and "host-1 (node_lost in run sup attempt 0)" in ln
               for ln in lines), lines
    # ... and a run on another cluster does not
    _, backend, _, _, _ = supervise({0: [([progress("step", 3)], done())]}, remembers="https://b:6443")
    assert backend.submitted[0].excluded_nodes == ()


def test_a_preemption_is_never_remembered(home):
    outcome, backend, record, _, _ = supervise(lose_host_1(b.EVICTED, "Evicted"), remembers="c")
    assert record.attempts[0].outcome == "preempted"
    assert X.LocalExclusionStore().load() == []


def test_off_when_remember_exclusions_is_0_or_the_backend_runs_no_machines(home):
    outcome, backend, record, _, _ = supervise(lose_host_1(), remembers="c", restart={"remember_exclusions": "0"})
    assert outcome.exit_code == 0 and backend.submitted[1].excluded_nodes == ("host-1",)   # this run's own stays
    assert X.LocalExclusionStore().load() == []
    supervise(lose_host_1())              # a backend whose nodes are not machines
    assert X.LocalExclusionStore().load() == []


def test_a_remembered_node_that_leaves_no_room_is_dropped_with_a_warning(home):
    supervise(lose_host_1(), remembers="c")
    pending = [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.PENDING)]
    outcome, backend, record, lines, _ = supervise({
        0: [([waiting(START + 2)], pending)],
        1: [([progress("step", 5)], done())],
    }, restart={"pending_timeout": "5s"}, remembers="c")
    assert outcome.exit_code == 0, record.final_report
    assert backend.submitted[0].excluded_nodes == ("host-1",) and backend.submitted[1].excluded_nodes == ()
    assert any("warning: remembered exclusions of host-1 dropped" in ln for ln in lines), lines


def test_a_node_lost_while_nobody_watched_is_remembered_when_a_watcher_takes_the_run_up(home):
    from orchestrator.state import AttemptRecord, LocalRunStore, RunRecord
    from orchestrator.supervisor import Supervisor, SupervisorOptions
    from orchestrator.vendors import load_profile
    from orchestrator.watchview import EchoView

    from .test_supervisor import Clock, ScriptedBackend, spec_from

    spec = spec_from({"name": "sup", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 4, "backoff": "0s", "heartbeat_timeout": "60s"}})
    clock = Clock()
    backend: Any = ScriptedBackend(clock, {1: [([progress("resume", 10)], running()),
                                               ([progress("step", 20)], done())]})
    backend.remembers_exclusions, backend.cluster = True, "c"
    record = RunRecord(run=spec.name, backend=backend.name, spec_path="sup.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    record.attempts.append(AttemptRecord(attempt=0, submitted_at=START - 100, outcome="node_lost",
                                         decision="retry_elsewhere", failed_node=1, failed_host="host-1",
                                         ended_at=START - 10, last_checkpoint_step=10, evidence="vanished"))
    store = LocalRunStore(spec.name)
    store.save(record)
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(list[str]().append),
                     SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0))
    assert sup.run().exit_code == 0
    [kept] = X.active(X.LocalExclusionStore().load(), "c", START)
    assert (kept.node, kept.kind, kept.evidence, kept.attempt) == ("host-1", "node_lost", "vanished", 0)
    assert backend.submitted[1].excluded_nodes == ("host-1",)
    assert backend.submitted[1].remembered_nodes == ()       # the run's own, not a remembered one


def test_remembered_nodes_that_would_leave_too_few_usable_ones_are_dropped_before_submitting(home):
    """The backend says which nodes could take the job; host-2 (older) and host-1 are remembered.
    With four usable nodes both stay excluded (two left for two); with three, the older goes
    before anything is submitted, with a warning: no attempt waits to be found unschedulable."""
    for host, at in (("host-2", START - 50), ("host-1", START - 10)):
        X.remember(node=host, cluster="c", kind="device_fault", evidence="Xid 79", run="old", attempt=0,
                   ttl_s=DAY, now=at)
    from . import test_supervisor as T

    T.ScriptedBackend.placeable = frozenset({"host-0", "host-1", "host-2", "host-3"})
    try:
        outcome, backend, record, lines, _ = supervise({0: [([progress("step", 3)], done())]}, remembers="c",
                                                       restart={"spares": 0})
    finally:
        T.ScriptedBackend.placeable = None
    assert outcome.exit_code == 0
    assert backend.submitted[0].excluded_nodes == ("host-2", "host-1")      # oldest first; 4 - 2 = 2 needed
    T.ScriptedBackend.placeable = frozenset({"host-1", "host-2", "host-3"})
    try:
        outcome, backend, record, lines, _ = supervise({0: [([progress("step", 3)], done())]}, remembers="c")
    finally:
        T.ScriptedBackend.placeable = None
    assert backend.submitted[0].excluded_nodes == ("host-1",)                # the older, host-2, went
    assert any("warning: remembered exclusions of host-2 dropped" in ln for ln in lines), lines
