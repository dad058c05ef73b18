"""Stragglers: a slow node is a failing node (restart.stragglers, docs/spares.md).

Global rank 0 prints ``pace`` progress events (runtime/pace.py): for each node, the mean time
its slowest rank took to REACH the step's first collective over the steps since the last event
(``reach_ms``), and the newest step those figures cover. Time waiting inside a collective for a
slow peer is not in it, so only the slow node's own figure grows.

``Stragglers`` is the pure decision: figures in, verdict out. A node whose figure stays over
``ratio`` x the median of the other nodes' figures for ``window`` steps in a row is a straggler.
Steps, not seconds, because the noise to ride out is per step (a checkpoint save, a garbage
collection, a data-loader hiccup: one to a few steps), whatever a step lasts; a window in seconds
would be 6 samples on a 10 s step and 6000 on a 10 ms one. A figure that falls back under the
threshold starts the count over, so a brief spike is never flagged. A gap under MIN_GAP_MS per
step is never a straggler whatever the ratio: sub-millisecond figures are clock noise. A one-node
job has no others to compare with: nothing is ever flagged.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

PACE = "pace"
MIN_GAP_MS = 1.0
WARN, REPLACE = "warn", "replace"
MODES = (WARN, REPLACE)


@dataclass(frozen=True)
class Straggler:
    """A node declared a straggler, with the figures that made it one."""

    group_rank: int
    host: str | None
    ms: float                # its time to reach the collective, ms per step (newest figure)
    median_ms: float         # the median of the other nodes' figures
    since_step: int          # the first step of the run of slow figures
    since: float             # when (the watcher's clock) that run began
    step: int                # the newest step the figures cover

    def describe(self, ratio: float) -> str:
        who = f"node {self.host}" if self.host else f"node of group rank {self.group_rank}"
        return (f"{who} is a straggler: {self.ms:.1f} ms/step to reach the collective against a median of "
                f"{self.median_ms:.1f} ms on the other nodes ({self.ms / max(self.median_ms, 1e-9):.2f}x, "
                f"restart.straggler_ratio {ratio:g}) since step {self.since_step}")

    def as_dict(self) -> dict:
        return {"group_rank": self.group_rank, "host": self.host, "ms_per_step": round(self.ms, 3),
                "median_ms": round(self.median_ms, 3), "since_step": self.since_step, "since": round(self.since, 3),
                "step": self.step}


@dataclass
class Stragglers:
    ratio: float = 1.3
    window: int = 20
    slow_since: dict[int, tuple[int, float]] = field(default_factory=dict)   # group rank -> (step, time)
    declared: dict[int, Straggler] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)

    def feed(self, progress: dict, now: float) -> tuple[list[Straggler], list[int]]:
        """Fold one ``pace`` event: the nodes newly declared stragglers, and those no longer one."""
        if progress.get("event") != PACE:
            return [], []
        figures = _figures(progress.get("nodes"))
        step = progress.get("steps")   # the job's timed steps (not "step": the tracker reads that as progress)
        if not isinstance(step, int) or len(figures) < 2:
            return [], []
        for g, host in _hosts(progress.get("nodes")).items():
            self.hosts[g] = host
        new: list[Straggler] = []
        cleared: list[int] = []
        for g, ms in figures.items():
            median = statistics.median(v for h, v in figures.items() if h != g)
            if ms > self.ratio * median and ms - median >= MIN_GAP_MS:
                since_step, since = self.slow_since.setdefault(g, (step, now))
                if g not in self.declared and step - since_step + 1 >= self.window:
                    self.declared[g] = Straggler(g, self.hosts.get(g), ms, median, since_step, since, step)
                    new.append(self.declared[g])
                elif g in self.declared:
                    self.declared[g] = Straggler(g, self.hosts.get(g), ms, median, since_step, since, step)
            else:
                self.slow_since.pop(g, None)
                if self.declared.pop(g, None) is not None:
                    cleared.append(g)
        return new, cleared


def _figures(nodes: object) -> dict[int, float]:
    out: dict[int, float] = {}
    if not isinstance(nodes, dict):
        return out
    for key, value in nodes.items():
        ms = value.get("reach_ms") if isinstance(value, dict) else None
        try:
            g = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
            out[g] = float(ms)
    return out


def _hosts(nodes: object) -> dict[int, str]:
    out: dict[int, str] = {}
    if isinstance(nodes, dict):
        for key, value in nodes.items():
            if isinstance(value, dict) and isinstance(value.get("host"), str) and str(key).isdigit():
                out[int(key)] = value["host"]
    return out


def entry_text(entry: dict) -> str:
    """A recorded straggler (``Straggler.as_dict`` plus what was done), for status, describe, the panel."""
    host = entry.get("host") or f"of group rank {entry.get('group_rank')}"
    cleared = f", caught up by step {entry['cleared_step']}" if entry.get("cleared_step") is not None else ""
    return (f"node {host}: {entry.get('ms_per_step')} ms/step to reach the collective against a median of "
            f"{entry.get('median_ms')} ms on the others, since step {entry.get('since_step')} "
            f"({entry.get('action', 'warned')}{cleared})")


def off_reason(nodes: object, paced: bool) -> str | None:
    """Why stragglers were not looked for in an attempt; None when they were."""
    if isinstance(nodes, int) and nodes <= 1:
        return "not looked for: one node, nothing to compare it with"
    if not paced:
        return ("not looked for: the job sent no step pace (it does not time its steps with "
                "orchestrator.runtime's StepTimer, or runs on one node)")
    return None
