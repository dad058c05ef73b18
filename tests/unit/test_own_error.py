"""The job's own error told from a peer's breakage in one node's output (failures.own_error), and
a Kubernetes keeper's ``keeper_exit`` line turned into its slot's NODE_EXITED at once only then
(kubernetes/rounds.keeper_exit): anything unclear waits for the keeper's hold (docs/spares.md).

The outputs are real: torchrun of torch 2.13 on this machine, two nodes of two gloo workers (one
of one), each node's output as its pod's log holds it (paths shortened, the caret lines dropped).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.backends.kubernetes.rounds import keeper_exit
from orchestrator.backends.slurm import classify as slurm
from orchestrator.runtime import keeper
from orchestrator.runtime.protocol import PREEMPTED_EXIT_CODE, parse_progress

TD = "/venv/lib/python3.11/site-packages/torch/distributed"
LAUNCHER = [
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    '  File "<frozen runpy>", line 88, in _run_code',
    f'  File "{TD}/run.py", line 1032, in <module>',
    "    main()",
    f'  File "{TD}/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper',
    "    return f(*args, **kwargs)",
    f'  File "{TD}/launcher/api.py", line 383, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "job.py FAILED",
]


def torchrun_failed(local_rank: int, code: int, others: list[tuple[int, int]], rank: int) -> list[str]:
    """torchrun's lines once a worker failed: its agent's log line, its traceback, its report."""
    out = [f"E1207 12:12:12.056000 609 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: "
           f"{code}) local_rank: {local_rank} (pid: 1290) of binary: /venv/bin/python", *LAUNCHER, "Failures:"]
    for other, other_code in others:
        out += [f"  rank      : {other} (local_rank: 0)", f"  exitcode  : {other_code} (pid: 1288)  (SIGTERM)",
                "  traceback : Signal 15 (SIGTERM) received by PID 1288"]
    if not others:
        out.append("  <NO_OTHER_FAILURES>")
    return out + ["Root Cause (first observed failure):", "[0]:", f"  rank      : {rank} (local_rank: {local_rank})",
                  f"  exitcode  : {code} (pid: 1290) ", "  error_file: <N/A>",
                  "============================================================"]


def raised(rank: int) -> list[str]:
    return [f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/w/job.py", line 12, in <module>',
            f'[rank{rank}]:     raise ValueError(f"bad batch at step {{step}}")',
            f"[rank{rank}]: ValueError: bad batch at step 20"]


def broken(rank: int, how: str) -> list[str]:
    return [f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/w/job.py", line 9, in <module>', f"[rank{rank}]:     dist.all_reduce(t)",
            f'[rank{rank}]:   File "{TD}/distributed_c10d.py", line 3252, in all_reduce',
            f"[rank{rank}]:     work.wait()",
            f"[rank{rank}]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
            f"{how} [127.0.0.1]:22230. This is typically caused by a remote worker crashing. Check the logs of "
            "the remote worker before reporting an error. GLHF!"]


SIGTERM_LOCAL = ("W1207 12:12:11.906000 609 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
                 "1288 closing signal SIGTERM")
# every rank raised; on this node a worker's exit 1 was seen first (the other was stopped by its agent)
EVERY_RANK_RAISED = [*raised(3), *raised(2), SIGTERM_LOCAL,
                     *torchrun_failed(1, 1, [(2, -15)], rank=3)]
# ... and on the other node its worker aborted in gloo's teardown after its own traceback
RAISED_THEN_ABORTED = [*raised(0), *raised(1), "terminate called without an active exception", SIGTERM_LOCAL,
                       *torchrun_failed(0, -6, [(1, -15)], rank=0)]
# the other node's machine died: this node's workers lost their connections (gloo)
PEER_DIED = [*broken(1, "Read error: Connection reset by peer"), *broken(0, "Connection closed by peer"),
             SIGTERM_LOCAL, *torchrun_failed(1, 1, [(0, -15)], rank=1)]
# one rank exited (sys.exit(1)); its neighbour on the same node saw the connection close
ONE_RANK_BESIDE_A_BROKEN_ONE = ["injected application error", *broken(2, "Connection closed by peer"), SIGTERM_LOCAL,
                                *torchrun_failed(1, 1, [(2, -15)], rank=3)]
# one rank exited alone on its node (one worker): gloo aborts it on its way out, no traceback
ONE_RANK_ABORTED = ["injected application error", "terminate called without an active exception",
                    *torchrun_failed(0, -6, [], rank=1)]
# a worker that said why and exited (python's own words for a missing script)
NO_SCRIPT = ["/venv/bin/python: can't open file '/w/tran.py': [Errno 2] No such file or directory",
             *torchrun_failed(0, 2, [], rank=0)]
# NCCL's watchdog aborting a worker whose peer stopped answering (torch 2.x ProcessGroupNCCL's words)
NCCL_WATCHDOG = [
    "[rank1]:[E1207 12:30:01.000000 77 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600047 "
    "milliseconds before timing out.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    *torchrun_failed(0, -6, [], rank=1)]
RENDEZVOUS = ["Traceback (most recent call last):", '  File "/venv/bin/torchrun", line 8, in <module>',
              "    sys.exit(main())", f'  File "{TD}/launcher/api.py", line 10, in launch_agent', "    code()",
              f'  File "{TD}/elastic/agent/server/api.py", line 10, in _invoke_run', "    code()",
              "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
              "store has failed. See inner exception for details."]
KILLED = ["step 40", *torchrun_failed(0, -9, [], rank=1)]     # the OOM killer's SIGKILL: no words


@pytest.mark.parametrize("lines, summary", [
    (EVERY_RANK_RAISED, 'rank 3: ValueError: bad batch at step 20 (File "job.py", line 12)'),
    (RAISED_THEN_ABORTED, 'rank 0: ValueError: bad batch at step 20 (File "job.py", line 12)'),
    (NO_SCRIPT, "rank 0: /venv/bin/python: can't open file '/w/tran.py': [Errno 2] No such file or directory "
                "(exit 2)"),
], ids=["every-rank-raised", "raised-then-aborted", "last-words"])
def test_the_jobs_own_error_is_told_at_once(lines, summary):
    error = F.own_error(1, False, lines)
    assert error is not None and error.summary == summary


@pytest.mark.parametrize("code, signalled, lines", [
    (1, False, PEER_DIED),                       # the usual survivor: a peer died under it
    (1, False, ONE_RANK_BESIDE_A_BROKEN_ONE),    # the job's error, but a broken connection beside it: unclear
    (1, False, ONE_RANK_ABORTED),                # an abort with no traceback: not told from a crash
    (1, False, NCCL_WATCHDOG),                   # a collective timed out: a peer may be frozen or dead
    (1, False, RENDEZVOUS),                      # the agent's, not the job's
    (1, False, KILLED),                          # a worker killed from outside (the OOM killer)
    (137, True, EVERY_RANK_RAISED),              # torchrun itself killed: whatever it said before
    (1, True, EVERY_RANK_RAISED),
    (PREEMPTED_EXIT_CODE, False, EVERY_RANK_RAISED),    # checkpointed and stopped: a preemption
    (0, False, EVERY_RANK_RAISED),
    (1, False, []),                               # nothing read
    (1, False, ["step 1", "step 2"]),            # nothing said
], ids=["peer-died", "beside-a-broken-one", "abort-no-traceback", "nccl-watchdog", "rendezvous", "killed",
        "torchrun-sigkill", "signalled", "preempted", "exit-0", "empty", "no-words"])
def test_anything_a_peer_may_have_caused_or_that_is_unclear_is_no_own_error(code, signalled, lines):
    assert F.own_error(code, signalled, lines) is None


def test_a_peers_breakage_is_read_alike_by_every_backend():
    """One reading of a broken connection (failures.peer_broke): Slurm's engine holds such an exit
    for the peer's record, a Kubernetes keeper's exit with it is never the job's own error."""
    assert F.peer_broke(PEER_DIED) and not F.peer_broke(EVERY_RANK_RAISED)
    assert slurm.peer_broke(1, PEER_DIED) and not slurm.peer_broke(PREEMPTED_EXIT_CODE, PEER_DIED)
    assert not slurm.peer_broke(1, EVERY_RANK_RAISED)


def marker(round_: int = 2, slot: int | None = 1, code: int = 1, signal: int | None = None) -> dict:
    payload = parse_progress(keeper.exit_line(round_, slot, code, signal, when=50.0))
    assert payload is not None
    return payload


def test_a_keeper_exit_of_the_current_round_with_the_jobs_error_is_its_slots_exit_at_once():
    ev = keeper_exit(marker(), EVERY_RANK_RAISED, 1, "node-b", current=2, active=[0, 1])
    assert ev is not None and (ev.kind, ev.node, ev.host, ev.exit_code, ev.time) == (b.NODE_EXITED, 1, "node-b", 1,
                                                                                     50.0)
    assert "ValueError: bad batch at step 20" in (ev.message or "")
    failure = F.classify_event(ev)
    assert failure is not None and (failure.kind, failure.node, failure.host) == (F.APP_ERROR, 1, "node-b")


@pytest.mark.parametrize("payload, tail, current, active", [
    (marker(), PEER_DIED, 2, [0, 1]),              # a peer's death: the hold stands
    (marker(round_=1), EVERY_RANK_RAISED, 2, [0, 1]),   # an older round's (its slot was restarted since)
    (marker(), EVERY_RANK_RAISED, 2, [0, 2]),      # a slot the round no longer names (replaced)
    (marker(), EVERY_RANK_RAISED, 0, None),        # the rounds not read yet
    (marker(slot=3), EVERY_RANK_RAISED, 2, [0, 1]),    # another slot's line in this pod's log
    (marker(code=137, signal=9), EVERY_RANK_RAISED, 2, [0, 1]),   # torchrun killed
], ids=["peer-died", "older-round", "replaced", "rounds-unknown", "other-slot", "signal"])
def test_any_other_keeper_exit_is_no_news(payload, tail, current, active):
    assert keeper_exit(payload, tail, 1, "node-b", current=current, active=active) is None


def test_a_real_keepers_log_is_judged_from_its_own_words(tmp_path: Path):
    """A keeper run by path with a hold (as in a pod): its command raises, it writes its
    ``keeper_exit`` line after the command's output and, with no newer round, ends with its code;
    that log, read as the pod's, is the slot's exit at once."""
    rounds = tmp_path / "rounds"
    rounds.mkdir()
    keeper.write_round(rounds, 0, [0], "rdzv-0", {})
    log = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-I", str(Path(keeper.__file__)), "--rounds", str(rounds), "--slot", "0", "--log", str(log),
         "--exit-file", str(tmp_path / "exit.json"), "--pid-file", str(tmp_path / "pid.json"), "--hold", "0.1", "--",
         sys.executable, "-c", "def load(batch):\n    return batch['pixel_values']\nload({})"],
        cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    lines = log.read_text().splitlines()
    payload = parse_progress(lines[-1])
    assert payload is not None and payload["event"] == keeper.KEEPER_EXIT
    ev = keeper_exit(payload, lines[:-1], 0, "node-a", current=0, active=[0])
    assert ev is not None and ev.exit_code == 1 and "KeyError: 'pixel_values'" in (ev.message or "")


def test_a_keepers_word_read_before_the_rounds_are_known_is_judged_once_they_are():
    """A watcher's log followers may read a keeper's line before its first poll read the rounds
    (an adopting watcher reads each log from its start): the line waits, then counts if it is of
    the current round, and is dropped if the round moved on."""
    from orchestrator.backends.kubernetes.record import Attempt
    from orchestrator.backends.kubernetes.rounds import keeper_exits_due, keeper_said

    st = Attempt(b.AttemptRef("kubernetes", "r", 0, "default"))
    keeper_said(st, marker(round_=0), EVERY_RANK_RAISED, 1, "node-b")
    keeper_said(st, marker(round_=1, slot=0), EVERY_RANK_RAISED, 0, "node-a")
    keeper_exits_due(st)
    assert not st.events and len(st.keeper_exits) == 2          # the rounds are not known yet
    st.round, st.active = 1, [0, 2]
    keeper_exits_due(st)
    assert [(e.kind, e.node) for e in st.events] == [(b.NODE_EXITED, 0)] and not st.keeper_exits
    assert st.failure_seen
