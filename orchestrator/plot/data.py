"""Progress events + attempt records -> what a plot of the run shows. Pure: no I/O, no drawing.

A self-healing run is drawn against the step: each attempt's loss and throughput, where each
attempt started (its resume step, the attempt boundary), where and why each attempt failed, and
the steps redone after a resume (from the resumed checkpoint's step to the last step the failed
attempt reached, the same count `wmctl status` reports as steps redone).

The events are `metrics.jsonl`'s (each a progress line plus the watcher's ``attempt`` and
``seen``); the attempts are the run record's (``attempt``, ``outcome``, ``last_step``,
``resumed_from_step``), as dicts. Either may be missing: a run whose record is gone still plots
from its events (failures then have no class), and a job that prints no progress lines plots
only its attempts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

SAMPLES_PER_S = "samples/s"
STEPS_PER_S = "steps/s"


@dataclass
class Series:
    """One attempt's curves: loss at each step line, and throughput between consecutive ones."""

    attempt: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    rate_steps: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Boundary:
    """Where attempt ``attempt`` (>= 1) started: the step it resumed from (0: from scratch)."""

    attempt: int
    step: int
    resumed: bool
    exact: bool | None = None
    reason: str = ""          # why not exact, as the job said


def exactness(b: Boundary) -> str:
    """' (exact)', ' (not exact: why)' or '' (the job did not say) for a resumed attempt."""
    if b.exact is False:
        return f" (not exact: {b.reason or 'reason not given'})"
    return " (exact)" if b.exact else ""


@dataclass(frozen=True)
class Failure:
    """Attempt ``attempt`` ended with failure class ``kind`` having reached ``step``."""

    attempt: int
    step: int | None
    kind: str


@dataclass(frozen=True)
class Redone:
    """Steps ``first``..``last`` (inclusive), computed by attempt ``attempt - 1`` before it failed,
    were lost with it: ``attempt`` resumed from step ``first - 1`` and runs them again (the count
    `wmctl status` reports per failure, even if this attempt fails again before redoing them all)."""

    attempt: int
    first: int
    last: int
    in_place: bool = False    # lost with a node a spare replaced inside ``attempt`` (docs/spares.md)

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass
class PlotData:
    run: str
    series: list[Series]
    boundaries: list[Boundary]
    failures: list[Failure]
    redone: list[Redone]
    checkpoints: list[tuple[int, int]]           # (attempt, step) of each committed checkpoint
    rate_unit: str

    @property
    def empty(self) -> bool:
        return not any(s.steps for s in self.series)

    def title(self) -> str:
        """One line: the run, its attempts, failures and steps redone."""
        attempts, failures = len(self.series), len(self.failures)
        redone = sum(r.count for r in self.redone)
        return (f"{self.run}: {attempts} attempt{'s' * (attempts != 1)}, {failures} "
                f"failure{'s' * (failures != 1)}, {redone} step{'s' * (redone != 1)} redone")

    def step_range(self) -> tuple[int, int]:
        steps = [x for s in self.series for x in s.steps] + [b.step for b in self.boundaries]
        steps += [f.step for f in self.failures if f.step is not None] + [r.last for r in self.redone]
        return (min(steps), max(steps)) if steps else (0, 1)


def _num(value: Any) -> float | None:
    """A finite number, or None (a loss printed as "nan", a missing field, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(event: Mapping[str, Any]) -> float | None:
    """When the job printed it, else when the watcher saw it."""
    t = _num(event.get("time"))
    return t if t is not None else _num(event.get("seen"))


def _series(attempt: int, steps: list[Mapping[str, Any]], by_samples: bool) -> Series:
    out = Series(attempt)
    prev: Mapping[str, Any] | None = None
    for ev in steps:
        step = _int(ev.get("step"))
        if step is None:
            continue
        loss = _num(ev.get("loss"))
        if loss is not None:
            out.steps.append(step)
            out.loss.append(loss)
        if prev is not None:
            rate = _rate(prev, ev, step, by_samples)
            if rate is not None:
                out.rate_steps.append(step)
                out.rate.append(rate)
        prev = ev
    return out


def _rate(prev: Mapping[str, Any], ev: Mapping[str, Any], step: int, by_samples: bool) -> float | None:
    t0, t1 = _time(prev), _time(ev)
    if t0 is None or t1 is None or t1 <= t0:
        return None
    if by_samples:
        s0, s1 = _num(prev.get("samples")), _num(ev.get("samples"))
        done = None if s0 is None or s1 is None else s1 - s0
    else:
        p = _int(prev.get("step"))
        done = None if p is None else step - p
    return done / (t1 - t0) if done is not None and done > 0 else None


def build(run: str, events: Iterable[Mapping[str, Any]], attempts: Iterable[Mapping[str, Any]] = (),
          only_attempt: int | None = None) -> PlotData:
    """The plot of ``run``; ``only_attempt`` keeps that attempt's curves and marks (its boundary,
    failure and redone steps still come from the whole run)."""
    records = {a["attempt"]: a for a in attempts if _int(a.get("attempt")) is not None}
    by_attempt: dict[int, list[Mapping[str, Any]]] = {}
    for ev in events:
        n = _int(ev.get("attempt"))
        if n is not None:
            by_attempt.setdefault(n, []).append(ev)
    numbers = sorted(set(by_attempt) | set(records))
    step_events = {n: [e for e in by_attempt.get(n, []) if e.get("event") == "step"] for n in numbers}
    by_samples = any(_num(e.get("samples")) is not None for evs in step_events.values() for e in evs)

    series = [_series(n, step_events[n], by_samples) for n in numbers]
    reached = {n: _reached(records.get(n), step_events[n]) for n in numbers}
    boundaries, failures, redone = [], [], []
    for n in numbers:
        rec = records.get(n, {})
        kind = rec.get("outcome")
        for r in rec.get("recoveries") or []:      # spare nodes: a node replaced inside the attempt
            at, ckpt = _int(r.get("step")), _int(r.get("checkpoint_step"))
            failures.append(Failure(n, at, f"node {r.get('lost_node')} replaced in place by spare node "
                                           f"{r.get('spare_node')}"))
            if at is not None and at > (ckpt or 0):
                redone.append(Redone(n, (ckpt or 0) + 1, at, in_place=True))
        if isinstance(kind, str) and kind != "succeeded":
            failures.append(Failure(n, reached[n], kind))
        if n == 0:
            continue
        boundary = _boundary(n, rec, by_attempt.get(n, []))
        boundaries.append(boundary)
        last = reached.get(n - 1)
        if last is not None and last > boundary.step:
            redone.append(Redone(n, boundary.step + 1, last))
    checkpoints = [(n, s) for n in numbers for e in by_attempt.get(n, [])
                   if e.get("event") == "checkpoint" and (s := _int(e.get("step"))) is not None]
    if only_attempt is not None:
        series = [s for s in series if s.attempt == only_attempt]
        boundaries = [b for b in boundaries if b.attempt == only_attempt]
        failures = [f for f in failures if f.attempt == only_attempt]
        redone = [r for r in redone if r.attempt == only_attempt]
        checkpoints = [c for c in checkpoints if c[0] == only_attempt]
    return PlotData(run, series, boundaries, failures, redone, checkpoints,
                    SAMPLES_PER_S if by_samples else STEPS_PER_S)


def _reached(record: Mapping[str, Any] | None, steps: list[Mapping[str, Any]]) -> int | None:
    """The last step an attempt reached: the record's (what `wmctl status` counts), else the
    highest step line kept."""
    if record is not None and _int(record.get("last_step")) is not None:
        return int(record["last_step"])
    seen = [s for e in steps if (s := _int(e.get("step"))) is not None]
    return max(seen) if seen else None


def _boundary(attempt: int, record: Mapping[str, Any], events: list[Mapping[str, Any]]) -> Boundary:
    resumes = [e for e in events if e.get("event") == "resume" and _int(e.get("step")) is not None]
    # A resume said exact may be amended to not exact by a later line (an unregistered DataLoader).
    resume = next((e for e in resumes if e.get("exact") is False), resumes[0] if resumes else None)
    exact = resume.get("exact") if resume is not None and isinstance(resume.get("exact"), bool) else None
    reason = str(resume.get("reason") or "") if resume is not None and exact is False else ""
    step = _int(record.get("resumed_from_step"))
    if step is None and resume is not None:
        step = int(resume["step"])
    return Boundary(attempt, step if step is not None else 0, step is not None, exact, reason)
