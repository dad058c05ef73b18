"""Slurm's evidence -> events -> failure classes: the pure table (classify.py), what the client
tools print (tools.py, the lines test_cluster.py's docstring records as measured on Slurm 22.05),
and what the supervisor decides for each."""

from __future__ import annotations

import pytest

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.backends.slurm import classify as C
from orchestrator.backends.slurm.tools import (parse_fields, parse_sacct, parse_sbatch, parse_scontrol_job,
                                               parse_sinfo)

# Measured on the test cluster (scontrol show job -o, trimmed to the keys the engine reads).
RUNNING = "JobId=12 JobName=r-a0 UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) ExitCode=0:0 " \
          "RunTime=00:00:05 NodeList=n[1-2] BatchHost=n1 Comment=two words here"
NODE_FAIL = "JobId=13 JobName=r-a0 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:15 NodeList=n[1-2] BatchHost=n1"
PENDING_BIG = "JobId=14 JobName=big-a0 JobState=PENDING Reason=PartitionNodeLimit ExitCode=0:0 NodeList=(null)"


def test_scontrol_lines_parse_to_state_reason_exit_and_nodes():
    job = parse_scontrol_job("12", RUNNING)
    assert (job.state, job.reason, job.exit_code, job.exit_signal, job.nodes) == ("RUNNING", "None", 0, 0, "n[1-2]")
    assert parse_fields(RUNNING)["Comment"] == "two words here"       # a value runs to the next Key=
    failed = parse_scontrol_job("13", NODE_FAIL)
    assert (failed.state, failed.reason, failed.exit_signal) == ("NODE_FAIL", "NodeDown", 15)
    assert parse_scontrol_job("14", PENDING_BIG).nodes == ""
    # a state with flags (newer releases print e.g. CANCELLED+... in some views)
    assert parse_scontrol_job("15", "JobId=15 JobState=RUNNING+REQUEUED Reason=None ExitCode=0:0").state == "RUNNING"


def test_sacct_parsable2_says_who_cancelled():
    job = parse_sacct("9", "CANCELLED by 1000|0:15|n[1-2]\n")
    assert job is not None and (job.state, job.reason, job.nodes, job.source) == ("CANCELLED", "by uid 1000",
                                                                                   "n[1-2]", "sacct")
    assert parse_sacct("9", "") is None


def test_sinfo_marks_a_node_slurm_does_not_hear_from():
    states = parse_sinfo("n1|mixed|none\nn2|mixed*|none\nn3|down*|Not responding\n")
    assert states["n1"].responding and not states["n1"].down
    assert not states["n2"].responding and states["n2"].down         # missed pings: lost before DOWN
    assert states["n3"].down and states["n3"].reason == "Not responding"


def test_sbatch_parsable_prints_the_id_and_maybe_the_cluster():
    assert parse_sbatch("42\n") == "42" and parse_sbatch("42;cluster\n") == "42"
    assert parse_sbatch("") is None and parse_sbatch("sbatch: error\n") is None


@pytest.mark.parametrize("reason, kind", [
    ("Resources", b.NODE_QUEUED), ("Priority", b.NODE_QUEUED), ("Dependency", b.NODE_QUEUED),
    ("ReqNodeNotAvail,_UnavailableNodes:n2", b.NODE_WAITING), ("JobHeldAdmin", b.NODE_WAITING),
    ("QOSGrpNodeLimit", b.NODE_WAITING), ("PartitionDown", b.NODE_WAITING),
    ("PartitionNodeLimit", b.NODE_UNPLACEABLE), ("PartitionTimeLimit", b.NODE_UNPLACEABLE),
    ("InvalidQOS", b.NODE_UNPLACEABLE), ("QOSMaxNodePerJobLimit", b.NODE_UNPLACEABLE),
    ("AssocMaxWallDurationPerJobLimit", b.NODE_UNPLACEABLE), ("BadConstraints", b.NODE_UNPLACEABLE),
])
def test_a_pending_reason_waits_needs_a_person_or_never_clears(reason, kind):
    ev = C.pending_event(reason, nodes=4, partition_nodes=3)
    assert ev is not None and ev.kind == kind


def _pending(reason: str, **kw: int) -> b.Event:
    ev = C.pending_event(reason, **kw)
    assert ev is not None, reason
    return ev


def test_a_request_bigger_than_the_partition_stops_at_once_with_the_fix():
    ev = C.pending_event("PartitionNodeLimit", nodes=4, partition_nodes=3)
    assert ev is not None
    failure = F.classify_event(ev)
    assert failure is not None and failure.kind == F.UNSCHEDULABLE
    assert "nodes: 4 nodes asked, the partition holds 3" in failure.evidence
    assert "4 nodes asked" in _pending("PartitionConfig", nodes=4, partition_nodes=3).message
    # the same reason for another cause says what else to check
    assert "slurm.gres" in _pending("PartitionConfig", nodes=2, partition_nodes=3).message
    assert F.decide(failure) == F.STOP
    # ... unless nodes were excluded: then it is retried with none excluded (never exclude so many
    # nodes that the partition cannot hold the job)
    assert F.decide(failure, excluded=True) == F.RETRY
    # a queue's wait is no failure at all
    assert F.classify_event(_pending("Resources", nodes=2)) is None


def _ended(state: str, **kw):
    args = {"job_id": "7", "exit_code": 0, "reason": "None", "hosts": ["n1", "n2"], "down": {}, "recorded": set(),
            "now": 100.0, **kw}
    return C.ended_events(state, **args)


def test_node_fail_names_the_dead_node_from_its_node_state():
    [ev] = _ended("NODE_FAIL", down={"n2": ("down*", "Not responding")}, recorded={0})
    assert (ev.kind, ev.node, ev.host) == (b.NODE_LOST, 1, "n2")
    assert "NODE_FAIL" in ev.message and "down*" in ev.message and "Not responding" in ev.message
    failure = F.classify_event(ev)
    assert failure is not None and failure.kind == F.NODE_LOST and F.decide(failure) == F.RETRY_ELSEWHERE
    [anon] = _ended("NODE_FAIL")
    assert anon.kind == b.NODE_LOST and anon.host is None


@pytest.mark.parametrize("state, failure_kind, decision", [
    ("NODE_FAIL", F.NODE_LOST, F.RETRY_ELSEWHERE),
    ("BOOT_FAIL", F.NODE_LOST, F.RETRY_ELSEWHERE),
    ("PREEMPTED", F.PREEMPTED, F.RETRY),
    ("TIMEOUT", F.PREEMPTED, F.RETRY),
    ("OUT_OF_MEMORY", F.OOM, F.STOP),
    ("CANCELLED", F.CANCELLED, F.STOP),
    ("DEADLINE", F.CANCELLED, F.STOP),
    ("FAILED", F.APP_ERROR, F.STOP),
])
def test_each_end_state_is_a_failure_class_and_a_decision(state, failure_kind, decision):
    events = _ended(state, exit_code=3, down={"n2": ("down*", "Not responding")})
    root = F.root_cause(events)
    assert root is not None and root.kind == failure_kind, events
    assert F.decide(root) == decision


def test_ends_with_nothing_to_add():
    assert _ended("COMPLETED", recorded={0, 1}) == []
    # FAILED with the nodes' own records: those records (and their exit codes) say it all
    assert _ended("FAILED", recorded={0, 1}) == []


def test_a_failed_batch_script_names_its_exit_code_and_where_to_look():
    [ev] = _ended("FAILED", exit_code=7, reason="NonZeroExitCode")
    assert (ev.kind, ev.node, ev.exit_code) == (b.NODE_EXITED, 0, 7) and "batch.log" in ev.message


def test_cancelled_says_who_when_slurm_does():
    [ev] = _ended("CANCELLED", reason="by uid 1000")
    assert "by uid 1000" in ev.message and "outside wmctl" in ev.message


@pytest.mark.parametrize("stderr, field", [
    ("sbatch: error: Batch job submission failed: invalid partition specified: nosuch", "slurm.partition"),
    ("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification", "slurm.gres"),
    ("sbatch: error: Memory specification can not be satisfied\nsbatch: error: Batch job submission failed: "
     "Requested node configuration is not available", "resources.memory"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", "nodes"),
    ("sbatch: error: something new", "slurm"),
])
def test_sbatch_refusals_name_the_field(stderr, field):
    got, why = C.sbatch_refusal(stderr)
    assert got == field and "sbatch refused the job" in why and stderr.splitlines()[-1].strip()[-40:] in why


def test_node_records_are_read_whole_or_not_at_all():
    end = C.node_end('{"node": 1, "host": "n2", "exit_code": 137, "job_id": "5", "time": 10}')
    assert end is not None and C.node_exited(end).reason == "SIGKILL"
    assert C.node_end('{"node": 1, "host": "n2", "exit_') is None
    assert C.job_end('{"job_id": "5", "exit_code": 0, "time": 3}') is not None
