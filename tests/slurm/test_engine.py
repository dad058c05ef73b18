"""wmctl on the real Slurm cluster (.ci/start-slurm.sh): `wmctl submit -b slurm --auto-resume`
as a user runs it, the job the counter job every backend's e2e tests use (tests/integration/jobs),
faults that are real (a node's slurmd, step daemons and tasks SIGKILLed). Few and lean: each real
run costs seconds of CI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration import harness as h

from .conftest import SlurmCluster, alive, proc_argv

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("slurm")]

REPO = Path(__file__).resolve().parents[2]


def expected(steps: int, world: int = 2) -> str:
    """What an uninterrupted counter.py run computes (harness.counter_state; checked against an
    uninterrupted run on this cluster, test_two_nodes_...)."""
    return h.counter_state(steps, world)


@pytest.fixture
def home(tmp_path: Path, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch):
    """A WMCTL_HOME whose runs' Slurm jobs are cancelled after the test, whatever happened."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    yield tmp_path / "home"
    for job_file in (tmp_path / "home").glob("runs/*/attempt-*/job.json"):
        slurm_cluster.run("scancel", json.loads(job_file.read_text())["job_id"], check=False)


def wmctl(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**h.os.environ, "WMCTL_HOME": str(home),
                                                           "PYTHONPATH": str(REPO)})


def spec(home: Path, run: str, **kw) -> Path:
    return h.write_spec(home, run, **kw)


def watch(path: Path, home: Path) -> h.Watch:
    return h.Watch(path, home, "-b", "slurm")


def job_state(cluster: SlurmCluster, home: Path, run: str, attempt: int) -> str:
    job_id = json.loads((h.run_folder(home, run) / f"attempt-{attempt}" / "job.json").read_text())["job_id"]
    return cluster.job(job_id).get("JobState", "<gone>")


def test_two_nodes_run_to_the_end_with_checkpoints(slurm_cluster: SlurmCluster, home: Path):
    """Two nodes, one torchrun each, checkpoints every 5 steps: the run succeeds on attempt 0,
    Slurm says COMPLETED, each node left its exit record, `wmctl logs` reads rank 0's node."""
    run = "sl-two"
    path = spec(home, run, steps=30, every=5, sleep=0.05)
    w = watch(path, home)
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["succeeded"], rec["final_report"]
    assert rec["attempts"][0]["last_checkpoint_step"] == 30, w.output
    assert h.final_state(path) == expected(30)
    assert job_state(slurm_cluster, home, run, 0) == "COMPLETED"
    folder = h.run_folder(home, run) / "attempt-0"
    ends = [json.loads((folder / f"node-{n}.exit.json").read_text()) for n in (0, 1)]
    assert [e["exit_code"] for e in ends] == [0, 0] and len({e["host"] for e in ends}) == 2
    logs = wmctl(home, "logs", run)
    # rank 0's node, found from the progress lines (c10d places global rank 0 on either node)
    assert logs.returncode == 0 and "rank=0" in logs.stdout and "(global rank 0)" in logs.stderr, logs.stderr


def test_a_node_killed_after_a_checkpoint_resumes_elsewhere_exactly(slurm_cluster: SlurmCluster, home: Path):
    """Node 1's slurmd, step daemons and tasks SIGKILLed after a checkpoint. Its peer's worker
    fails at once (here the dead processes' kernel lives on and resets their connections; a dead
    machine's would not, and the runtime's beat names it: the frozen test below); node 1 wrote no
    exit record within PEER_WAIT_S, so it is the lost node (Slurm here needs ~14 s to miss it, ~27 s
    to call it down, 300 s+ at its default). One resubmission excludes it and resumes from the
    checkpoint on the two others; the final state is the one an uninterrupted run computes, bit
    for bit."""
    run = "sl-kill"
    path = spec(home, run, steps=60, every=5, sleep=0.2, job_args=["--beat"],
                restart={"node_silence_timeout": "3s", "heartbeat_timeout": "120s"})
    w = watch(path, home)
    h.wait_checkpoint(home, run, 0, 10)
    victim = _hosts(slurm_cluster, home, run, 0)[1]
    killed_at = time.time()
    assert slurm_cluster.node_kill(victim)
    assert w.wait(timeout=240) == 0, w.output
    rec = h.record(home, run)
    first, second = rec["attempts"]
    assert [first["outcome"], second["outcome"]] == ["node_lost", "succeeded"], rec["final_report"]
    assert first["failed_host"] == victim and second["excluded_nodes"] == [victim]
    # Named by whichever evidence came first: its missing exit record PEER_WAIT_S after the
    # survivor's broken connection, or (CI, a loaded host: the survivor's exit came late) Slurm's
    # own "not responding" once slurmctld missed the node. Either names the dead node.
    assert ("wrote no exit record" in first["evidence"] or f"Slurm does not hear from {victim}" in first["evidence"]), \
        first["evidence"]
    assert second["resumed_from_step"] == first["last_checkpoint_step"] >= 10
    assert h.final_state(path) == expected(60)
    assert victim not in _hosts(slurm_cluster, home, run, 1)
    print(f"node killed -> attempt 0 torn down {first['ended_at'] - killed_at:.1f} s later; "
          f"timings {first.get('timings')} / {second.get('timings')}")


def test_a_frozen_node_is_lost_by_the_runtime_beat(slurm_cluster: SlurmCluster, home: Path):
    """Every process of node 1 (its slurmd too) SIGSTOPped: nothing ends, no connection breaks,
    Slurm hears nothing for ~14 s. The runtime's beat (rank 0's reader, or node 1's witness when
    rank 0 is on node 1... frozen with it: then node 0's reader) says the node is silent, and the
    attempt ends within node_silence_timeout (3 s) of the beat's report; the next attempt runs
    without it and finishes exactly."""
    run = "sl-frozen"
    path = spec(home, run, steps=50, every=5, sleep=0.2, job_args=["--beat"],
                restart={"node_silence_timeout": "3s", "heartbeat_timeout": "120s"})
    w = watch(path, home)
    h.wait_checkpoint(home, run, 0, 10)
    victim = _hosts(slurm_cluster, home, run, 0)[1]
    frozen = slurm_cluster.node_processes(victim)
    for pid in frozen:
        h.os.kill(pid, h.signal.SIGSTOP)
    slurm_cluster.killed.append(victim)
    try:
        assert w.wait(timeout=240) == 0, w.output
    finally:
        for pid in frozen:                      # the node dies for good: the fixture revives it
            h.os.kill(pid, h.signal.SIGKILL)
        h.wait_until(lambda: not any(alive(pid) for pid in frozen), 30, "the frozen processes' end")
    rec = h.record(home, run)
    first, second = rec["attempts"]
    assert [first["outcome"], second["outcome"]] == ["node_lost", "succeeded"], rec["final_report"]
    assert "no liveness beat" in first["evidence"] and first["failed_host"] == victim, first["evidence"]
    assert h.final_state(path) == expected(50)


def test_the_time_limit_saves_resubmits_exactly_and_spends_no_retry(slurm_cluster: SlurmCluster, home: Path):
    """slurm.time_limit 3m, signal_lead 70s (the save's room, kubernetes.termination_grace_period,
    10s): slurmctld sends --signal=TERM@70 on its 30 s check (job_time_limit: warn_time +
    PERIODIC_TIMEOUT + now >= end_time), 80-140 s into the attempt, well after torch's import on a
    loaded host (a signal inside the import kills the worker before the runtime can save: with a
    2m limit it came 20-50 s in, and did). The runtime saves a checkpoint and exits 83 (no periodic
    checkpoint: every_steps 1000, so a resume can only come from that save); the run resubmits from
    it, spending no retry (restart.max_attempts 1), and the final state is an uninterrupted run's,
    bit for bit.

    Attempt 0 steps at 0.2 s, so it cannot reach step 1000 before the signal (140 s: 700 steps at
    most); attempt 1 steps at 0.01 s and is done long before its own. (With one pace for both, a
    loaded CI host once saw attempt 0 finish all its steps as the signal came: that is
    test_supervisor's scheduler-signal-after-completion case now, a success on attempt 0.) About
    two and a half minutes: the price of Slurm's one-minute limits."""
    run = "sl-limit"
    path = spec(home, run, steps=1000, every=1000, sleep=0.01, job_args=["--first-attempt-sleep", "0.2"],
                restart={"max_attempts": 1})
    path.write_text(path.read_text() + "slurm:\n  time_limit: 3m\n  signal_lead: 70s\n"
                    "kubernetes:\n  termination_grace_period: 10s\n")
    w = watch(path, home)
    assert w.wait(timeout=280) == 0, w.output
    rec = h.record(home, run)
    first, second = rec["attempts"]
    assert [first["outcome"], second["outcome"]] == ["preempted", "succeeded"], rec["final_report"]
    saved = first["last_checkpoint_step"]
    assert saved is not None and 0 < saved < 1000 and second["resumed_from_step"] == saved, rec["final_report"]
    assert h.final_state(path) == expected(1000)


def _hosts(cluster: SlurmCluster, home: Path, run: str, attempt: int) -> list[str]:
    nodelist = cluster.job(_job_id(home, run, attempt))["NodeList"]
    return cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()


def _job_id(home: Path, run: str, attempt: int) -> str:
    return json.loads((h.run_folder(home, run) / f"attempt-{attempt}" / "job.json").read_text())["job_id"]


@pytest.mark.parametrize("phase", ["pending", "running"])
def test_cancel_ends_the_slurm_job(slurm_cluster: SlurmCluster, home: Path, phase: str):
    """`wmctl cancel` from another process: the watcher ends with the cancel's exit code (8) and
    the Slurm job is CANCELLED, whether it waited in the queue (--begin an hour from now:
    pending, reason BeginTime, a queue's wait that no timeout ends) or ran. A running job is
    SIGKILLed, never SIGTERMed first: no node saved on a signal or recorded its end (Slurm's own
    termination, SIGTERM then KillWait, would let the counter save and exit 83; a failed attempt's
    teardown is this same cancel, and its survivors, blocked on a dead peer, would hold their nodes
    for KillWait)."""
    run = f"sl-cancel-{phase}"
    path = spec(home, run, steps=400, sleep=0.2)
    if phase == "pending":
        path.write_text(path.read_text() + "slurm:\n  extra_options: [--begin=now+3600]\n")
    w = watch(path, home)
    if phase == "pending":
        h.wait_until(lambda: (h.run_folder(home, run) / "attempt-0" / "job.json").exists(), 60, "the job")
        h.wait_until(lambda: "BeginTime" in json.dumps(h.record(home, run)), 30, "the pending reason in the record")
    else:
        h.wait_step(home, run, 0, 2)
    cancel = wmctl(home, "cancel", run)
    assert cancel.returncode == 0, cancel.stderr
    assert w.wait() == 8, w.output
    slurm_cluster.wait_job_state(_job_id(home, run, 0), {"CANCELLED"}, 60)
    assert len(h.record(home, run)["attempts"]) == 1
    if phase == "running":
        folder = h.run_folder(home, run) / "attempt-0"
        assert not list(folder.glob("node-*.exit.json")), [p.read_text() for p in folder.glob("node-*.exit.json")]
        assert not [p for p in h.progress(home, run, 0) if p["event"] == "preempted"]


def test_cancel_during_the_backoff_submits_nothing_more(slurm_cluster: SlurmCluster, home: Path):
    """A cancel while the watcher waits out its backoff after a failed attempt: the watcher wakes
    for it (not after the 300 s backoff), ends cancelled (8), and no second Slurm job is ever
    submitted. The failure: node 1's task processes SIGSTOPped (its slurmd stays up), so the
    runtime's beat names the node silent and the failed attempt's teardown SIGKILLs them. The node
    is not excluded (restart.exclude_failed_nodes: false): a next attempt that goes elsewhere
    starts without a backoff."""
    run = "sl-backoff"
    path = spec(home, run, steps=400, every=5, sleep=0.2, job_args=["--beat"],
                restart={"node_silence_timeout": "3s", "heartbeat_timeout": "120s", "backoff": "300s",
                         "exclude_failed_nodes": False})     # an excluded node skips the backoff
    w = watch(path, home)
    h.wait_checkpoint(home, run, 0, 5)
    victim = _hosts(slurm_cluster, home, run, 0)[1]
    tasks = {pid for pid in slurm_cluster.node_processes(victim) - set(slurm_cluster.slurmd_pids(victim))
             if not (proc_argv(pid)[:1] or [""])[0].startswith("slurmstepd")}
    assert tasks, f"no task processes on {victim}"
    for pid in tasks:
        h.os.kill(pid, h.signal.SIGSTOP)
    try:
        try:
            h.wait_until(lambda: "backing off 300 s" in w.output, 120, "the backoff")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the watcher said:\n{w.output}") from None
        started = time.monotonic()
        cancel = wmctl(home, "cancel", run)
        assert cancel.returncode == 0, cancel.stderr
        assert w.wait(timeout=60) == 8, w.output
        assert time.monotonic() - started < 30, "the watcher slept out its backoff instead of waking for the cancel"
    finally:
        for pid in tasks:
            if alive(pid):
                h.os.kill(pid, h.signal.SIGKILL)
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["node_lost"], rec["final_report"]
    assert sorted(p.name for p in h.run_folder(home, run).glob("attempt-*")) == ["attempt-0"]
    ended = {"CANCELLED", "FAILED", "COMPLETED", "<gone>"}       # COMPLETING is Slurm still tidying up
    h.wait_until(lambda: job_state(slurm_cluster, home, run, 0) in ended, 60, "the first job's end")


def test_graceful_cancel_keeps_the_sigterm_checkpoint(slurm_cluster: SlurmCluster, home: Path):
    """`wmctl cancel --graceful`: scancel --signal=TERM reaches the steps, the job saves and
    exits 83 on both nodes (their exit records say so), then the job is ended."""
    run = "sl-graceful"
    w = watch(spec(home, run, steps=400, every=1000, sleep=0.2), home)
    h.wait_step(home, run, 0, 3)
    cancel = wmctl(home, "cancel", run, "--graceful")
    assert cancel.returncode == 0, cancel.stderr
    assert w.wait() == 8, w.output
    rec = h.record(home, run)
    assert "gracefully" in rec["final_report"] and "newest checkpoint is step" in rec["final_report"], rec
    # both nodes saved and ended by themselves (torchrun's agent exits 1 whatever its workers' 83)
    folder = h.run_folder(home, run) / "attempt-0"
    assert all((folder / f"node-{n}.exit.json").exists() for n in (0, 1))
    [preempted] = [p for p in h.progress(home, run, 0) if p["event"] == "preempted"]
    assert f"newest checkpoint is step {preempted['step']}" in rec["final_report"], rec["final_report"]


def test_a_request_slurm_can_never_run_stops_at_once(slurm_cluster: SlurmCluster, home: Path):
    """nodes: 4 on a three-node partition: sbatch takes it, Slurm holds it pending forever
    (PartitionConfig with --exclusive, PartitionNodeLimit without); the run stops at once with
    the fix, no pending_timeout waited."""
    run = "sl-four"
    w = watch(spec(home, run, nodes=4, steps=5, restart={"pending_timeout": "30m"}), home)
    assert w.wait(timeout=120) == 7, w.output
    rec = h.record(home, run)
    first = rec["attempts"][0]
    assert first["outcome"] == "unschedulable" and len(rec["attempts"]) == 1
    assert "4 nodes asked, the partition holds 3" in first["evidence"], first["evidence"]


def test_sbatch_refusal_names_the_field(slurm_cluster: SlurmCluster, home: Path):
    """An sbatch refusal is the backend's refusal (exit 4) naming the spec field, no traceback."""
    path = spec(home, "sl-nopart", steps=5)
    path.write_text(path.read_text() + "slurm:\n  partition: nosuch\n")
    out = wmctl(home, "submit", str(path), "-b", "slurm")
    assert out.returncode == 4, out.stdout + out.stderr
    assert "slurm.partition" in out.stderr and "invalid partition" in out.stderr and "Traceback" not in out.stderr


def test_an_unwatched_runtime_free_script_and_a_crash_in_the_jobs_own_words(slurm_cluster: SlurmCluster,
                                                                            home: Path):
    """A script that never imports the runtime runs to its end while nobody watches (its watcher
    SIGKILLed once the job is submitted), and Slurm has forgotten the job when `wmctl status` and
    `wmctl list` look: they read how it ended from the job's own exit records. (Slurm forgets a
    finished job after MinJobAge, 300 s, without slurmdbd; the test stands in for that wait by
    pointing the attempt's job.json at a job id this cluster never had: scontrol's own answer for a
    forgotten job, "Invalid job id specified".) One whose rank raises stops the run (exit 7) with
    its own error in the record."""
    plain = watch(spec(home, "sl-plain", nodes=2, command=["python", "plain.py", "--steps", "3", "--sleep", "0.2"]),
                  home)
    crash = watch(spec(home, "sl-crash", nodes=2, command=["python", "crash.py"]), home)
    folder = h.run_folder(home, "sl-plain") / "attempt-0"
    h.wait_until(lambda: (folder / "job.json").exists(), 60, "sl-plain's job")
    plain.kill()
    h.wait_until(lambda: (folder / "job.exit.json").exists(), 120, "sl-plain's job exit record")
    assert "my own log: step 3" in (folder / "node-0.log").read_text()
    job_id = _job_id(home, "sl-plain", 0)
    slurm_cluster.wait_job_state(job_id, {"COMPLETED"}, 60)
    forgotten = str(int(job_id) + 100000)
    assert slurm_cluster.job(forgotten) == {}
    job = json.loads((folder / "job.json").read_text())
    (folder / "job.json").write_text(json.dumps({**job, "job_id": forgotten}))
    assert h.record(home, "sl-plain")["status"] == "running"      # as the killed watcher left it
    status = wmctl(home, "status", "sl-plain")
    assert status.returncode == 0 and "succeeded" in status.stdout, status.stdout + status.stderr
    rec = h.record(home, "sl-plain")
    assert rec["status"] == "succeeded" and rec["attempts"][0]["outcome"] == "succeeded", rec
    listed = wmctl(home, "list")
    assert "succeeded" in next(ln for ln in listed.stdout.splitlines() if "sl-plain" in ln), listed.stdout
    assert crash.wait() == 7, crash.output
    first = h.record(home, "sl-crash")["attempts"][0]
    assert first["outcome"] == "app_error" and "bad batch shape (4, 3)" in first["evidence"], first["evidence"]


def test_doctor_slurm_checks_the_cluster_from_the_submit_host(slurm_cluster: SlurmCluster, home: Path):
    """`wmctl doctor --slurm --spec`: sinfo, the partition, munge, and the run folder and checkpoint
    dir written from an srun step on each node and read here; a partition that does not exist is an
    error naming the field (exit 9)."""
    path = spec(home, "sl-doctor", steps=5)
    ok = wmctl(home, "doctor", "--slurm", "--spec", str(path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "partition debug is up with 3 nodes" in ok.stdout and "munge -n | unmunge works" in ok.stdout
    assert ok.stdout.count("read here") == 2, ok.stdout
    path.write_text(path.read_text() + "slurm:\n  partition: nosuch\n")
    bad = wmctl(home, "doctor", "--slurm", "--spec", str(path))
    assert bad.returncode == 9 and "partition nosuch does not exist" in bad.stdout and "slurm.partition" in bad.stdout
