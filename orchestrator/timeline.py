"""A run's history in order, for `wmctl describe RUN` (kubectl describe's Events, for a run).

It is assembled from what the run folder already holds, never from a second record: the run
record (each attempt's submission, excluded hosts, end, failure class and evidence, the
watcher's decision), the kept progress events (metrics.jsonl: job starts, checkpoints,
resumes, damaged checkpoints, preemption, exits; steps are `wmctl metrics`'s) and the cancel
intent. Every entry has the same keys (DESCRIBE_KEYS); an unknown value is None (``-`` in text).
"""

from __future__ import annotations

from typing import Any

from .state import RunRecord, RunStore
from .stragglers import entry_text, off_reason

DESCRIBE_KEYS = ("time", "attempt", "event", "detail")

# progress events shown (the rest, steps above all, belong to `wmctl metrics`)
SHOWN_PROGRESS = ("start", "resume", "checkpoint", "checkpoint_damaged", "preempted", "exit")


def _progress_detail(e: dict[str, Any]) -> str:
    kind = e.get("event")
    if kind == "start":
        return f"job started (world size {e.get('world_size', '-')})"
    if kind == "resume":
        exact = {True: ", exact", False: ", not exact"}.get(e["exact"], "") if isinstance(e.get("exact"), bool) else ""
        if e.get("exact") is False and e.get("reason"):
            exact += f": {e['reason']}"
        where = ", ".join(x for x in (e.get("path") or "", exact.lstrip(", ")) if x)
        return f"resumed from step {e.get('step', '-')}" + (f" ({where})" if where else "")
    if kind == "checkpoint":
        took = f" in {e['seconds']}s" if isinstance(e.get("seconds"), (int, float)) else ""
        return f"checkpoint of step {e.get('step', '-')} written{took} ({e.get('path', '-')})"
    if kind == "checkpoint_damaged":
        return f"damaged checkpoint skipped ({e.get('path', '-')}: {e.get('reason', '-')})"
    if kind == "preempted":
        return f"preempted at step {e.get('step', '-')}"
    return f"job exited ({e.get('status', '-')})"


def events(record: RunRecord, store: RunStore) -> list[dict[str, Any]]:
    """Everything that happened to the run, oldest first."""
    out: list[dict[str, Any]] = [{"time": record.created_at, "attempt": None, "event": "submitted",
                                  "detail": f"run {record.run} on {record.backend}"
                                            + (", auto-resume" if record.auto_resume else "")
                                            + (f", starting from {record.resume_from}" if record.resume_from
                                               else "")}]
    for a in record.attempts:
        where = f", kept off {', '.join(a.excluded_nodes)}" if a.excluded_nodes else ""
        out.append({"time": a.submitted_at, "attempt": a.attempt, "event": "attempt",
                    "detail": f"attempt {a.attempt} submitted{where}"})
        if a.outcome is None:
            continue
        end = a.ended_at if a.ended_at is not None else a.submitted_at
        if a.outcome in ("succeeded", "cancelled"):
            out.append({"time": end, "attempt": a.attempt, "event": a.outcome,
                        "detail": f"attempt {a.attempt} {a.outcome}"
                                  + (f" at step {a.last_step}" if a.last_step is not None else "")})
        else:
            node = (f" on node {a.failed_node}" if a.failed_node is not None else "") + \
                   (f" ({a.failed_host})" if a.failed_host else "")
            out.append({"time": end, "attempt": a.attempt, "event": "failure",
                        "detail": f"{a.outcome}{node}: {a.evidence or '-'}"})
        if a.decision:
            out.append({"time": end, "attempt": a.attempt, "event": "decision", "detail": a.decision})
    for a in record.attempts:
        for r in a.recoveries:      # spare nodes: inside the attempt (docs/spares.md)
            out.append({"time": r.get("time"), "attempt": a.attempt, "event": "in_place",
                        "detail": f"node {r.get('lost_node')} replaced by spare node {r.get('spare_node')} "
                                  f"(round {r.get('round')}, at step {r.get('step')}, from checkpoint "
                                  f"{r.get('checkpoint_step')}): {r.get('evidence') or '-'}"
                                  + (f"; new spare node {r['replenished']} started" if r.get("replenished") is not None
                                     else "")})
        for s in a.stragglers:      # slow nodes (docs/spares.md): named with their figures
            out.append({"time": s.get("since"), "attempt": a.attempt, "event": "straggler", "detail": entry_text(s)})
        off = off_reason((record.spec or {}).get("nodes"), a.paced) if a.outcome is not None else None
        if off:
            out.append({"time": a.ended_at, "attempt": a.attempt, "event": "stragglers", "detail": off})
    for e in store.metrics():
        if e.get("event") in SHOWN_PROGRESS:
            t = e.get("time", e.get("seen"))
            out.append({"time": t if isinstance(t, (int, float)) else None, "attempt": e.get("attempt"),
                        "event": str(e.get("event")), "detail": _progress_detail(e)})
    intent = store.cancel_intent()
    if intent is not None:
        out.append({"time": intent.get("time"), "attempt": None, "event": "cancel",
                    "detail": f"cancel asked by {intent.get('by', '-')}"
                              + (" (graceful)" if intent.get("graceful") else "")})
    if record.status != "running" and record.final_report:
        last = max((a.ended_at for a in record.attempts if a.ended_at is not None), default=None)
        # its first line: the whole report (every attempt) is `wmctl status`'s
        out.append({"time": last, "attempt": None, "event": "ended", "detail": record.final_report.splitlines()[0]})
    # stable: entries of the same time keep the order above (an attempt's end before its decision)
    return sorted(out, key=lambda e: float("inf") if e["time"] is None else e["time"])
