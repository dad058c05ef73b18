"""Spare nodes on Slurm (restart.spares, docs/spares.md): an attempt's slots, as its folder has them.

With spares the batch script (templates/slurm/job-spares.sbatch.j2) runs one srun step per slot,
each pinned to one node and running the keeper (runtime/keeper.py). What the engine reads, all in
the attempt folder on the shared filesystem:

- ``slots.txt``: slot s's node, line s (the batch script writes it before the steps start);
- ``node-S.step``: slot S's step id (the step writes it when it starts): what a lost slot's
  fencing SIGKILLs (``scancel --signal=KILL JOBID.STEP``);
- ``node-S.pid.json``: the keeper's pids, ``"agent": null`` while the slot waits for a round;
- ``node-S.exit.json``: the keeper's record of how a round's torchrun ended
  (``{"exit_code", "signal", "time", "round", "signalled"}``); one of an earlier round is not news.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ... import layout
from ...launch import fence_epoch
from ...runtime import keeper as r
from ...runtime.protocol import ENV_FENCE_EPOCH, ENV_RESUME
from . import classify as C

SLOTS_FILE = "slots.txt"


def slot_hosts(attempt_dir: Path) -> list[str]:
    """Each slot's node, in slot order; [] before the batch script has written them."""
    try:
        return [line.strip() for line in (attempt_dir / SLOTS_FILE).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def step_id(attempt_dir: Path, slot: int) -> str | None:
    """The id of slot ``slot``'s srun step (digits), or None before the step started."""
    try:
        text = (attempt_dir / f"node-{slot}.step").read_text().strip()
    except FileNotFoundError:
        return None
    return text if text.isdigit() else None


def waiting(attempt_dir: Path, slot: int) -> bool:
    """Is the slot's keeper up and idle (a spare no round has named yet)?"""
    try:
        data = json.loads((attempt_dir / f"node-{slot}.pid.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return isinstance(data, dict) and data.get("agent") is None and data.get("round") == -1


def keeper_end(path: Path, slot: int, host: str | None, job_id: str, round_: int) -> C.NodeEnd | None:
    """Slot ``slot``'s end in round ``round_`` as a node exit record, or None while it has none
    (a record of an earlier round is the keeper's past: it has moved on)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("round") != round_:
        return None
    code, when = data.get("exit_code"), data.get("time")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(when, (int, float)):
        return None
    return C.NodeEnd(slot, host or "", code, job_id, float(when), data.get("signalled") is True)


def idle_spares(history: list[dict[str, Any]], attempt_dir: Path, candidates: list[int]) -> list[int]:
    """The slots among ``candidates`` (those whose node Slurm still hears from) that no round has
    named and whose keeper waits, lowest first: the batch host's slot, the last, is used last."""
    used = {slot for info in history for slot in info["active"]}
    return sorted(slot for slot in candidates if slot not in used and waiting(attempt_dir, slot))


def next_round(run: str, attempt: int, history: list[dict[str, Any]], *, lost: int, spare: int) -> int:
    """Write the round after ``history``'s last with ``spare`` in ``lost``'s place: a fresh rendezvous
    id, WMCTL_RESUME=1 and the round's fencing epoch. Its number."""
    current = history[-1]
    active = [spare if slot == lost else slot for slot in current["active"]]
    n = int(current["round"]) + 1
    r.write_round(layout.rounds_dir(run, attempt), n, active, layout.round_rendezvous_id(run, attempt, n),
                  {ENV_RESUME: "1", ENV_FENCE_EPOCH: str(fence_epoch(attempt, n))})
    return n


def round_ended(run: str, attempt: int, job_id: str) -> bool:
    """Has every slot of the newest round recorded its end in it (a graceful cancel's wait)?"""
    newest = r.newest_round(layout.rounds_dir(run, attempt))
    return newest is not None and all(
        keeper_end(layout.node_exit_file(run, attempt, slot), slot, None, job_id, newest["round"]) is not None
        for slot in newest["active"])
