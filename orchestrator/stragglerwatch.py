"""The supervisor's side of stragglers (docs/spares.md): tell what the detector (stragglers.py)
found, keep it in the attempt's record, and with ``restart.stragglers: replace`` hand a slow node
to the in-place path (inplace.py) once a checkpoint has committed after it was named, so every
worker resumes from that checkpoint and the run stays exact. Never without a warm spare: then it
warns, saying why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from . import failures as F
from .backends import base as b
from .inplace import STRAGGLER, straggler_line
from .spec import JobSpec
from .state import AttemptRecord, RunRecord, RunStore
from .stragglers import Stragglers
from .tracker import AttemptTracker


def detector(spec: JobSpec) -> Stragglers | None:
    """A fresh detector for an attempt's round; None for a one-node job (nothing to compare)."""
    return Stragglers(spec.restart.straggler_ratio, spec.restart.straggler_window) if spec.nodes > 1 else None


@dataclass
class Pending:
    """Stragglers to replace at the next checkpoint: group rank -> (record entry, checkpoint then)."""

    due: dict[int, tuple[dict[str, Any], int | None]] = field(default_factory=dict)


def tend(spec: JobSpec, backend: b.Backend[Any], rec: AttemptRecord, tracker: AttemptTracker, store: RunStore,
         record: RunRecord, pending: Pending, echo: Callable[[str], None], now: float) -> F.Failure | None:
    """Tell the tracker's straggler news; a STRAGGLER failure when one is due for replacement now."""
    changed = False
    if tracker.paced and not rec.paced:
        rec.paced = changed = True
    for s in tracker.straggler_news:
        line, replace = straggler_line(spec, backend, rec.attempt, s)
        echo(line)
        entry = {**s.as_dict(), "action": "warned" if not replace else "replace at the next checkpoint",
                 "note": line.split(": ", 1)[1]}
        rec.stragglers.append(entry)
        store.append_metric({"event": "straggler", "by": "watcher", "attempt": rec.attempt, **entry})
        if replace:
            pending.due[s.group_rank] = (entry, tracker.last_checkpoint_step)
        changed = True
    for g in tracker.straggler_cleared:
        entry_ckpt = pending.due.pop(g, None)
        for entry in rec.stragglers:
            if entry["group_rank"] == g and "cleared_step" not in entry:
                entry["cleared_step"] = tracker.last_step
                entry["action"] = "warned" if entry_ckpt is None else "not replaced: it caught up"
        echo(f"attempt {rec.attempt}: the node of group rank {g} is no longer a straggler")
        changed = True
    tracker.straggler_news, tracker.straggler_cleared = [], []
    if changed:
        store.save(record)
    for g, (entry, ckpt) in list(pending.due.items()):
        if tracker.last_checkpoint_step is None or tracker.last_checkpoint_step == ckpt:
            continue     # no checkpoint committed since it was named: replacing now would redo steps
        del pending.due[g]
        node = next((n.node for n in tracker.nodes if entry["host"] and n.host == entry["host"]), None)
        if node is None:
            echo(f"attempt {rec.attempt}: the straggler on {entry['host'] or f'group rank {g}'} is not one of "
                 "the attempt's nodes any more: nothing to replace")
            continue
        figures = entry["note"].split(";")[0].split(" is a straggler: ", 1)[-1]
        return F.Failure(STRAGGLER, node, entry["host"], now, figures)
    return None


def settle(rec: AttemptRecord, host: str | None, replaced: bool) -> None:
    """The recorded action of the straggler on ``host`` once its replacement was tried."""
    for entry in rec.stragglers:
        if entry["host"] == host and entry.get("action") == "replace at the next checkpoint":
            if replaced and rec.recoveries:
                got = rec.recoveries[-1]
                entry["action"] = (f"replaced by spare node {got['spare_node']}, every worker resumed from "
                                   f"checkpoint {got['checkpoint_step']}")
            else:
                entry["action"] = "warned: no spare node was warm to replace it"
