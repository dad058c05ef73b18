"""In-place recovery with spare nodes (restart.spares, docs/spares.md): the supervisor's path
that keeps the attempt. A lost node is replaced by a warm spare through the backend's
``recover_in_place``; the attempt's record keeps what happened. Only a node's failure qualifies:
lost (its processes gone, its beat silent), frozen (a hang that names the node: paused, or
unknown to its engine) or its accelerator failed; the job's own error, an OOM, NaN or a hang of no one node (a stuck
collective) would follow the job to the spare."""

from __future__ import annotations

from typing import Any, Callable

from . import failures as F
from .backends import base as b
from .display import step_text
from .spec import JobSpec
from .stragglers import REPLACE, Straggler
from .state import AttemptRecord
from .tracker import AttemptTracker

REPLENISH_AFTER_S = 10.0    # a job that reports no steps: its new round has run this long with every node up
STRAGGLER = "straggler"     # not a failure of the attempt: a slow node swapped out at a checkpoint
WHAT = {F.NODE_LOST: "lost", F.HANG: "frozen", F.DEVICE_FAULT: "lost its device", STRAGGLER: "is a straggler"}


def recover_in_place(spec: JobSpec, backend: b.Backend[Any], ref: b.AttemptRef, rec: AttemptRecord,
                     tracker: AttemptTracker, failure: F.Failure,
                     clock: Callable[[], float]) -> tuple[bool, str | None]:
    """Whether the attempt goes on (a spare took the lost node's place; the recovery appended to
    ``rec.recoveries``), and the line to tell the user (None: spares do not apply)."""
    if (not (spec.restart.spares and backend.spares) or failure.kind not in (*F.NODE_FAILURES, STRAGGLER)
            or failure.node is None):
        return False, None
    again = [r for r in rec.recoveries if r.get("checkpoint_step") == tracker.last_checkpoint_step]
    if len(again) >= spec.restart.spares and failure.kind != STRAGGLER:
        # Replenished spares could otherwise go round for ever on a failure that follows the job.
        return False, (f"attempt {rec.attempt}: node {failure.node} failed ({failure.kind}) after {len(again)} "
                       f"in-place recover{'y' if len(again) == 1 else 'ies'} with no checkpoint committed since "
                       f"(step {step_text(tracker.last_checkpoint_step)}; restart.spares={spec.restart.spares}): "
                       "a new attempt replaces this one")
    decided = clock()
    got = backend.recover_in_place(ref, failure.node)
    if got is None and failure.kind == STRAGGLER:
        return False, (f"attempt {rec.attempt}: {failure.evidence}; restart.stragglers=replace but no spare node is "
                       f"warm (restart.spares={spec.restart.spares}, all used): warned only, the node keeps its place")
    if got is None:
        return False, (f"attempt {rec.attempt}: node {failure.node} failed ({failure.kind}) and no spare node is left "
                       f"(restart.spares={spec.restart.spares}): a new attempt replaces this one")
    rec.recoveries.append({
        "time": round(decided, 3), "kind": failure.kind, "round": got.round, "lost_node": got.lost,
        "spare_node": got.spare,
        "host": failure.host, "evidence": failure.evidence, "step": tracker.last_step,
        "checkpoint_step": tracker.last_checkpoint_step, "detect_s": round(max(0.0, decided - failure.time), 3),
        "replace_s": round(clock() - decided, 3)})
    return True, (f"attempt {rec.attempt}: node {got.lost} {WHAT.get(failure.kind, failure.kind)} "
                  f"({failure.evidence}) -> spare node {got.spare} "
                  f"takes its place in round {got.round}, every worker restarts in place from the newest "
                  f"checkpoint (step {step_text(tracker.last_checkpoint_step)}); {got.spares_left} spare(s) left, "
                  "no new attempt")


def lost_hosts(rec: AttemptRecord) -> list[str]:
    """The machines an attempt lost to a node's failure and replaced in place: the next attempt
    keeps off them as it keeps off the host its own failure names (a straggler is not one:
    it was slow, not failed)."""
    return [r["host"] for r in rec.recoveries if r.get("kind") in F.NODE_FAILURES and r.get("host")]


def straggler_line(spec: JobSpec, backend: b.Backend[Any], attempt: int, straggler: Straggler) -> tuple[str, bool]:
    """What to say about a node just named a straggler, and whether it is to be replaced at the
    next checkpoint (restart.stragglers=replace with a spare to take its place)."""
    said = f"attempt {attempt}: {straggler.describe(spec.restart.straggler_ratio)}"
    if spec.restart.stragglers != REPLACE:
        return f"{said} (restart.stragglers=warn: warned only)", False
    if not (spec.restart.spares and backend.spares):
        why = (f"the {backend.name} backend keeps no spare nodes" if not backend.spares
               else "restart.spares is 0")
        return f"{said}; restart.stragglers=replace but {why}: warned only", False
    return f"{said}; restart.stragglers=replace: a spare takes its place at the next checkpoint", True


def replenish(spec: JobSpec, backend: b.Backend[Any], ref: b.AttemptRef, rec: AttemptRecord,
              tracker: AttemptTracker, now: float) -> list[tuple[dict[str, Any], str]]:
    """Start a new spare for each one an in-place recovery used (restart.replenish_spares), once
    the round it joined has resumed: its first step, or every node up for REPLENISH_AFTER_S for a
    job that reports none. Never before: a new spare's start (a process importing torch, a
    container, a pod) must not slow the recovery itself. Each recovery records the slot started
    (``replenished``; None when the backend could not start one). Each recovery tended, with the
    line to tell the user."""
    if not (spec.restart.spares and spec.restart.replenish_spares and tracker.in_place
            and backend.replenishes_spares):
        return []
    resumed = tracker.first_step_at is not None or (
        tracker.all_started_at is not None and now - tracker.all_started_at >= REPLENISH_AFTER_S)
    if not resumed:
        return []
    tended = []
    for got in rec.recoveries:
        if "replenished" in got:
            continue
        slot = backend.replenish_spare(ref, got["lost_node"])
        got["replenished"] = slot
        tended.append((got, f"attempt {rec.attempt}: spare node {slot} started in the background for the one round "
                     f"{got['round']} used (restart.replenish_spares)" if slot is not None else
                     f"attempt {rec.attempt}: no new spare could be started for the one round {got['round']} "
                     "used; the next lost node is replaced by a spare still warm, if any, else by a new attempt"))
    return tended
