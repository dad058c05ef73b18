"""The host's side of an attempt with spare nodes on Docker: its rounds folder (written here, read
by each slot container's keeper through a read-only mount) and the keepers' exit files (written by
the containers to the attempt's ``slots`` folder, read here). docs/spares.md says why files: a
round's torchrun that fails leaves its container running, waiting for the next round."""

from __future__ import annotations

import json
import os
from typing import Any

from ... import layout
from ...launch import fence_epoch
from ...runtime import keeper as k
from ...runtime.protocol import ENV_FENCE_EPOCH, ENV_RESUME
from .spares import exit_file, pid_file, slots_dir


def prepare(run: str, attempt: int, nodes: list[int], *, shared: bool) -> None:
    """The rounds and slots folders, and round 0 (``nodes``: the first slots), unless an earlier
    submit of this attempt wrote it. ``shared``: the containers run as another user than this
    process (docker.user image or a named one), so the slots folder is made writable by all: the
    keeper of a container whose user is not the folder's owner writes its exit file there."""
    rounds = layout.rounds_dir(run, attempt)
    slots = slots_dir(run, attempt)
    rounds.mkdir(parents=True, exist_ok=True)
    slots.mkdir(parents=True, exist_ok=True)
    if shared:
        os.chmod(slots, 0o1777)
    if k.newest_round(rounds) is None:
        k.write_round(rounds, 0, nodes, layout.round_rendezvous_id(run, attempt, 0), {})


def save_plan(run: str, attempt: int, plan: dict[str, Any]) -> None:
    """The attempt's plan beside its rounds: a replenished spare is made from a lost slot's container."""
    path = layout.attempt_dir(run, attempt) / layout.PLAN_FILE
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(plan, indent=1))
    os.replace(tmp, path)


def slot_resource(run: str, attempt: int, slot: int) -> dict[str, Any] | None:
    """Slot ``slot``'s container in the attempt's saved plan; None when the plan or the slot is missing."""
    try:
        plan = json.loads((layout.attempt_dir(run, attempt) / layout.PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return next((r for r in plan.get("resources", []) if r.get("kind") == "container" and r.get("node") == slot),
                None)


def closed(run: str, attempt: int) -> bool:
    return (layout.rounds_dir(run, attempt) / k.CLOSED).exists()


def has_rounds(run: str, attempt: int) -> bool:
    return layout.rounds_dir(run, attempt).exists()


def current(run: str, attempt: int) -> dict[str, Any] | None:
    rounds = layout.rounds_dir(run, attempt)
    return k.newest_round(rounds) if rounds.exists() else None


def round_end(run: str, attempt: int, slot: int, round_: int) -> dict[str, Any] | None:
    """How slot ``slot``'s torchrun of round ``round_`` ended (its keeper's exit file), None while it
    runs; an earlier round's end is not news."""
    path = slots_dir(run, attempt) / exit_file(slot)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("round") == round_ else None


def round_start(run: str, attempt: int, slot: int, round_: int) -> float | None:
    """When slot ``slot``'s keeper started its torchrun of round ``round_`` (its pid file); None
    until it has (a keeper still on an earlier round, or waiting)."""
    try:
        data = json.loads((slots_dir(run, attempt) / pid_file(slot)).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("round") != round_:
        return None
    started = data.get("started")
    return float(started) if isinstance(started, (int, float)) else None


def used_slots(run: str, attempt: int) -> set[int]:
    return {slot for info in k.all_rounds(layout.rounds_dir(run, attempt)) for slot in info["active"]}


def next_round(run: str, attempt: int, lost: int, spare: int) -> tuple[int, list[int]]:
    """Round N+1 written: ``spare`` in ``lost``'s place, a fresh rendezvous id, WMCTL_RESUME=1 and the
    round's fencing epoch. Returns (N+1, its active slots)."""
    rounds = layout.rounds_dir(run, attempt)
    info = k.newest_round(rounds)
    assert info is not None
    active = [spare if slot == lost else slot for slot in info["active"]]
    n = info["round"] + 1
    k.write_round(rounds, n, active, layout.round_rendezvous_id(run, attempt, n),
                  {ENV_RESUME: "1", ENV_FENCE_EPOCH: str(fence_epoch(attempt, n))})
    return n, active


def close(run: str, attempt: int) -> None:
    """Idle spares stop (their keeper sees the folder closed): the attempt is over."""
    rounds = layout.rounds_dir(run, attempt)
    if rounds.exists():
        k.close(rounds)
