"""Failure classification and decisions: pure functions over events, checked as tables."""

from __future__ import annotations

import pytest

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE


def ev(kind, t=100.0, node=1, code=None, reason=None, message=""):
    return b.Event(kind, t, node, f"host-{node}", exit_code=code, reason=reason, message=message)


def lost(t, node=1, since=None):
    """A node found gone (no exit status) at ``t``, last alive at ``since``."""
    return b.Event(b.NODE_LOST, t, node, f"host-{node}", reason="gone", since=since,
                   message="the node's processes vanished without an exit status (killed)")


@pytest.mark.parametrize("event, kind", [
    (ev(b.NODE_EXITED, code=0), None),
    (ev(b.NODE_EXITED, code=PREEMPTED_EXIT_CODE), F.PREEMPTED),
    (ev(b.NODE_EXITED, code=137, reason="OOMKilled"), F.OOM),
    (ev(b.NODE_EXITED, code=137), F.NODE_LOST),
    (ev(b.NODE_EXITED, code=-9), F.NODE_LOST),
    (ev(b.NODE_EXITED, code=1, reason="SIGKILL"), F.NODE_LOST),
    (ev(b.NODE_EXITED, code=143), F.PREEMPTED),
    (ev(b.NODE_EXITED, code=1), F.APP_ERROR),
    (ev(b.NODE_EXITED, code=2, reason="Error"), F.APP_ERROR),
    (ev(b.NODE_LOST, reason="NodeNotReady"), F.NODE_LOST),
    (ev(b.NODE_PAUSED), F.HANG),
    (ev(b.OOM_KILLED, code=137), F.OOM),
    (ev(b.IMAGE_PULL_FAILED, reason="ErrImagePull"), F.IMAGE_PULL),
    (ev(b.EVICTED, reason="DeletionByTaintManager"), F.PREEMPTED),
    (ev(b.CANCELLED), F.CANCELLED),
    (ev(b.NODE_STARTED), None),
    (ev(b.PROGRESS), None),
])
def test_each_event_maps_to_its_class(event, kind):
    found = F.classify_event(event)
    assert (found.kind if found else None) == kind
    if found:
        assert found.node == event.node and found.host == event.host and found.evidence


@pytest.mark.parametrize("events, kind, node", [
    # a survivor's crash a few seconds before the lost node is reported: the loss is the cause
    ([ev(b.NODE_EXITED, 100, 0, code=1), ev(b.NODE_LOST, 103, 1)], F.NODE_LOST, 1),
    # the same crash long before the loss: unrelated, the app error stands
    ([ev(b.NODE_EXITED, 100, 0, code=1), ev(b.NODE_LOST, 100 + F.CONSEQUENCE_WINDOW_S + 1, 1)], F.APP_ERROR, 0),
    # order of arrival does not matter, time does
    ([ev(b.NODE_LOST, 103, 1), ev(b.NODE_EXITED, 100, 0, code=1)], F.NODE_LOST, 1),
    # a node found gone without an exit status long after the survivor died of it (nobody looked):
    # it counts from its last sign of life, before that death, so it is still the cause
    ([ev(b.NODE_EXITED, 100, 0, code=1), lost(130, since=95)], F.NODE_LOST, 1),
    ([lost(130, since=95), ev(b.NODE_EXITED, 100, 0, code=1)], F.NODE_LOST, 1),
    ([ev(b.NODE_EXITED, 100, 0, code=1), lost(130, since=103)], F.NODE_LOST, 1),
    # ... but a node still alive (writing) long after the app error did not cause it
    ([ev(b.NODE_EXITED, 100, 0, code=1), lost(130, since=100 + F.CONSEQUENCE_WINDOW_S + 1)], F.APP_ERROR, 0),
    # a frozen node explains the survivor's timeout
    ([ev(b.NODE_EXITED, 100, 0, code=1), ev(b.NODE_PAUSED, 101, 1)], F.HANG, 1),
    # a graceful preemption checkpointed: a later loss does not re-label it
    ([ev(b.NODE_EXITED, 100, 0, code=PREEMPTED_EXIT_CODE), ev(b.NODE_LOST, 101, 1)], F.PREEMPTED, 0),
    # the first infrastructure failure wins over a later one
    ([ev(b.OOM_KILLED, 100, 0), ev(b.NODE_LOST, 102, 1)], F.OOM, 0),
    ([ev(b.NODE_EXITED, 100, 0, code=0), ev(b.NODE_EXITED, 101, 1, code=0)], None, None),
    ([], None, None),
])
def test_root_cause_is_the_first_failure_and_consequences_yield(events, kind, node):
    found = F.root_cause(events)
    assert (found.kind if found else None) == kind
    assert (found.node if found else None) == node


def test_hang_is_declared_only_past_the_heartbeat_timeout():
    assert F.hang_failure(last_heartbeat=100.0, now=130.0, timeout=30.0) is None
    hang = F.hang_failure(last_heartbeat=100.0, now=130.5, timeout=30.0)
    assert hang is not None
    assert hang.kind == F.HANG and "no progress line for 30 s" in hang.evidence


@pytest.mark.parametrize("kind, options, decision", [
    (F.NODE_LOST, {}, F.RETRY_ELSEWHERE),
    (F.NODE_LOST, {"exclude_failed_nodes": False}, F.RETRY),
    (F.HANG, {}, F.RETRY_ELSEWHERE),
    (F.PREEMPTED, {}, F.RETRY),
    (F.OOM, {}, F.STOP),
    (F.OOM, {"retry_on_oom": True}, F.RETRY),
    (F.IMAGE_PULL, {}, F.STOP),
    (F.APP_ERROR, {}, F.STOP),
    (F.CANCELLED, {}, F.STOP),
])
def test_decisions_follow_the_restart_policy(kind, options, decision):
    assert F.decide(F.Failure(kind, 1, "host-1", 0.0, "x"), **options) == decision


# ---- the failing rank's own words -------------------------------------------------------------

from orchestrator.failures import job_error  # noqa: E402

TORCHRUN_REPORT = [
    "Traceback (most recent call last):",
    '  File "/venv/bin/torchrun", line 6, in <module>',
    "    sys.exit(main())",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : {rank} (local_rank: 0)",
    "  exitcode  : {code} (pid: 2985) ",
]


def report(rank=0, code=1):
    return [line.format(rank=rank, code=code) for line in TORCHRUN_REPORT]


def test_the_root_cause_ranks_traceback_wins_over_others_and_the_launchers():
    lines = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/w/train.py", line 80, in <module>',
        "[rank0]: RuntimeError: Connection closed by peer",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/train.py", line 30, in step',
        "[rank1]:     loss = model(x)",
        "[rank1]: KeyError: 'pixel_values'",
        *report(rank=1),
    ]
    err = job_error(lines)
    assert err is not None and err.rank == 1 and err.exit_code == 1
    assert err.summary == "rank 1: KeyError: 'pixel_values' (File \"train.py\", line 30)"
    assert err.lines[-1] == "KeyError: 'pixel_values'" and 'File "/w/train.py", line 30, in step' in err.lines[0]


def test_an_unprefixed_traceback_is_the_jobs_when_it_has_a_user_frame():
    lines = ["Traceback (most recent call last):", '  File "/w/boom.py", line 1, in <module>',
             "    import torch", "ModuleNotFoundError: No module named 'torch'", *report()]
    err = job_error(lines)
    assert err is not None and err.summary.startswith("rank 0: ModuleNotFoundError: No module named 'torch'")


def test_command_not_found_names_the_command_and_the_exit_code():
    err = job_error(["wmctl-bind: error: command not found: python", *report(code=127)])
    assert err is not None and err.summary == "rank 0: command not found: python (exit 127)"


@pytest.mark.parametrize("code,meaning", [(-9, "killed (SIGKILL) from outside the job, with no OOM evidence"),
                                          (139, "segmentation fault"), (-7, "bus error")])
def test_an_exit_code_alone_is_explained(code, meaning):
    err = job_error(report(rank=3, code=code))
    assert err is not None and err.summary.startswith(f"rank 3 exit {code}: {meaning}")


def test_output_without_an_error_gives_none():
    assert job_error(["step 1", "step 2"]) is None
    assert job_error(report(code=1)) is None      # only the launcher's own traceback


def test_a_full_disk_in_the_ranks_words_is_storage_full_and_stops():
    lines = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/w/train.py", line 50, in <module>',
             "[rank0]: OSError: [Errno 28] No space left on device: '/ckpt/wm/step-00000200.tmp/shared.pt'",
             *report(rank=0)]
    err = job_error(lines)
    assert err is not None
    why = F.storage_full(err)
    assert why is not None and "/ckpt/wm/step-00000200.tmp/shared.pt" in why
    assert F.DEFAULT_DECISIONS[F.STORAGE_FULL] == F.STOP
    err = job_error(["[rank0]: Traceback (most recent call last):", "[rank0]: ValueError: nope", *report()])
    assert err is not None and F.storage_full(err) is None


def test_a_full_disk_without_a_path_names_no_frame_of_the_traceback_as_the_path():
    # The error of a write with no file name: the path after "device" is not there, and the
    # traceback's own frames ("/work/.../checkpoint.py") must not be taken for it.
    lines = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/work/orchestrator/runtime/checkpoint.py", line 501, in acquire',
             "[rank0]:     os.pwrite(fd, payload, 0)",
             "[rank0]: OSError: [Errno 28] No space left on device", *report(rank=0)]
    err = job_error(lines)
    assert err is not None
    why = F.storage_full(err)
    assert why is not None and "checkpoint.py" not in why and "writing" not in why


# ---- the launcher's own failures --------------------------------------------------------------
# Frames as torch 2.13's files name them (launcher/api.py launch_agent's finally, dynamic_rendezvous.py
# shutdown/_close, agent/server/api.py _invoke_run/_exit_barrier, c10d_rendezvous_backend.py).
TD = "/venv/lib/python3.11/site-packages/torch/distributed"


def frames(*where):
    out = []
    for path, fn in where:
        out += [f'  File "{TD}/{path}", line 10, in {fn}', "    code()"]
    return out


SHUTDOWN = ["Traceback (most recent call last):",
            '  File "/venv/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
            *frames(("launcher/api.py", "launch_agent"), ("elastic/rendezvous/dynamic_rendezvous.py", "shutdown"),
                    ("elastic/rendezvous/dynamic_rendezvous.py", "_close"),
                    ("elastic/rendezvous/c10d_rendezvous_backend.py", "_call_store")),
            "torch.distributed.DistNetworkError: failed to recv, got 0 bytes"]
MONITOR = ["Traceback (most recent call last):",
           '  File "/venv/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
           *frames(("launcher/api.py", "launch_agent"), ("elastic/agent/server/api.py", "_invoke_run"),
                   ("elastic/rendezvous/dynamic_rendezvous.py", "num_nodes_waiting")),
           "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
           "store has failed. See inner exception for details."]
USER = ["[rank1]:Traceback (most recent call last):", '[rank1]:  File "/w/train.py", line 3, in <module>',
        "[rank1]:    main()", "[rank1]:RuntimeError: boom"]


def test_an_agent_failing_only_on_its_way_out_is_shutdown_noise():
    assert F.shutdown_noise(["done rank 1", *SHUTDOWN]) == (
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes")


@pytest.mark.parametrize("lines", [
    MONITOR,                                   # lost the store while its workers ran: they were killed
    [*MONITOR, "During handling of the above exception, another exception occurred:", "", *SHUTDOWN],
    [*USER, *SHUTDOWN],                        # a worker failed
    [*SHUTDOWN, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
     "Root Cause (first observed failure):"],
    [*SHUTDOWN[:-1], "ValueError: something else"],
    ["done rank 1"],
])
def test_anything_else_is_not_shutdown_noise(lines):
    assert F.shutdown_noise(lines) is None


def test_a_worker_dying_of_an_abort_with_no_error_of_its_own_is_a_teardown_crash():
    assert F.teardown_crash(["terminate called without an active exception", *report(rank=1, code=-6)]) \
        == "rank 1 exit -6: aborted (SIGABRT)"
    assert F.teardown_crash(report(rank=0, code=-11)) == "rank 0 exit -11: segmentation fault"


@pytest.mark.parametrize("lines", [
    report(rank=1, code=1),                     # an exit code, not a signal
    report(rank=1, code=-9),                    # killed from outside: not the job's own teardown
    [*USER, *report(rank=1, code=-6)],          # the worker raised first: its error is the story
    ["done rank 1"],
])
def test_a_worker_that_failed_with_words_or_was_killed_is_no_teardown_crash(lines):
    assert F.teardown_crash(lines) is None


def as_module(block):
    """The same traceback when torchrun runs as `python -m torch.distributed.run` (the local
    backend): the interpreter's <frozen runpy> frames come first."""
    return [block[0], '  File "<frozen runpy>", line 198, in _run_module_as_main',
            '  File "<frozen runpy>", line 88, in _run_code', "    exec(code, run_globals)", *block[1:]]


def test_the_interpreters_frozen_frames_are_neither_the_launchers_nor_the_jobs():
    """A launcher traceback under `python -m` is still the launcher's (a rendezvous failure,
    shutdown noise), and a job's error never names <frozen runpy> as where it happened."""
    assert F.rendezvous_failure(as_module(MONITOR)) is not None
    assert F.shutdown_noise(["done rank 1", *as_module(SHUTDOWN)]) is not None
    err = F.job_error(as_module(["Traceback (most recent call last):", '  File "/w/train.py", line 7, in <module>',
                                 "    main()", "ValueError: bad"]))
    assert err is not None and err.summary == 'ValueError: bad (File "train.py", line 7)'


@pytest.mark.parametrize("keeper", ["/venv/lib/python3.11/site-packages/orchestrator/runtime/keeper.py",
                                    "/wmctl-spares/keeper.py", "/opt/wmctl/keeper.py"])
def test_a_keepers_forked_torchrun_that_lost_the_rendezvous_is_the_launchers_not_the_jobs(keeper):
    """With spare nodes the keeper forks torchrun's main (runtime/keeper.py): the agent's
    traceback starts in the keeper's frames, where it runs on each backend. Still the launcher's:
    a rendezvous failure (infrastructure, retried), never the job's own error."""
    from orchestrator.backends.docker import spares as docker_spares
    from orchestrator.backends.kubernetes import spares as kube_spares

    assert docker_spares.KEEPER == "/wmctl-spares/keeper.py"
    assert f"{kube_spares.FILES_DIR}/{kube_spares.KEEPER_FILE}" == "/opt/wmctl/keeper.py"
    forked = [MONITOR[0], f'  File "{keeper}", line 300, in run_rounds', "    proc = Forked(main, ...)",
              f'  File "{keeper}", line 150, in __init__', "    self.main(argv)", *MONITOR[1:]]
    found = F.rendezvous_failure(forked)
    assert found and "RendezvousConnectionError" in found
    assert F.own_error(1, False, forked) is None


def test_a_rendezvous_failure_is_infrastructure_but_never_hides_a_workers_error():
    found = F.rendezvous_failure(MONITOR)
    assert found and "RendezvousConnectionError" in found and "read_timeout" in found
    assert F.rendezvous_failure([*USER, *MONITOR]) is None
    assert F.rendezvous_failure(["exit 1"]) is None
    assert F.decide(F.Failure(F.RENDEZVOUS, 1, "h", 0.0, "x")) == F.RETRY



def test_a_node_found_gone_is_dated_from_its_last_sign_of_life_by_the_local_backend():
    from orchestrator.backends.local.classify import NodeView, node_events

    w = NodeView(1, "localhost-1")
    pids = {"keeper": 1, "agent": 2, "started": 10.0}
    [gone] = node_events(w, None, pids, None, None, last_alive=42.0)
    assert (gone.kind, gone.since, w.phase) == (b.NODE_LOST, 42.0, b.LOST)
    assert gone.time > 42.0            # when it was seen
    found = F.root_cause([b.Event(b.NODE_EXITED, 50.0, 0, "localhost-0", exit_code=1), gone])
    assert found is not None and (found.kind, found.node, found.since) == (F.NODE_LOST, 1, 42.0)


def _cgroup_root(tmp_path, oom_kill):
    (tmp_path / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/user.slice/job\n")
    events = tmp_path / "sys" / "fs" / "cgroup" / "user.slice" / "job" / "memory.events"
    events.parent.mkdir(parents=True, exist_ok=True)
    events.write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n")
    return events


def test_the_local_keeper_reads_its_cgroup_v2_oom_kill_count(tmp_path):
    from orchestrator.backends.local.agent import oom_kills

    events = _cgroup_root(tmp_path, 2)
    assert oom_kills(str(tmp_path)) == (2, str(events))
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/x\n0::/\n")     # v1 memory, no v2 file
    assert oom_kills(str(tmp_path)) is None
    assert oom_kills(str(tmp_path / "nowhere")) is None


def test_a_local_node_whose_cgroup_counted_an_oom_kill_is_oom_and_stops_by_default():
    """Issue 22 item 10.5: a rank SIGKILLed by the OOM killer made torchrun exit 1: app_error, no
    word of memory. The keeper's exit file says how many oom_kills its cgroup counted meanwhile."""
    from orchestrator.backends.local.classify import NodeView, node_events

    w = NodeView(1, "localhost-1")
    [ev] = node_events(w, {"exit_code": 1, "signal": None, "time": 5.0, "oom_kills": 1,
                           "oom_cgroup": "/sys/fs/cgroup/job/memory.events"}, None, None, None)
    assert ev.kind == b.OOM_KILLED and ev.reason == "OOMKilled" and w.phase == b.FAILED
    failure = F.classify_event(ev)
    assert failure is not None and failure.kind == F.OOM and failure.node == 1
    assert "OOM killer" in failure.evidence and "/sys/fs/cgroup/job/memory.events" in failure.evidence
    assert F.decide(failure) == F.STOP and F.decide(failure, retry_on_oom=True) == F.RETRY
    # no oom_kill counted: the exit is what it was
    [plain] = node_events(NodeView(1, "h"), {"exit_code": 1, "signal": None, "time": 5.0}, None, None, None)
    assert plain.kind == b.NODE_EXITED and (failure := F.classify_event(plain)) is not None
    assert failure.kind == F.APP_ERROR


def test_a_rank_killed_by_sigkill_says_how_to_check_for_the_oom_killer():
    err = job_error(report(rank=1, code=-9))
    assert err is not None and err.summary.startswith("rank 1 exit -9: killed (SIGKILL)")
    assert "OOM killer" in err.summary and "dmesg" in err.summary and "memory.max" in err.summary
