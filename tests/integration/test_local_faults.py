"""Fault matrix on the local backend: real torchrun agents (2 nodes x 1 rank, gloo) driven by a
real `wmctl submit --auto-resume`, with faults injected as real signals. Where what is tested does
not depend on a second node (an app error, the retry budget, no new checkpoint, a torn checkpoint,
SIGTERM, cancel), the run has one: a node less is two torch imports less an attempt, and CI's
time is its attempts.

Each completed run's final state is compared bit for bit (float.hex) with an uninterrupted
run; each test prints how many steps were redone.
"""

from __future__ import annotations

import itertools
import os
import signal

import pytest

from . import harness as h

# Under xdist the whole module runs on one worker (--dist loadgroup): its module fixtures run
# real jobs, which every worker given one of its tests would otherwise run again.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("local-faults")]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-home")


@pytest.fixture(scope="module")
def reference() -> str:
    """An uninterrupted run's final state, computed (harness.counter_state): the runs below
    (default 40 steps, 2 nodes) must end bit-identical to it."""
    return h.counter_state(40)


def _redone(home, run):
    rec = h.record(home, run)
    out = []
    for prev, nxt in itertools.pairwise(rec["attempts"]):
        out.append((prev["last_step"] or 0) - (nxt["resumed_from_step"] or 0))
    print(f"{run}: steps redone per failure {out}")
    return out


@pytest.mark.timeout(480)
def test_node_faults_one_per_attempt_each_resumed_and_the_run_matches_uninterrupted(home):
    """One run, one fault per attempt, each after that attempt committed a checkpoint of its own
    (a chain: every fault pays for its own attempt, none for a fresh run up to its checkpoint):

      attempt 0  the watcher is SIGKILLed and a second one (`wmctl watch`) takes over the running
                 attempt without submitting another; then node 1 (the worker node) is SIGKILLed
      attempt 1  node 0 is SIGKILLed: the rendezvous host, global rank 0
      attempt 2  node 1 is SIGSTOPped whole (agent included), the local twin of `docker pause`:
                 the backend sees the stopped agent and says so at once, long before the
                 heartbeat would (120 s here)
      attempt 3  runs to the end, bit-identical to an uninterrupted run (computed)."""
    run = "chain"
    spec = h.write_spec(home, run, steps=60, restart={"max_attempts": 5, "heartbeat_timeout": "120s"})
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    w.kill()                                   # the job keeps running without its watcher
    w = h.Watch(spec, home, run, command="watch")
    h.wait_new_checkpoint(home, run, 0)
    h.wait_step(home, run, 0, 12)
    assert h.kill_node(run, 0, 1) > 0
    for attempt, node, sig in ((1, 0, signal.SIGKILL), (2, 1, signal.SIGSTOP)):
        h.wait_new_checkpoint(home, run, attempt)
        assert h.kill_node(run, attempt, node, sig) > 0, attempt
    assert w.wait(timeout=300) == 0, w.output
    rec = h.record(home, run)
    assert [(a["attempt"], a["outcome"]) for a in rec["attempts"]] == \
        [(0, "node_lost"), (1, "node_lost"), (2, "hang"), (3, "succeeded")], rec["final_report"]
    assert "SIGSTOP" in rec["attempts"][2]["evidence"]
    for prev, nxt in itertools.pairwise(rec["attempts"]):       # each from the checkpoint its fault followed
        assert nxt["resumed_from_step"] > (prev["resumed_from_step"] or 0), rec["attempts"]
    assert h.final_state(spec) == h.counter_state(60)
    assert not h.leftover_processes(run)
    _redone(home, run)


def test_sigterm_is_graceful_and_loses_no_step(home):
    run = "sigterm"
    # no periodic checkpoints: only the SIGTERM one; 0.4 s a step leaves about 11 s after step 12
    # for the signal to land before the run would end by itself (the state is the same at 40 steps)
    # one node: the signal reaches its agent as a scheduler's would (two ranks agreeing on the
    # stop step: tests/runtime/test_preemption_sigterm.py, rank1-only)
    spec = h.write_spec(home, run, nodes=1, every=1000, sleep=0.4)
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 12)
    h.signal_agent(home, run, 0, 0, signal.SIGTERM)
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert rec["attempts"][0]["outcome"] == "preempted"
    assert _redone(home, run) == [0]
    assert h.final_state(spec) == h.counter_state(40, world=1)


def test_app_error_is_not_retried(home):
    run = "apperror"
    spec = h.write_spec(home, run, nodes=1, job_args=["--fail-at", "7"])
    w = h.Watch(spec, home)
    assert w.wait() == 7, w.output
    rec = h.record(home, run)
    assert len(rec["attempts"]) == 1 and rec["attempts"][0]["outcome"] == "app_error"
    assert "not retried" in rec["final_report"]
    assert not h.leftover_processes(run)


def test_kill_during_checkpoint_write_resumes_from_previous(home):
    run = "torn"
    spec = h.write_spec(home, run, nodes=1, job_args=["--slow-commit", "3"], every=10)
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 10)
    # The next save (step 20) sleeps between the rank files and COMMITTED: kill inside it.
    h.wait_until(lambda: (h.run_checkpoints(spec) / "step-00000020").exists(), 60, "step 20 write")
    h.kill_node(run, 0, 0)
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert rec["attempts"][1]["resumed_from_step"] == 10
    assert h.final_state(spec) == h.counter_state(40, world=1)


def test_retry_budget_spent_reports_clearly(home):
    run = "budget"
    spec = h.write_spec(home, run, nodes=1, restart={"max_attempts": 2}, sleep=0.15)
    w = h.Watch(spec, home)
    for attempt in range(2):
        h.wait_checkpoint(home, run, attempt, 5 * (attempt + 2))
        h.kill_node(run, attempt, 0)
    assert w.wait() == 7, w.output
    rec = h.record(home, run)
    assert "retry budget spent" in rec["final_report"] and len(rec["attempts"]) == 2


def test_failure_without_new_checkpoint_stops(home):
    run = "noprogress"
    # an attempt that resumed holds 30 s before its first step: the kill below lands before it
    # commits anything new however slowly this machine sees the resume line
    spec = h.write_spec(home, run, nodes=1, sleep=0.15, job_args=["--hold-after-resume", "30"])
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    h.kill_node(run, 0, 0)
    h.wait_until(lambda: any(p["event"] == "resume" for p in h.progress(home, run, 1)), 90, "attempt 1 resume")
    h.kill_node(run, 1, 0)                     # before attempt 1 commits anything new
    assert w.wait() == 7, w.output
    assert "committed no new checkpoint" in h.record(home, run)["final_report"]


def test_stuck_worker_is_caught_by_the_heartbeat_and_resumed(home, reference):
    """Only the training process of node 1 freezes (a stuck kernel, a dead NFS mount): every
    process still exists and the agent looks healthy; node 0 blocks in its all-reduce. Only the
    silence of the progress lines shows it: the heartbeat timeout must catch it."""
    run = "stuck"
    spec = h.write_spec(home, run, restart={"heartbeat_timeout": "15s"})
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 10)
    workers = h.training_pids(run, 0, 1)       # the job, not the agent that launched it
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["hang", "succeeded"], rec["final_report"]
    assert "no progress line" in rec["attempts"][0]["evidence"]
    assert h.final_state(spec) == reference
    assert not h.leftover_processes(run)
    _redone(home, run)


def test_cancel_from_another_process_ends_the_watched_run_cancelled(home):
    """`wmctl cancel` from a second process while a watcher supervises the run with
    --auto-resume: the teardown kills the nodes (which would read as node_lost and be resubmitted),
    but the intent recorded first makes the watcher end the run cancelled, exit 8, no attempt 1."""
    import subprocess
    import sys

    run = "cancelled"
    spec = h.write_spec(home, run, nodes=1, steps=400)
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    cancel = subprocess.run([sys.executable, "-m", "orchestrator.cli", "cancel", run], env=w.env,
                            capture_output=True, text=True, timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert w.wait(timeout=120) == 8, w.output
    rec = h.record(home, run)
    assert rec["status"] == "cancelled" and [a["attempt"] for a in rec["attempts"]] == [0]
    assert rec["attempts"][0]["outcome"] == "cancelled"
    assert not (h.run_folder(home, run) / "attempt-1").exists()
    assert "cancelled" in cancel.stdout and not h.leftover_processes(run)


def test_a_script_that_never_imports_the_runtime_is_not_killed_as_a_hang(home):
    """It prints its own lines (one a second for 20 s) and never a progress line; the heartbeat
    timeout is 10 s (the clock starts when torchrun starts, before torch is imported: the margin
    is for that on a loaded machine). Its output is its sign of life, and it reaches the watch lines.
    Its `--n 200000` is a word torchrun's argparse took for an ambiguous abbreviation of its own
    flags (exit 2 at launch) until the line ended torchrun's options with `--`."""
    run = "plain"
    spec = h.write_spec(home, run, nodes=1, steps=20, sleep=1.0, job="plain.py",
                        job_args=["--n", "200000"], restart={"heartbeat_timeout": "10s"})
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 0, w.output
    rec = h.record(home, run)
    assert rec["status"] == "succeeded" and len(rec["attempts"]) == 1, w.output
    assert "| my own log: step" in w.output
    assert "succeeded on attempt 0 at step -" in w.output and "step None" not in w.output, w.output
    node_log = (h.run_folder(home, run) / "attempt-0" / "node-0.log").read_text()
    assert "my own args: --n 200000" in node_log, node_log


def test_a_silent_script_is_a_hang(home):
    """The same script silent for 20 s (its first line comes after --sleep): with a 4 s heartbeat
    timeout that is a hang, torn down and (max_attempts 1) not retried."""
    run = "silent"
    spec = h.write_spec(home, run, nodes=1, steps=2, sleep=20.0, job="plain.py",
                        restart={"heartbeat_timeout": "4s", "max_attempts": 1})
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 7, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["hang"], rec["final_report"]
    assert not h.leftover_processes(run)


def test_a_missing_script_fails_in_python_s_own_words(home):
    """Issue 22 item 10.2: `command: [python, nope.py]` reported only `exit 1` (the agent's code):
    python's "can't open file" line was in the node's log but in no evidence, since the job's
    words were looked for only in a traceback. Now the failure and `wmctl logs` both say it."""
    import subprocess
    import sys

    run = "nope"
    spec = h.write_spec(home, run, nodes=1, command=["python", "nope.py"])
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 7, w.output
    attempt = h.record(home, run)["attempts"][0]
    assert attempt["outcome"] == "app_error", attempt
    assert "can't open file" in attempt["evidence"] and "nope.py" in attempt["evidence"], attempt
    assert "(exit 2)" in attempt["evidence"], attempt
    assert any("can't open file" in line for line in attempt["error"]), attempt
    assert "can't open file" in w.output
    logs = subprocess.run([sys.executable, "-m", "orchestrator.cli", "logs", run], capture_output=True, text=True,
                          env={**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)}, timeout=60)
    assert logs.returncode == 0 and "can't open file" in logs.stdout, logs.stdout + logs.stderr


def test_sigkill_of_one_rank_says_killed_and_how_to_check_for_the_oom_killer(home):
    """Issue 22 item 10.5: what an OOM kill looks like on local: one worker SIGKILLed, its agent
    and the other node alive. It stopped as app_error with no word of a kill or of memory. It
    still stops (the OOM killer, its likeliest cause, would kill it again on a retry), but says
    that a rank was killed by SIGKILL (exit -9, torchrun's words) and how to check."""
    import re
    import signal as sig

    run = "rank-sigkill"
    spec = h.write_spec(home, run, nodes=2, steps=400)
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 2)
    workers = h.training_pids(run, 0, 1)
    assert len(workers) == 1, [h.cmdline(p) for p in h.node_pids(run, 0, 1)]
    os.kill(workers[0], sig.SIGKILL)
    assert w.wait(timeout=120) == 7, w.output
    attempt = h.record(home, run)["attempts"][0]
    assert attempt["failed_node"] == 1 and attempt["decision"] == "stop", attempt
    evidence = attempt["evidence"]
    assert re.search(r"rank [01] exit -9: killed \(SIGKILL\)", evidence), evidence   # the rendezvous ranks
    assert "OOM killer" in evidence and "dmesg" in evidence and "memory.max" in evidence, evidence
    assert "OOM killer" in w.output
    assert not h.leftover_processes(run)
