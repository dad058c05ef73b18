"""How an attempt's end is read when the job itself is done: an app-looking exit that is only an
agent's shutdown noise or a worker's crash on its way out after the job completed (benign), and
torchrun agents left waiting in their exit barrier for one that has gone. The supervisor asks;
the other nodes' ends decide."""

from __future__ import annotations

from typing import Any, Callable

from . import failures as F
from .backends import base as b
from .joberror import node_tail
from .state import AttemptRecord
from .tracker import AttemptTracker

TEARDOWN_WAIT_S = 5.0     # a worker's signal death waits this long for rank 0's `completed` (teardown crash)
# After the job completed and a node's exit was found benign, the other nodes' torchrun agents wait
# in their exit barrier for an agent that has already left it; they are stopped after this long.
EXIT_BARRIER_WAIT_S = 10.0


def left_in_barrier(backend: b.Backend[Any], ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker, now: float,
                    echo: Callable[[str], None]) -> bool:
    """Nodes still up EXIT_BARRIER_WAIT_S after the job completed and a node's exit was found
    benign are stopped, and the attempt counts as succeeded. torchrun's agent whose workers
    succeeded waits in its exit barrier (torch/distributed/elastic/agent/server/api.py
    `_exit_barrier`, 300 s by default and not a torchrun flag) for every agent, but an agent
    whose worker failed returns without joining it: unless that agent hosted the c10d store, the
    others would sit there five minutes, and a watcher would call their silence a hang."""
    if tracker.done_at is None or now - tracker.done_at < EXIT_BARRIER_WAIT_S:
        return False
    up = [str(n.node) for n in tracker.nodes if n.phase not in (b.SUCCEEDED, b.FAILED, b.LOST)]
    echo(f"attempt {rec.attempt}: node(s) {', '.join(up) or '-'} still up {now - tracker.done_at:.0f} s after "
              f"the job completed at step {tracker.completed_step}: torchrun's exit barrier waits for an agent "
              "that has left it; stopped")
    backend.cancel(ref)
    return True

def benign_exit(backend: b.Backend[Any], ref: b.AttemptRef, rec: AttemptRecord, tracker: AttemptTracker,
                failure: F.Failure, echo: Callable[[str], None], clock: Callable[[], float]) -> bool:
    """Is this exit only a scheduler's signal or eviction that reached a node after the job
    reported completion, a node lost or frozen after it, an agent's shutdown noise after its workers succeeded
    (failures.shutdown_noise), or a worker's crash on its way out after the job reported
    completion (failures.teardown_crash)? Then it is noted and the attempt is watched on: the
    other nodes' ends decide. True also while such a crash waits (TEARDOWN_WAIT_S) for rank
    0's `completed` line."""
    if failure.kind == F.PREEMPTED and tracker.completed_step is not None and failure.node not in tracker.benign:
        # The job said it completed (its last step done, its last checkpoint committed before it
        # said so), then a scheduler's signal reached a node on its way out (Slurm's time limit or a
        # preemption, an eviction, a SIGTERM): no work is left to save or redo. Read as a
        # preemption, it would run the whole job again from its newest checkpoint.
        tracker.benign[failure.node] = f"stopped by the cluster after it completed: {failure.evidence}"
        tracker.done_at = tracker.done_at or clock()
        who = "the job" if failure.node is None else f"node {failure.node}"
        echo(f"attempt {rec.attempt}: {who} was signalled or evicted after the job reported completion at step "
             f"{tracker.completed_step} ({failure.evidence}): nothing was left to do, not counted as a preemption")
        return True
    if (failure.kind in F.NODE_FAILURES and failure.node is not None and tracker.completed_step is not None
            and failure.node not in tracker.benign):
        # The job said it completed (every rank past its last barrier, its last checkpoint
        # committed), then a node was lost, froze or lost its device on its way out: nothing is
        # left to redo. Read as the node's failure, a spare would restart every worker from the
        # last checkpoint (a round with no step to run) or a new attempt would run the job again.
        # The node's later signs (its loss, its pause) are the tracker's to drop; a node left up
        # is stopped after EXIT_BARRIER_WAIT_S (left_in_barrier).
        tracker.benign[failure.node] = f"{failure.kind} after the job completed: {failure.evidence}"
        tracker.done_at = tracker.done_at or clock()
        echo(f"attempt {rec.attempt}: node {failure.node} failed ({failure.kind}: {failure.evidence}) after the job "
             f"reported completion at step {tracker.completed_step}: nothing was left to do, not counted as a "
             "failure")
        return True
    if failure.kind != F.APP_ERROR or failure.node is None or failure.node in tracker.benign:
        return False
    lines = tracker.tails.get(failure.node)
    if lines is None:
        lines = node_tail(backend, ref, failure.node)
    if lines is not None:
        tracker.tails[failure.node] = lines     # read once: the failure's report uses it too
    noise = F.shutdown_noise(lines) if lines is not None else None
    if noise is not None:
        tracker.benign[failure.node] = noise
        if tracker.completed_step is not None:
            tracker.done_at = tracker.done_at or clock()
        echo(f"attempt {rec.attempt}: node {failure.node}'s workers finished; its torchrun agent then "
                  f"failed on its way out ({noise}): not counted as a failure")
        return True
    lost = F.rendezvous_failure(lines) if lines is not None and tracker.completed_step is not None else None
    if lost is not None:
        # After rank 0's `completed` no work is left, so an agent that lost the c10d store
        # (its host's agent left first: it succeeded, or its worker crashed on the way out)
        # stopped nothing: its workers were done or leaving.
        tracker.benign[failure.node] = lost
        tracker.done_at = tracker.done_at or clock()
        echo(f"attempt {rec.attempt}: node {failure.node}'s torchrun agent lost the rendezvous store after "
                  f"the job reported completion at step {tracker.completed_step} (the node hosting it had "
                  "ended): not counted as a failure")
        return True
    crash = F.teardown_crash(lines) if lines is not None else None
    if crash is not None and tracker.completed_step is None:
        # Rank 0 says `completed` after the last barrier, so a rank that crashed leaving it
        # can end before that line is read: while another node still runs, its words are
        # awaited a moment before the exit counts as the job's failure.
        held = tracker.crash_held.setdefault(failure.node, clock())
        others = any(n.node != failure.node and n.phase == b.RUNNING for n in tracker.nodes)
        return others and clock() - held < TEARDOWN_WAIT_S
    if crash is not None:
        # The job said it completed (its last checkpoint committed before it said so), then a
        # worker died of a signal with no error of its own: a crash in the interpreter's or
        # the collective library's teardown (gloo + DCP in torch 2.13 abort now and then).
        # Retrying would redo nothing; failing the run would call finished work lost.
        tracker.benign[failure.node] = crash
        tracker.done_at = tracker.done_at or clock()
        echo(f"attempt {rec.attempt}: node {failure.node}'s worker died after the job reported completion "
                  f"at step {tracker.completed_step} ({crash}): a crash on the way out, not counted as a failure")
        return True
    return False
