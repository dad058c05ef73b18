"""The live panel's model: the supervisor's news folded into a state, and that state into rows.

Pure: no terminal, no clock, no I/O. ``PanelState.fold(news)`` takes what the supervisor already
has (its record, the attempt's nodes, this round's events with their own times, its heartbeat
and backoff clocks); ``rows(state, now)`` says what to show at ``now``; ``fit(rows, width)``
makes every line exactly ``width`` characters, so the panel never changes width. Rendering
(rich, colours, the box) is orchestrator.display's.

Where each row comes from:
- step / max_steps: the record's last step (the supervisor's fold); max_steps from the job's
  ``start`` progress line (``Progress.start(..., max_steps=N)``); without it, no percent or ETA.
- loss and its trend, throughput, ETA: ``step`` progress lines (loss, cumulative ``samples``),
  timed by the lines' own clock, so a replayed attempt reads the same as a live one.
- checkpoint: the newest committed step and its age; after a resume, the step resumed from.
- split: the last step line's ``timing`` (orchestrator.runtime.timing), its bottleneck first.
- heartbeat: the supervisor's hang clock against ``restart.heartbeat_timeout``; per node, the
  backend's phase and host and when the node last printed a line.
- in place: the running attempt's in-place recoveries (spare nodes): which node a spare replaced,
  at which step, from which checkpoint, and the new spare started for it.
- failures: every failed attempt in the record, with its class and the decision taken.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .backends import base as b
from .state import RunRecord
from .stragglers import entry_text

if TYPE_CHECKING:
    from .watchview import News

SPARK = "▁▂▃▄▅▆▇█"
SPARK_ASCII = "_.-=+*#"
SPARK_POINTS = 24          # losses in the trend
RATE_WINDOW = 10           # step lines the throughput and ETA are measured over
BAR_WIDTH = 16
LABEL_WIDTH = 12
MAX_NODE_ROWS = 8
MAX_FAILURE_ROWS = 6
MAX_IN_PLACE_ROWS = 3
WIDTH = 80                 # the panel's width on a terminal at least this wide
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Row tones; the renderer maps them to colours (none under NO_COLOR).
OK, WARN, BAD, DIM, PLAIN = "ok", "warn", "bad", "dim", ""
PHASE_TONE = {b.RUNNING: OK, b.SUCCEEDED: OK, b.PENDING: DIM, b.PAUSED: WARN, b.FAILED: BAD, b.LOST: BAD}


@dataclass(frozen=True)
class Row:
    label: str
    value: str
    tone: str = PLAIN


@dataclass
class NodeState:
    node: int
    phase: str = b.PENDING
    host: str | None = None
    exit_code: int | None = None
    last_line_at: float | None = None     # the node's last output or progress line


@dataclass
class PanelState:
    """What the panel knows, folded from the supervisor's news (``fold``)."""

    record: RunRecord | None = None
    attempt: int | None = None
    step: int | None = None
    resumed_from: int | None = None
    max_steps: int | None = None
    losses: deque[float] = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))
    loss: Any = None
    rates: deque[tuple[float, int, float | None]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    timing: dict[str, Any] | None = None
    checkpoint_step: int | None = None
    checkpoint_times: dict[int, float] = field(default_factory=dict)
    nodes: dict[int, NodeState] = field(default_factory=dict)
    heartbeat_at: float | None = None
    heartbeat_timeout_s: float = 0.0
    backoff_until: float | None = None

    def fold(self, news: News) -> None:
        """Take one piece of the supervisor's news."""
        for kept in news.history:                 # earlier attempts, as the run store kept them
            at = _number(kept.get("time"))
            self._progress(kept, at if at is not None else _number(kept.get("seen")) or 0.0)
        rec = news.attempt
        if rec.attempt != self.attempt:
            # A new attempt: its own nodes and rate; the run's trend, checkpoints and max_steps stay.
            self.attempt, self.nodes, self.timing = rec.attempt, {}, None
            self.rates.clear()
        self.record = news.record
        self.step = rec.last_step if rec.last_step is not None else self.step
        self.resumed_from = rec.resumed_from_step
        if rec.last_checkpoint_step is not None:
            self.checkpoint_step = rec.last_checkpoint_step
        elif rec.resumed_from_step is not None:
            self.checkpoint_step = rec.resumed_from_step
        for status in news.nodes:
            node = self.nodes.setdefault(status.node, NodeState(status.node))
            node.phase, node.host, node.exit_code = status.phase, status.host or node.host, status.exit_code
        for ev in news.events:
            self._event(ev)
        self.heartbeat_at, self.heartbeat_timeout_s = news.heartbeat_at, news.heartbeat_timeout_s
        self.backoff_until = news.backoff_until

    def _event(self, ev: b.Event) -> None:
        p = ev.progress or {}
        at = _number(p.get("time"))                 # a progress line's own clock, else the backend's
        at = ev.time if at is None else at
        if ev.node is not None and ev.kind in (b.OUTPUT, b.PROGRESS):
            node = self.nodes.setdefault(ev.node, NodeState(ev.node, b.RUNNING, ev.host))
            node.last_line_at = max(node.last_line_at or at, at)
        if ev.kind == b.PROGRESS and p:
            self._progress(p, at)

    def _progress(self, p: dict[str, Any], at: float) -> None:
        kind, step = p.get("event"), _integer(p.get("step"))
        if kind == "start" and _integer(p.get("max_steps")) is not None:
            self.max_steps = int(p["max_steps"])
        elif kind == "checkpoint" and step is not None:
            self.checkpoint_times[step] = at
        elif kind == "step" and step is not None:
            self.loss = p.get("loss")
            loss = _number(self.loss)
            if loss is not None and math.isfinite(loss):
                self.losses.append(loss)
            if isinstance(p.get("timing"), dict) and p["timing"]:
                self.timing = p["timing"]
            self.rates.append((at, step, _number(p.get("samples"))))


def rows(state: PanelState, now: float, unicode: bool = True) -> list[Row]:
    """What the panel shows at ``now``, one row per fact, in a fixed order."""
    record = state.record
    if record is None:
        return [Row("run", "waiting for the first attempt", DIM)]
    out = [_step_row(state, unicode), _loss_row(state, unicode), _throughput_row(state),
           _time_row(state, record, now), _checkpoint_row(state, now), _split_row(state),
           _heartbeat_row(state, record, now)]
    out += _node_rows(state, now)
    current = record.attempts[-1] if record.attempts else None
    if current is not None and current.outcome is None and current.evidence and record.status == "running":
        # the cluster's or the queue's reason while nodes wait to be created, placed or admitted
        out.append(Row("waiting", current.evidence, WARN))
    if current is not None:
        out += [Row("straggler", entry_text(s), WARN) for s in current.stragglers if s.get("cleared_step") is None]
        out += _in_place_rows(current.recoveries)
    out += _failure_rows(record)
    if state.backoff_until is not None and record.status == "running":
        left = max(0, math.ceil(state.backoff_until - now))
        out.append(Row("backoff", f"next attempt ({(state.attempt or 0) + 1}) in {left}s", WARN))
    return out


def title(state: PanelState, unicode: bool = True) -> str:
    record = state.record
    if record is None:
        return "wmctl"
    sep = " · " if unicode else " - "
    parts = [record.run, record.backend] + ([f"attempt {state.attempt}"] if state.attempt is not None else [])
    return sep.join(parts + [record.status])


def fit(rows_: list[Row], width: int, unicode: bool = True) -> list[tuple[str, str]]:
    """Each row as (text, tone), the text exactly ``width`` characters: cut with an ellipsis
    when too long, padded when short. The panel's width never follows its content."""
    out = []
    for row in rows_:
        value = CONTROL.sub(" ", row.value)   # one line: no newline, tab or escape from a message reaches the panel
        text = f"{row.label:<{LABEL_WIDTH}}{value}" if row.label else value
        out.append((clip(text, width, unicode), row.tone))
    return out


def clip(text: str, width: int, unicode: bool = True) -> str:
    if not unicode:
        text = text.encode("ascii", "replace").decode("ascii")
    if len(text) > width:
        mark = "…" if unicode else "~"
        text = text[:max(0, width - 1)] + mark
    return text.ljust(width)[:width]


# -- rows ----------------------------------------------------------------------------------------

def _step_row(state: PanelState, unicode: bool) -> Row:
    if state.step is None:
        return Row("step", "- (no progress line yet)", DIM)
    if not state.max_steps:
        return Row("step", f"{state.step}")
    done = min(1.0, state.step / state.max_steps)
    filled = int(done * BAR_WIDTH)
    bar = ("█" * filled + "░" * (BAR_WIDTH - filled)) if unicode else ("#" * filled + "-" * (BAR_WIDTH - filled))
    return Row("step", f"{state.step} / {state.max_steps}  {done * 100:3.0f}%  {bar}")


def _loss_row(state: PanelState, unicode: bool) -> Row:
    loss = _number(state.loss)
    if state.loss is None:
        return Row("loss", "-", DIM)
    if loss is None or not math.isfinite(loss):
        return Row("loss", f"{str(state.loss)[:12]}  {sparkline(list(state.losses), unicode)}", BAD)
    return Row("loss", f"{loss:<10.4g}{sparkline(list(state.losses), unicode)}")


def _throughput_row(state: PanelState) -> Row:
    rate = _rate(state)
    if rate is None:
        return Row("throughput", "-", DIM)
    steps_s, samples_s = rate
    parts = [f"{samples_s:,.1f} samples/s"] if samples_s is not None else []
    parts.append(f"{steps_s:.2f} steps/s")
    return Row("throughput", "  ".join(parts))


def _time_row(state: PanelState, record: RunRecord, now: float) -> Row:
    text = f"elapsed {duration(now - record.created_at)}"
    rate = _rate(state)
    if record.status != "running":
        return Row("time", text)
    if state.max_steps and state.step is not None and rate is not None and rate[0] > 0:
        text += f"   ETA {duration(max(0, state.max_steps - state.step) / rate[0])}"
    elif not state.max_steps:
        text += "   ETA - (the job's start line gives no max_steps)"
    return Row("time", text)


def _checkpoint_row(state: PanelState, now: float) -> Row:
    step = state.checkpoint_step
    if step is None:
        return Row("checkpoint", "none yet", DIM)
    at = state.checkpoint_times.get(step)
    age = f", {duration(now - at)} ago" if at is not None else ""
    if state.resumed_from is not None and step == state.resumed_from:
        return Row("checkpoint", f"step {step}{age} (resumed from it)")
    resumed = f" (resumed from {state.resumed_from})" if state.resumed_from is not None else ""
    return Row("checkpoint", f"step {step}{age}{resumed}")


def _split_row(state: PanelState) -> Row:
    timing = state.timing or {}
    step_s = _number(timing.get("step_s"))
    if step_s is None:
        return Row("split", "- (no step timing in the progress lines)", DIM)
    parts = [(name, _number(timing.get(f"{name}_share"))) for name in ("compute", "data", "comm", "other")]
    shown = " ".join(f"{name} {v * 100:.0f}%" for name, v in sorted(
        ((n, v) for n, v in parts if v is not None and v >= 0.005), key=lambda nv: -nv[1])[:3])
    bound = timing.get("bottleneck")
    head = f"{step_s * 1000:.1f} ms/step" + (f", {bound}-bound" if bound else "")
    tone = WARN if bound in ("data", "communication") else PLAIN
    return Row("split", f"{head}: {shown}", tone)


def _heartbeat_row(state: PanelState, record: RunRecord, now: float) -> Row:
    timeout = state.heartbeat_timeout_s
    if record.status != "running":
        return Row("heartbeat", f"- (the run {record.status})", DIM)
    if state.heartbeat_at is None:
        return Row("heartbeat", "not yet: the hang clock starts when every node runs", DIM)
    age = max(0.0, now - state.heartbeat_at)
    tone = BAD if timeout and age > 0.8 * timeout else WARN if timeout and age > 0.5 * timeout else OK
    return Row("heartbeat", f"{duration(age)} ago; silent for {duration(timeout)} is a hang", tone)


def _node_rows(state: PanelState, now: float) -> list[Row]:
    nodes = [state.nodes[k] for k in sorted(state.nodes)]
    out = []
    for node in nodes[:MAX_NODE_ROWS]:
        exit_ = f" (exit {node.exit_code})" if node.exit_code is not None else ""
        seen = f", last line {duration(now - node.last_line_at)} ago" if node.last_line_at is not None else ""
        host = f" on {node.host}" if node.host else ""
        out.append(Row(f"node {node.node}", f"{node.phase}{exit_}{host}{seen}", PHASE_TONE.get(node.phase, PLAIN)))
    if len(nodes) > MAX_NODE_ROWS:
        rest: dict[str, int] = {}
        for node in nodes[MAX_NODE_ROWS:]:
            rest[node.phase] = rest.get(node.phase, 0) + 1
        out.append(Row("", f"and {len(nodes) - MAX_NODE_ROWS} more: "
                       + ", ".join(f"{n} {phase}" for phase, n in sorted(rest.items())), DIM))
    return out


def _in_place_rows(recoveries: list[dict[str, Any]]) -> list[Row]:
    """The attempt's in-place recoveries, the newest last; past MAX_IN_PLACE_ROWS a count first."""
    out = []
    if len(recoveries) > MAX_IN_PLACE_ROWS:
        out.append(Row("in place", f"{len(recoveries)} recoveries in this attempt; the newest:", WARN))
        recoveries = recoveries[-(MAX_IN_PLACE_ROWS - 1):]
    for r in recoveries:
        new = f"; new spare node {r['replenished']}" if r.get("replenished") is not None else ""
        out.append(Row("in place", f"node {r.get('lost_node')} -> spare node {r.get('spare_node')} at step "
                       f"{r.get('step')}, from checkpoint {r.get('checkpoint_step')}{new}", WARN))
    return out


def _failure_rows(record: RunRecord) -> list[Row]:
    failed = [a for a in record.attempts if a.outcome and a.outcome != "succeeded"]
    out = []
    if len(failed) > MAX_FAILURE_ROWS:
        out.append(Row("failures", f"{len(failed)} so far; the first "
                       f"{len(failed) - MAX_FAILURE_ROWS + 1} in `wmctl status {record.run}`", BAD))
        failed = failed[-(MAX_FAILURE_ROWS - 1):]
    for a in failed:
        where = f" node {a.failed_node}" if a.failed_node is not None else ""
        decision = f" -> {a.decision}" if a.decision else ""
        out.append(Row(f"failure a{a.attempt}", f"{a.outcome}{where}{decision}: {a.evidence or ''}", BAD))
    return out


# -- helpers -------------------------------------------------------------------------------------

def sparkline(values: list[float], unicode: bool = True) -> str:
    """The trend of ``values``, one character each, lowest to highest of the window."""
    marks = SPARK if unicode else SPARK_ASCII
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return marks[len(marks) // 2] * len(values)
    top = len(marks) - 1
    return "".join(marks[round((v - lo) / (hi - lo) * top)] for v in values)


def duration(seconds: float) -> str:
    """Seconds as 42s, 3m05s or 2h03m: short and of a steady width."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _rate(state: PanelState) -> tuple[float, float | None] | None:
    """(steps/s, samples/s) over the last step lines of this attempt; samples are cumulative."""
    if len(state.rates) < 2:
        return None
    (t0, s0, n0), (t1, s1, n1) = state.rates[0], state.rates[-1]
    if t1 - t0 <= 0 or s1 <= s0:
        return None
    samples = (n1 - n0) / (t1 - t0) if n0 is not None and n1 is not None and n1 > n0 else None
    return (s1 - s0) / (t1 - t0), samples


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
