"""Node silence: the runtime's per-node beat (runtime/liveness.py) turned into node loss.

Global rank 0 prints ``node_silent`` progress events for a node whose beat stopped, with how long
it has been silent, and ``node_beat`` when it beats again. A node silent for
``restart.node_silence_timeout`` is lost: the supervisor tears the attempt down and resumes
elsewhere, without waiting for Kubernetes' node-monitor grace period or the survivors'
collective timeout. One place decides; the tracker only feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .backends import base as b

SILENT, BEAT = "node_silent", "node_beat"
REASON = "NodeSilent"


@dataclass
class Silence:
    timeout_s: float
    since: dict[int, tuple[float, str | None]] = field(default_factory=dict)   # group rank -> (silent since, host)
    declared: set[int] = field(default_factory=set)

    def feed(self, progress: dict, now: float) -> None:
        kind, g = progress.get("event"), progress.get("group_rank")
        if not isinstance(g, int):
            return
        if kind == BEAT:
            self.since.pop(g, None)
        elif kind == SILENT:
            silent = progress.get("silent_s")
            silent = float(silent) if isinstance(silent, (int, float)) else 0.0
            host = progress.get("host") if isinstance(progress.get("host"), str) else None
            start = now - silent
            self.since[g] = (min(start, self.since.get(g, (start, None))[0]), host)

    def lost(self, now: float) -> list[b.Event]:
        """A NODE_LOST event for each node silent for the timeout, once each."""
        out = []
        for g, (since, host) in sorted(self.since.items()):
            if g in self.declared or now - since < self.timeout_s:
                continue
            self.declared.add(g)
            out.append(b.Event(b.NODE_LOST, node=None, host=host, time=now, reason=REASON,
                               message=f"node {host or f'of group rank {g}'} sent no liveness beat for "
                               f"{now - since:.0f} s (restart.node_silence_timeout "
                               f"{self.timeout_s:g} s); its peers are blocked on it"))
        return out
