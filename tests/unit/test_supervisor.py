"""The supervisor's decisions against a scripted backend and a fake clock.

The scripted backend is a stand-in for local, Docker and Kubernetes (which the fault matrices in
tests/integration, tests/docker and tests/kube drive for real); here each attempt replays a list
of observations, so every branch of the retry loop is checked in milliseconds: what is torn down
and when, what the next attempt is told (resume, excluded nodes), and why the loop stops.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.backends import base as b
from orchestrator.errors import EngineUnavailable
from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.vendors import load_profile
from orchestrator.watchview import EchoView, News

from .helpers import spec_from

START = 1000.0


@dataclass
class FakePlan:
    run: str
    attempt: int
    ctx: object


class Clock:
    def __init__(self, on_sleep=None):
        self.now = START
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(self)


def running(n=2):
    return [b.NodeStatus(i, b.RUNNING, f"host-{i}") for i in range(n)]


def done(n=2):
    return [b.NodeStatus(i, b.SUCCEEDED, f"host-{i}", 0) for i in range(n)]


def progress(event, step, t=START):
    return b.Event(b.PROGRESS, t, 0, "host-0", progress={"event": event, "step": step})


class ScriptedBackend:
    """Replays, per attempt, a list of (events, nodes); the last node states then repeat. It has
    what the supervisor calls of a Backend, not the class: the tests hold it as Any."""

    name = "scripted"
    places_nodes = True
    remembers_exclusions = False
    spares = False                  # inplace.py asks both before it calls a spare method
    replenishes_spares = False
    cluster: str | None = None

    placeable: frozenset[str] | None = None

    def cluster_key(self) -> str | None:
        return self.cluster

    def placeable_hosts(self, spec) -> frozenset[str] | None:
        return self.placeable

    def __init__(self, clock: Clock, scripts: dict[int, list[tuple[list[b.Event], list[b.NodeStatus]]]]):
        self.clock, self.scripts = clock, scripts
        self.calls: list[tuple] = []
        self.submitted: dict[int, object] = {}
        self.notes: dict[int, list[str]] = {}     # attempt -> what its teardown went on without

    def plan(self, spec, profile, ctx) -> FakePlan:
        return FakePlan(spec.name, ctx.attempt, ctx)

    def namespace_of(self, spec) -> None:
        return None

    def submit(self, plan: FakePlan) -> b.AttemptRef:
        self.calls.append(("submit", plan.attempt))
        self.submitted[plan.attempt] = plan.ctx
        return b.AttemptRef(self.name, plan.run, plan.attempt)

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        script = self.scripts[ref.attempt]
        if isinstance(script[0], Exception):
            raise script.pop(0)
        entry = script.pop(0)
        events, nodes = entry() if callable(entry) else entry
        if not script:                      # the last states hold, with nothing new
            script.append(([], nodes))
        return b.Observation(list(events), nodes)

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        self.calls.append(("cancel", ref.attempt))

    def cut_grace(self, ref: b.AttemptRef, dead_hosts: list[str]) -> None:
        self.cut = [*getattr(self, "cut", []), (ref.attempt, list(dead_hosts))]

    def release(self, ref: b.AttemptRef) -> None:
        self.calls.append(("release", ref.attempt))

    def teardown_notes(self, ref: b.AttemptRef) -> list[str]:
        return list(self.notes.get(ref.attempt, []))

    def attempts(self, run: str) -> list[b.AttemptRef]:
        return [b.AttemptRef(self.name, run, a) for a in sorted(self.submitted)]

    def close(self) -> None:
        self.calls.append(("close", None))

    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False, query: b.LogQuery | None = None):
        self.calls.append(("logs", node))
        return iter(self.output.get(node, []))

    output: dict[int, list[str]] = {}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    return tmp_path


def supervise(scripts, *, restart=None, auto_resume=True, places_nodes=True, on_sleep=None, clock_box=None,
              notes=None, profile=None, remembers=None):
    spec = spec_from({"name": "sup", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 4, "backoff": "0s", "heartbeat_timeout": "60s", **(restart or {})}})
    clock = Clock(on_sleep)
    if clock_box is not None:
        clock_box["clock"] = clock
    backend: Any = ScriptedBackend(clock, scripts)
    backend.places_nodes = places_nodes
    backend.notes = notes or {}
    if remembers is not None:          # nodes are machines of cluster ``remembers``
        backend.remembers_exclusions, backend.cluster = True, remembers
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend=backend.name, spec_path="sup.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=auto_resume)
    lines: list[str] = []
    sup = Supervisor(spec, profile or load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=auto_resume, clock=clock, sleep=clock.sleep, poll_interval=1.0))
    outcome = sup.run()
    return outcome, backend, store.load(), lines, clock


def test_node_loss_tears_down_then_resumes_elsewhere_and_succeeds(home):
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 10)], running()),
            ([progress("step", 12), b.Event(b.NODE_LOST, START + 1, 1, "host-1", reason="NodeNotReady")], running())],
        1: [([progress("resume", 10)], running()), ([progress("step", 20)], done())],
    })
    assert outcome.exit_code == 0 and record.status == "succeeded"
    # torn down before the next attempt exists; the finished attempt is released, not cancelled
    assert backend.calls == [("submit", 0), ("cancel", 0), ("submit", 1), ("release", 1)]
    assert backend.cut == [(0, ["host-1"])]      # a dead peer: the survivors' grace is cut first
    ctx = backend.submitted[1]
    assert ctx.resume and ctx.parent == 0 and ctx.excluded_nodes == ("host-1",)
    a0, a1 = record.attempts
    assert (a0.outcome, a0.decision, a0.failed_host) == ("node_lost", "retry_elsewhere", "host-1")
    assert (a1.outcome, a1.resumed_from_step) == ("succeeded", 10)
    assert "steps redone per failure: [2]" in record.final_report


def test_a_node_silent_past_node_silence_timeout_is_lost(home):
    """Rank 0's runtime reports node 1 silent (runtime/liveness.py); once it has been silent for
    restart.node_silence_timeout (15 s by default) the attempt fails node_lost on that host, long
    before the 10-minute heartbeat, and the attempt after resumes elsewhere."""
    silent = {"event": "node_silent", "group_rank": 1, "host": "host-1", "silent_s": 16.0, "time": START}
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 10)], running()),
            ([b.Event(b.PROGRESS, START, 0, "host-0", progress=silent)], running())],
        1: [([progress("resume", 10)], running()), ([progress("step", 20)], done())],
    })
    assert outcome.exit_code == 0
    a0 = record.attempts[0]
    assert (a0.outcome, a0.failed_host, a0.failed_node) == ("node_lost", "host-1", 1), a0.evidence
    assert "no liveness beat" in a0.evidence and backend.cut == [(0, ["host-1"])]


def test_what_a_teardown_went_on_without_is_said(home):
    """A step the backend could not do (a forbidden delete) is shown, and the run goes on."""
    note = "cannot delete Service ns/sup-a0: 403 services is forbidden"
    outcome, _, _, lines, _ = supervise({
        0: [([progress("checkpoint", 10), b.Event(b.NODE_LOST, START + 1, 1, "host-1")], running())],
        1: [([progress("resume", 10)], running()), ([progress("step", 20)], done())],
    }, notes={0: [note]})
    assert outcome.exit_code == 0
    assert f"attempt 0 teardown went on without a step: {note}" in lines


def test_app_error_stops_without_a_retry(home):
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_EXITED, START, 1, "host-1", exit_code=1)],
             [b.NodeStatus(0, b.RUNNING), b.NodeStatus(1, b.FAILED, exit_code=1)])],
    })
    assert outcome.exit_code == 7
    assert backend.calls == [("submit", 0), ("logs", 1), ("cancel", 0)]
    assert "is not retried (app_error)" in record.final_report


def test_preemption_resubmits_without_backoff_and_keeps_the_placement(home):
    outcome, backend, record, _, clock = supervise({
        0: [([progress("checkpoint", 7), progress("preempted", 7),
              b.Event(b.NODE_EXITED, START, 0, "host-0", exit_code=PREEMPTED_EXIT_CODE)], running())],
        1: [([progress("resume", 7)], done())],
    }, restart={"backoff": "30s"})
    assert outcome.exit_code == 0
    assert record.attempts[0].decision == "retry" and backend.submitted[1].excluded_nodes == ()
    assert 30.0 not in clock.slept


def test_preemptions_spend_no_retry_only_failed_attempts_count(home):
    """A preemption (SIGTERM, checkpoint saved: a reclaimed spot node, Slurm's time limit after
    its checkpoint signal) is not the job's failure: three of them in a row with
    restart.max_attempts=2 still end in success, and a later failure finds its budget whole."""
    def preempted(step):
        return [([progress("resume", step - 5), progress("checkpoint", step), progress("preempted", step),
                  b.Event(b.NODE_EXITED, START, 0, "host-0", exit_code=PREEMPTED_EXIT_CODE)], running())]
    def lost():
        return [([progress("resume", 15), progress("checkpoint", 20), b.Event(b.NODE_LOST, START, 1, "host-1")],
                 running())]
    outcome, backend, record, _, _ = supervise({
        0: preempted(5), 1: preempted(10), 2: preempted(15), 3: lost(), 4: [([progress("resume", 20)], done())],
    }, restart={"max_attempts": 2})
    assert outcome.exit_code == 0, record.final_report
    assert [a.outcome for a in record.attempts] == ["preempted"] * 3 + ["node_lost", "succeeded"]
    outcome, _, record, _, _ = supervise({
        0: preempted(5), 1: lost(), 2: [([progress("resume", 20), progress("checkpoint", 25),
                                        b.Event(b.NODE_LOST, START, 1, "host-1")], running())],
    }, restart={"max_attempts": 2})
    assert outcome.exit_code == 7
    assert "retry budget spent (2 of restart.max_attempts=2 failed attempts)" in record.final_report


def test_backoff_is_slept_between_failed_attempts(home):
    # a node lost on a host nobody named: nothing to exclude, so it may fail the same way again
    outcome, _, _, _, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, None)], running())],
        1: [([progress("resume", 5)], done())],
    }, restart={"backoff": "30s"})
    record = outcome_record()
    assert outcome.exit_code == 0
    assert record.attempts[1].submitted_at - record.attempts[0].ended_at >= 30.0


def test_no_backoff_after_a_failed_node_the_next_attempt_excludes(home):
    outcome, _, _, lines, clock = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, "host-1")], running())],
        1: [([progress("resume", 5)], done())],
    }, restart={"backoff": "30s"})
    record = outcome_record()
    assert outcome.exit_code == 0 and record.attempts[1].excluded_nodes == ["host-1"]
    assert record.attempts[1].submitted_at - record.attempts[0].ended_at < 30.0 and 30.0 not in clock.slept
    assert "no backoff: host-1 is excluded, the next attempt goes elsewhere, so attempt 1 starts now" in lines


def outcome_record():
    return RunStore("sup").load()


def test_a_cancel_intent_ends_the_run_cancelled_and_nothing_is_resubmitted(home):
    """`wmctl cancel` records its intent before tearing down; the teardown looks like a lost
    node, but the watcher reads the intent and ends the run cancelled, with its own exit code."""
    def cancel_then_lose_nodes():
        RunStore("sup").request_cancel(by="test", graceful=False)
        return [b.Event(b.NODE_LOST, START + 1, 0, "host-0")], [b.NodeStatus(i, b.LOST, f"host-{i}") for i in range(2)]

    outcome, backend, record, lines, _ = supervise({
        0: [([progress("checkpoint", 5)], running()), cancel_then_lose_nodes],
        1: [([progress("resume", 5)], done())],
    })
    assert outcome.exit_code == 8 and record.status == "cancelled"
    assert ("submit", 1) not in backend.calls
    assert record.attempts[0].outcome == "cancelled" and "cancelled by test" in record.final_report


def test_a_cancel_during_the_backoff_submits_nothing_more(home):
    def fail_then_cancel_later():
        return [progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, None)], running()

    clock_box: dict[str, Clock] = {}

    outcome, backend, record, _, _ = supervise({
        0: [fail_then_cancel_later],
        1: [([progress("resume", 5)], done())],
    }, restart={"backoff": "30s"}, on_sleep=lambda clock: RunStore("sup").request_cancel(by="later", graceful=False)
        if clock.now > START + 10 else None, clock_box=clock_box)
    assert outcome.exit_code == 8 and record.status == "cancelled"
    assert [c for c in backend.calls if c[0] == "submit"] == [("submit", 0)]
    assert clock_box["clock"].now < START + 30      # woke for the cancel, did not sleep the backoff out


def test_every_progress_event_is_kept_in_the_store(home):
    supervise({0: [([progress("checkpoint", 5)], running()), ([progress("step", 8)], done())]})
    kept = RunStore("sup").metrics()
    assert [(m["event"], m["step"], m["attempt"]) for m in kept] == [("checkpoint", 5, 0), ("step", 8, 0)]


def test_silence_past_the_heartbeat_timeout_is_a_hang(home):
    outcome, backend, record, _, clock = supervise({
        0: [([progress("checkpoint", 5)], running())],          # then nothing, nodes still "running"
        1: [([progress("resume", 5), progress("checkpoint", 10)], done())],
    }, restart={"heartbeat_timeout": "60s"})
    assert outcome.exit_code == 0
    assert record.attempts[0].outcome == "hang"
    assert ("cancel", 0) in backend.calls
    assert clock.now - START >= 60


def test_an_attempt_without_a_new_checkpoint_stops_the_loop(home):
    lost = lambda: b.Event(b.NODE_LOST, START, 1, "host-1")  # noqa: E731
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 5), lost()], running())],
        1: [([progress("resume", 5), lost()], running())],
    })
    assert outcome.exit_code == 7
    assert "committed no new checkpoint" in record.final_report
    assert [c for c in backend.calls if c[0] == "submit"] == [("submit", 0), ("submit", 1)]


def test_the_retry_budget_counts_every_attempt(home):
    lost = lambda step: ([progress("checkpoint", step), b.Event(b.NODE_LOST, START, 1, "host-1")], running())  # noqa: E731
    outcome, backend, record, _, _ = supervise({0: [lost(5)], 1: [lost(10)]}, restart={"max_attempts": 2})
    assert outcome.exit_code == 7
    assert "retry budget spent (2 of restart.max_attempts=2" in record.final_report
    assert len(record.attempts) == 2


def test_without_auto_resume_a_retryable_failure_is_reported_not_retried(home):
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, "host-1")], running())],
    }, auto_resume=False)
    assert outcome.exit_code == 7
    assert "--auto-resume" in record.final_report
    assert backend.calls == [("submit", 0), ("cancel", 0)]


def test_a_backend_with_one_host_retries_in_place(home):
    """Local and Docker run on one host: excluding it would leave nowhere to run."""
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, "host-1")], running())],
        1: [([progress("resume", 5)], done())],
    }, places_nodes=False)
    assert outcome.exit_code == 0
    assert backend.submitted[1].excluded_nodes == () and record.attempts[1].excluded_nodes == []
    assert record.attempts[0].decision == "retry"      # not "retry_elsewhere": there is no elsewhere


def test_the_live_display_sees_every_state_change_and_the_end(home):
    spec = spec_from({"name": "sup", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 4, "backoff": "0s"}})
    clock = Clock()
    backend: Any = ScriptedBackend(clock, {0: [([progress("checkpoint", 5)], running()),
                                          ([progress("step", 8)], running()), ([], done())]})
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend=backend.name, spec_path="sup.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    seen: list[tuple] = []
    class States(EchoView):
        def news(self, news: News) -> None:
            seen.append((news.record.status, news.attempt.last_step, news.attempt.last_checkpoint_step,
                         [n.phase for n in news.nodes]))

    Supervisor(spec, load_profile("cpu"), backend, store, record, States(lambda line: None),
               SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0)).run()
    assert seen[0] == ("running", None, None, [])       # the attempt taken up: nothing seen of it yet
    assert seen[1:] == [("running", 5, 5, ["running", "running"]), ("running", 8, 5, ["running", "running"]),
                        ("running", 8, 5, ["succeeded", "succeeded"]), ("succeeded", 8, 5, ["succeeded", "succeeded"])]


def test_time_spent_pending_is_not_a_hang(home):
    """Queued for admission or pulling a 20 GB image for longer than the heartbeat timeout: the
    heartbeat only starts once every node runs."""
    pending = [b.NodeStatus(i, b.PENDING) for i in range(2)]
    outcome, _, record, _, clock = supervise({
        0: [([], pending)] * 200 + [([], running()), ([progress("checkpoint", 5)], done())],
    }, restart={"heartbeat_timeout": "60s"})
    assert clock.now - START >= 200
    assert outcome.exit_code == 0 and [a.outcome for a in record.attempts] == ["succeeded"]


def test_silence_after_every_node_started_is_a_hang(home):
    outcome, _, record, _, _ = supervise({
        0: [([], running())],                     # started, then never a progress line
        1: [([progress("checkpoint", 5)], done())],
    }, restart={"heartbeat_timeout": "60s"})
    assert record.attempts[0].outcome == "hang"


def test_an_engine_outage_shorter_than_the_heartbeat_is_waited_out(home):
    """A control-plane upgrade or a dockerd restart: the run is untouched, the watcher waits."""
    down = EngineUnavailable("connection refused")
    outcome, backend, record, lines, _ = supervise({
        0: [([progress("checkpoint", 5)], running())] + [down] * 45 + [([progress("step", 9)], done())],
    }, restart={"heartbeat_timeout": "60s"})
    assert outcome.exit_code == 0 and [a.outcome for a in record.attempts] == ["succeeded"]
    assert ("cancel", 0) not in backend.calls
    assert any("lost contact" in ln for ln in lines) and any("restored after 45 s" in ln for ln in lines)


def test_while_the_engine_is_away_the_attempt_says_so_where_status_and_the_panel_read_it(home):
    down = EngineUnavailable("connection refused")
    said: list[str | None] = []

    def look(_seconds):
        said.append(RunStore("sup").load().attempts[0].evidence)
    outcome, _, record, _, _ = supervise({
        0: [([progress("checkpoint", 5)], running())] + [down] * 5 + [([progress("step", 9)], done())],
    }, restart={"heartbeat_timeout": "60s"}, on_sleep=look)
    assert outcome.exit_code == 0
    notes = [n for n in said if n]
    assert notes and all(re.fullmatch(r"scripted API unavailable, retrying \(since \d\d:\d\d:\d\d UTC, budget "
                                      r"1m00s\)", n) for n in notes), notes
    assert "API unavailable" not in (record.attempts[0].evidence or "")     # cleared once it answered


def test_an_engine_outage_longer_than_the_heartbeat_is_an_error(home):
    with pytest.raises(EngineUnavailable):
        supervise({0: [([progress("checkpoint", 5)], running())] + [EngineUnavailable("refused")] * 100},
                  restart={"heartbeat_timeout": "60s"})


def test_step_lines_say_where_the_time_went_and_each_timing_warning_once(home):
    def timed_step(step, data_share):
        warnings = [f"data wait is {data_share:.0%} of the step (threshold 30%): raise num_workers"] \
            if data_share > 0.3 else []
        timing = {"step_s": 0.05, "compute_share": 0.9 - data_share, "data_share": data_share,
                  "comm_share": 0.1, "bottleneck": "data" if data_share > 0.45 else "compute",
                  "warnings": warnings}
        return b.Event(b.PROGRESS, START, 0, "host-0",
                       progress={"event": "step", "step": step, "loss": 0.5, "timing": timing})

    _, _, _, lines, _ = supervise({0: [([timed_step(10, 0.2)], running()),
                                       ([timed_step(20, 0.5)], running()),
                                       ([timed_step(30, 0.6)], done())]})
    # largest part first: the first named is the bottleneck
    assert "attempt 0: step 10 loss 0.5, 50.0 ms: compute 70% data 20% comm 10%" in lines
    assert "attempt 0: step 20 loss 0.5, 50.0 ms: data 50% compute 40% comm 10%" in lines
    advice = [line for line in lines if "data wait is" in line]
    assert advice == ["attempt 0: data wait is 50% of the step (threshold 30%): raise num_workers"]


def output(text="epoch 1 loss 0.52"):
    return b.Event(b.OUTPUT, START, 0, "host-0", message=text)


def test_a_job_without_progress_lines_is_alive_while_it_prints(home):
    """A plain train.py that never imports orchestrator.runtime: a line every 30 s keeps a 60 s
    heartbeat alive for 200 s, and its lines reach the watch output."""
    script = [([output()] if i % 30 == 0 else [], running()) for i in range(200)] + [([], done())]
    outcome, backend, record, lines, clock = supervise({0: script}, restart={"heartbeat_timeout": "60s"})
    assert outcome.exit_code == 0 and record.attempts[0].outcome == "succeeded"
    assert [c for c in backend.calls if c[0] == "submit"] == [("submit", 0)]
    assert clock.now - START >= 200
    assert any(line == "attempt 0: node 0 | epoch 1 loss 0.52" for line in lines)


def test_once_a_job_prints_progress_lines_other_output_is_no_heartbeat(home):
    """A chatty job stuck in a collective still logs: after its first progress line only
    progress counts."""
    script = [([progress("checkpoint", 5)], running())] + [([output()], running()) for _ in range(100)]
    outcome, _, record, lines, _ = supervise({0: script, 1: [([progress("resume", 5), progress("checkpoint", 9)],
                                                              done())]}, restart={"heartbeat_timeout": "60s"})
    assert record.attempts[0].outcome == "hang"
    assert not any("| epoch" in line for line in lines)


TRACEBACK = [
    "wmctl-bind: local_rank=0 cpus=0 numa=0 mode=even threads=1",
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/workspace/train.py", line 41, in <module>',
    "[rank1]:     main()",
    '[rank1]:   File "/workspace/train.py", line 12, in main',
    '[rank1]:     raise ValueError("bad batch shape (4, 3)")',
    "[rank1]: ValueError: bad batch shape (4, 3)",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/torch/distributed/run.py", line 1019, in run',
    "    elastic_launch(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : 1 (pid: 2935) ",
]


def test_an_app_error_is_reported_in_the_failing_ranks_own_words(home, monkeypatch):
    """The watch line, the final report and the record carry the job's traceback end (its
    train.py frame and exception), read from the failed node before the teardown."""
    monkeypatch.setattr(ScriptedBackend, "output", {1: TRACEBACK})
    outcome, backend, record, lines, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_EXITED, START, 1, "host-1", exit_code=1)],
             [b.NodeStatus(0, b.RUNNING), b.NodeStatus(1, b.FAILED, exit_code=1)])],
    })
    assert outcome.exit_code == 7
    a0 = record.attempts[0]
    assert 'rank 1: ValueError: bad batch shape (4, 3) (File "train.py", line 12)' in a0.evidence
    assert a0.error[-1] == "ValueError: bad batch shape (4, 3)"
    assert any('train.py", line 12, in main' in text for text in a0.error)
    assert not any("torch/distributed" in text for text in a0.error)
    assert 'train.py", line 12' in record.final_report
    assert any("ValueError: bad batch shape" in line and "failed: app_error" in line for line in lines)


def test_an_agents_shutdown_noise_after_its_workers_finished_does_not_fail_the_run(home):
    """Node 1's workers finished; its torchrun agent then failed to reach node 0's store on its
    way out (node 0, the store's host, had ended): the run succeeded."""
    from .test_failures import SHUTDOWN
    ScriptedBackend.output = {1: ["done rank 1", *SHUTDOWN]}
    try:
        outcome, backend, record, lines, _ = supervise({
            0: [([progress("checkpoint", 5), b.Event(b.NODE_EXITED, START, 0, "host-0", exit_code=0)],
                 [b.NodeStatus(0, b.SUCCEEDED, "host-0", 0), b.NodeStatus(1, b.RUNNING, "host-1")]),
                ([b.Event(b.NODE_EXITED, START + 1, 1, "host-1", exit_code=1)],
                 [b.NodeStatus(0, b.SUCCEEDED, "host-0", 0), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
        })
    finally:
        ScriptedBackend.output = {}
    assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
    assert backend.calls == [("submit", 0), ("logs", 1), ("release", 0)]
    assert any("failed on its way out" in line for line in lines)


@pytest.mark.parametrize("completed", ["before", "after", None])
def test_a_worker_that_aborts_after_the_job_completed_does_not_fail_the_run(home, completed):
    """Rank 1 dies of SIGABRT with no error of its own (gloo + DCP teardown in torch 2.13). After
    the job's own `exit completed` event the run succeeded, and the watcher says why, also when
    that event is read a round after the crash; with no such event, the exit is the job's failure."""
    from .test_failures import report
    said = [b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "exit", "status": "completed", "step": 12})]
    ScriptedBackend.output = {1: ["terminate called without an active exception", *report(rank=1, code=-6)]}
    one_failed = [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.FAILED, "host-1", 1)]
    try:
        outcome, backend, record, lines, _ = supervise({
            0: [([progress("checkpoint", 12), *(said if completed == "before" else [])], running()),
                ([b.Event(b.NODE_EXITED, START + 1, 1, "host-1", exit_code=1)], one_failed),
                (said if completed == "after" else [], one_failed),
                ([b.Event(b.NODE_EXITED, START + 2, 0, "host-0", exit_code=0)],
                 [b.NodeStatus(0, b.SUCCEEDED, "host-0", 0), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
        })
    finally:
        ScriptedBackend.output = {}
    assert backend.calls.count(("logs", 1)) == 1     # the output is read once
    if completed:
        assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
        assert any("after the job reported completion at step 12 (rank 1 exit -6: aborted (SIGABRT))" in line
                   for line in lines)
    else:
        assert outcome.exit_code == 7 and record.attempts[0].outcome == "app_error"
        assert "aborted (SIGABRT)" in record.attempts[0].evidence


@pytest.mark.parametrize("how", ["nodes", "job", "not completed"])
def test_a_scheduler_signal_after_the_job_completed_is_not_a_preemption(home, how):
    """Slurm's time limit signals a job that has just finished its last step (seen in CI: attempt 0
    said `exit completed` at step 500, the signal came during its exit, nothing was saved): each
    node's end says `Signalled` (classify.node_exited), or the job's whole end says TimeLimit. The
    job's work is done, so the run succeeded on attempt 0, not rerun from its newest checkpoint
    (here none: from step 0). Without the `exit completed` line it is the preemption it looks like."""
    said = [b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "exit", "status": "completed", "step": 12})]
    signalled = [b.Event(b.EVICTED, START + 1, n, f"host-{n}", exit_code=1, reason="Signalled",
                         message=f"torchrun exited with 1 on host-{n} after Slurm's signal reached it") for n in (1, 0)]
    if how == "job":
        signalled = [b.Event(b.EVICTED, START + 1, reason="TimeLimit", message="Slurm: job 7 reached its time limit")]
    ended = [b.NodeStatus(n, b.FAILED, f"host-{n}", 1) for n in (0, 1)]
    outcome, backend, record, lines, _ = supervise({
        0: [([progress("step", 12), *(said if how != "not completed" else [])], running()), (signalled, ended)],
        1: [([progress("step", 12)], done())],
    })
    if how == "not completed":
        assert record.attempts[0].outcome == "preempted" and len(record.attempts) == 2, record.final_report
        return
    assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
    assert len(record.attempts) == 1 and record.attempts[0].outcome == "succeeded", record.final_report
    assert ("submit", 1) not in backend.calls
    assert any("after the job reported completion at step 12" in line and "not counted as a preemption" in line
               for line in lines), lines


def test_a_node_left_in_torchruns_exit_barrier_after_a_benign_crash_is_stopped_and_the_run_succeeds(home):
    """Node 1's worker aborted after the job completed; node 0's agent (its workers done) then
    waits in torchrun's exit barrier for node 1's agent, which left without joining it: node 0
    stays up and silent. Past EXIT_BARRIER_WAIT_S it is stopped and the run succeeded, long
    before the heartbeat timeout would have called it a hang and retried finished work."""
    from orchestrator.endgame import EXIT_BARRIER_WAIT_S
    from .test_failures import report
    said = b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "exit", "status": "completed", "step": 12})
    ScriptedBackend.output = {1: report(rank=1, code=-6)}
    try:
        outcome, backend, record, lines, _ = supervise({
            0: [([progress("checkpoint", 12), said], running()),
                ([b.Event(b.NODE_EXITED, START + 1, 1, "host-1", exit_code=1)],
                 [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
        }, restart={"heartbeat_timeout": "30s"})
    finally:
        ScriptedBackend.output = {}
    assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
    assert record.attempts[0].outcome == "succeeded"
    assert backend.calls == [("submit", 0), ("logs", 1), ("cancel", 0), ("release", 0)]
    stopped = [line for line in lines if "torchrun's exit barrier" in line]
    assert stopped and "node(s) 0 still up" in stopped[0], lines
    assert EXIT_BARRIER_WAIT_S < 30


@pytest.mark.parametrize("how", ["lost", "frozen", "not completed"])
def test_a_node_lost_or_frozen_after_the_job_completed_does_not_fail_the_run(home, how):
    """Seen in CI with a spare warm: the job said `exit completed` at step 60, then node 0 froze
    on its way out, and the spare restarted every worker from checkpoint 60 for a round with no
    step to run (which then failed in its rendezvous). After the job's `completed` a node's loss or
    freeze leaves nothing to redo: the run succeeded on attempt 0; a node still up (the frozen
    one) is stopped past EXIT_BARRIER_WAIT_S. Without the `completed` line it is the node's failure."""
    said = [b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "exit", "status": "completed", "step": 12})]
    if how == "frozen":
        news = [b.Event(b.NODE_PAUSED, START + 1, 0, "host-0", message="torchrun agent is stopped (SIGSTOP)")]
        after = [b.NodeStatus(0, b.PAUSED, "host-0"), b.NodeStatus(1, b.SUCCEEDED, "host-1", 0)]
    else:
        news = [b.Event(b.NODE_LOST, START + 1, 1, "host-1", message="the node's processes vanished (killed)")]
        after = [b.NodeStatus(0, b.SUCCEEDED, "host-0", 0), b.NodeStatus(1, b.LOST, "host-1")]
    outcome, backend, record, lines, _ = supervise({
        0: [([progress("checkpoint", 12), *(said if how != "not completed" else [])], running()), (news, after)],
        1: [([progress("resume", 12)], running()), ([progress("step", 12)], done())],
    })
    if how == "not completed":
        assert record.attempts[0].outcome == "node_lost" and len(record.attempts) == 2, record.final_report
        return
    assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
    assert len(record.attempts) == 1 and record.attempts[0].outcome == "succeeded", record.final_report
    node = 0 if how == "frozen" else 1
    assert any(f"node {node} failed" in line and "after the job reported completion at step 12" in line
               and "not counted as a failure" in line for line in lines), lines
    # the frozen node is stopped as one left in the exit barrier; a lost one left nothing up
    assert (("cancel", 0) in backend.calls) == (how == "frozen"), backend.calls


@pytest.mark.parametrize("first", [0, 1])
def test_an_agent_that_lost_the_store_after_the_job_completed_does_not_fail_the_run(home, first):
    """Node 1 hosted the c10d store and its worker aborted after the job completed; node 0's
    agent, its worker leaving, then lost the store in its monitor loop. Whichever exit is judged
    first, neither is the job's failure: the run succeeded."""
    from .test_failures import MONITOR, report
    said = b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "exit", "status": "completed", "step": 12})
    ScriptedBackend.output = {0: MONITOR, 1: report(rank=1, code=-6)}
    exits = [b.Event(b.NODE_EXITED, START + 1 + (n != first), n, f"host-{n}", exit_code=1) for n in (0, 1)]
    try:
        outcome, backend, record, lines, _ = supervise({
            0: [([progress("checkpoint", 12), said], running()),
                (exits, [b.NodeStatus(0, b.FAILED, "host-0", 1), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
        })
    finally:
        ScriptedBackend.output = {}
    assert outcome.exit_code == 0 and record.status == "succeeded", record.final_report
    assert any("node 0's torchrun agent lost the rendezvous store after the job reported completion at step 12"
               in line for line in lines), lines
    assert any("node 1's worker died after the job reported completion" in line for line in lines), lines


def test_an_agent_that_cannot_reach_the_rendezvous_is_retried_not_an_app_error(home):
    from .test_failures import MONITOR
    ScriptedBackend.output = {1: MONITOR}
    try:
        outcome, backend, record, _, _ = supervise({
            0: [([b.Event(b.NODE_EXITED, START, 1, "host-1", exit_code=1)],
                 [b.NodeStatus(0, b.PENDING), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
            1: [([progress("step", 3)], done())],
        })
    finally:
        ScriptedBackend.output = {}
    assert outcome.exit_code == 0, record.final_report
    a0 = record.attempts[0]
    assert (a0.outcome, a0.decision) == ("rendezvous", "retry")
    assert "RendezvousConnectionError" in a0.evidence
    assert backend.calls.count(("logs", 1)) == 1     # the output is read once


def waiting(t, msg="0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."):
    return b.Event(b.NODE_WAITING, t, 1, None, reason="Unschedulable", message=msg)


def test_an_attempt_not_placed_within_pending_timeout_stops_as_unschedulable_with_the_reason(home):
    outcome, _, record, lines, _ = supervise({
        0: [([waiting(START)], [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.PENDING)])],
    }, restart={"pending_timeout": "5s"})
    a0 = record.attempts[0]
    assert outcome.exit_code == 7 and (a0.outcome, a0.decision) == ("unschedulable", "stop")
    assert "didn't match Pod's node affinity" in a0.evidence and "restart.pending_timeout 5 s" in a0.evidence
    assert any("node_waiting" in line for line in lines)


def test_exclusions_that_leave_no_room_are_dropped_never_piled_up(home):
    """Attempt 1 excluded the node attempt 0 lost and then could not be placed: attempt 2 runs
    with no node excluded."""
    pending = [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.PENDING)]
    outcome, backend, record, lines, _ = supervise({
        0: [([progress("checkpoint", 5), b.Event(b.NODE_LOST, START, 1, "host-1")], running())],
        1: [([waiting(START + 2)], pending)],
        2: [([progress("resume", 5)], done())],
    }, restart={"pending_timeout": "5s"})
    assert outcome.exit_code == 0, record.final_report
    assert backend.submitted[1].excluded_nodes == ("host-1",) and backend.submitted[2].excluded_nodes == ()
    assert (record.attempts[1].outcome, record.attempts[1].decision) == ("unschedulable", "retry")
    assert any("excluding none" in line for line in lines)


def test_a_node_that_starts_within_pending_timeout_is_not_unschedulable(home):
    """...and while it waited, `wmctl status` (the record) said why."""
    seen: list = []
    outcome, _, record, _, _ = supervise({
        0: [([waiting(START)], [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.PENDING)]),
            ([], running()), ([], running()), ([], running()), ([], running()), ([], running()), ([], running()),
            ([progress("step", 3)], done())],
    }, restart={"pending_timeout": "3s"},
        on_sleep=lambda clock: seen.append(RunStore("sup").load().attempts[0].evidence))
    assert outcome.exit_code == 0, record.final_report
    assert seen[0] == "waiting to be placed: Unschedulable: 0/3 nodes are available: 1 node(s) didn't match " \
        "Pod's node affinity/selector."
    assert seen[-1] is None and record.attempts[0].evidence is None


ECC = ["[rank9]:Traceback (most recent call last):", '[rank9]:  File "/w/train.py", line 40, in <module>',
       "[rank9]:    loss.backward()", "[rank9]:RuntimeError: CUDA error: uncorrectable ECC error encountered"]


@pytest.mark.parametrize("vendor, outcome", [("cuda", "device_fault"), ("cpu", "app_error")])
def test_a_rank_reporting_a_failed_device_is_a_device_fault_retried_elsewhere(home, vendor, outcome):
    """The vendor profile's device_fault_patterns in the failing node's output: the node's
    device failed, not the job; the record says which evidence decided."""
    from orchestrator.vendors import load_profile
    ScriptedBackend.output = {1: ECC}
    try:
        result, backend, record, _, _ = supervise({
            0: [([progress("checkpoint", 5), b.Event(b.NODE_EXITED, START, 1, "host-1", exit_code=1)],
                 [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.FAILED, "host-1", 1)])],
            1: [([progress("resume", 5)], done())],
        }, profile=load_profile(vendor))
    finally:
        ScriptedBackend.output = {}
    a0 = record.attempts[0]
    assert a0.outcome == outcome
    if outcome == "device_fault":
        assert result.exit_code == 0 and a0.decision == "retry_elsewhere"
        assert "decided by the node's output" in a0.evidence and "uncorrectable ECC" in a0.evidence
        assert backend.submitted[1].excluded_nodes == ("host-1",)
    else:
        assert result.exit_code == 7


def test_a_hang_names_the_hung_node_when_one_node_alone_is_in_an_unknown_state(home):
    """Kubernetes reports a pod whose kubelet lost its state as phase Unknown: when the run hangs
    and that node alone is so, it is the hung node, and the next attempt is placed away from it."""
    hung = [b.NodeStatus(0, b.RUNNING, "host-0"), b.NodeStatus(1, b.UNKNOWN, "host-1", None, "Unknown")]
    outcome, backend, record, _, _ = supervise({
        0: [([progress("checkpoint", 5)], hung)],
        1: [([progress("resume", 5)], done())],
    }, restart={"heartbeat_timeout": "5s"})
    a0 = record.attempts[0]
    assert outcome.exit_code == 0, record.final_report
    assert (a0.outcome, a0.failed_host, a0.decision) == ("hang", "host-1", "retry_elsewhere")
    assert "node 1 is unknown" in a0.evidence
    assert backend.submitted[1].excluded_nodes == ("host-1",)


def test_a_resume_amended_to_not_exact_is_kept_in_the_record_and_the_status_summary(home):
    # The job said exact, then (an unregistered DataLoader iterated after restore()) not exact.
    amended = b.Event(b.PROGRESS, START, 0, "host-0", progress={"event": "resume", "step": 10, "exact": False,
                                                               "reason": "unregistered DataLoader", "amended": True})
    outcome, _, record, _, _ = supervise({
        0: [([progress("checkpoint", 10)], running()),
            ([progress("step", 12), b.Event(b.NODE_LOST, START + 1, 1, "host-1", reason="NodeNotReady")], running())],
        1: [([progress("resume", 10), amended], running()), ([progress("step", 20)], done())],
    })
    assert outcome.exit_code == 0
    a0, a1 = record.attempts
    assert (a0.resume_not_exact, a1.resume_not_exact) == (None, "unregistered DataLoader")
    assert "attempt 1: succeeded; resumed from step 10 (not exact: unregistered DataLoader)" in record.final_report


def test_a_run_taken_up_after_failing_unwatched_has_its_failed_attempt_torn_down_first(home):
    """`watch --auto-resume` of a run that failed while nobody watched (reconcile recorded it,
    take_up_unwatched decided): what is left of that attempt on the backend (a survivor blocked
    on the lost peer, exited containers holding its name) is torn down, its output kept, before
    the next attempt is submitted, as after a failure seen live."""
    from orchestrator.state import AttemptRecord

    spec = spec_from({"name": "sup", "nodes": 2, "command": ["python", "t.py"],
                      "restart": {"max_attempts": 4, "backoff": "0s", "heartbeat_timeout": "60s"}})
    clock = Clock()
    backend: Any = ScriptedBackend(clock, {1: [([progress("resume", 10)], running()),
                                               ([progress("step", 20)], done())]})
    backend.submitted[0] = None             # attempt 0's objects are still there
    record = RunRecord(run=spec.name, backend=backend.name, spec_path="sup.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    record.attempts.append(AttemptRecord(attempt=0, submitted_at=START - 100, outcome="node_lost",
                                         decision="retry_elsewhere", failed_node=1, ended_at=START - 10,
                                         last_checkpoint_step=10))
    store = RunStore(spec.name)
    store.save(record)
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(list[str]().append),
                     SupervisorOptions(auto_resume=True, clock=clock, sleep=clock.sleep, poll_interval=1.0))
    assert sup.run().exit_code == 0
    assert backend.calls == [("cancel", 0), ("submit", 1), ("release", 1)]
    assert [a.attempt for a in store.load().attempts] == [0, 1]
