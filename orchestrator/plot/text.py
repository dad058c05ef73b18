"""Draw PlotData as a text chart for a terminal (an SSH session, a pipe): no dependency, ASCII only.

Loss above, throughput below, on one step axis. A point is the digit of the attempt that logged
it; ``|`` marks where an attempt started (its resume step), ``X`` where one failed, ``:`` shades
the steps redone after a resume. A legend under the chart says each in words."""

from __future__ import annotations

from .data import PlotData, exactness

LABEL = 10                 # y-axis label column
REDONE, BOUNDARY, FAILURE = ":", "|", "X"


def render(data: PlotData, width: int = 80, height: int = 12) -> str:
    width = max(40, width)
    cols = width - LABEL - 1
    lo, hi = data.step_range()
    span = max(1, hi - lo)

    def col(step: float) -> int:
        return max(0, min(cols - 1, round((step - lo) / span * (cols - 1))))

    lines = [data.title()[:width]]
    loss = [(s, v, str(series.attempt % 10)) for series in data.series
            for s, v in zip(series.steps, series.loss, strict=True)]
    rate = [(s, v, str(series.attempt % 10)) for series in data.series
            for s, v in zip(series.rate_steps, series.rate, strict=True)]
    lines += _chart("loss", loss, data, col, cols, max(4, height))
    if rate:
        lines += _chart(data.rate_unit, rate, data, col, cols, max(3, height // 2))
    axis = [" "] * cols
    left, right = str(lo), str(hi)
    axis[:len(left)] = left
    axis[cols - len(right):] = right
    mid = (cols - 4) // 2
    axis[mid:mid + 4] = "step"
    lines.append(" " * LABEL + "+" + "-" * cols)
    lines.append(" " * LABEL + " " + "".join(axis))
    lines += _legend(data)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _chart(name: str, points: list[tuple[int, float, str]], data: PlotData, col, cols: int,
           rows: int) -> list[str]:
    grid = [[" "] * cols for _ in range(rows)]
    values = [v for _, v, _ in points]
    vmin, vmax = (min(values), max(values)) if values else (0.0, 1.0)
    vspan = (vmax - vmin) or 1.0

    def row(v: float) -> int:
        return max(0, min(rows - 1, round((vmax - v) / vspan * (rows - 1))))

    def mark(c: int, r: int, ch: str) -> None:
        if grid[r][c] in (" ", REDONE) or (ch == FAILURE and grid[r][c] == BOUNDARY):
            grid[r][c] = ch

    for r_ in data.redone:
        for c in range(col(r_.first - 1) + 1, col(r_.last) + 1):
            for r in range(rows):
                mark(c, r, REDONE)
    for b in data.boundaries:
        for r in range(rows):
            mark(col(b.step), r, BOUNDARY)
    for step, value, ch in points:
        grid[row(value)][col(step)] = ch
    for f in data.failures:
        if f.step is not None:
            mark(col(f.step), 0, FAILURE)
    out = [f"{name[:LABEL - 1]:<{LABEL}}"]
    for r, cells in enumerate(grid):
        label = f"{vmax:.4g}" if r == 0 else f"{vmin:.4g}" if r == rows - 1 else ""
        out.append(f"{label:>{LABEL - 1}} |" + "".join(cells))
    return out


def _legend(data: PlotData) -> list[str]:
    out = [f"0-9: the attempt of each point   {BOUNDARY} attempt start   {FAILURE} failure   {REDONE} steps redone"]
    if data.empty:
        out.append("no step lines kept for this run (yet): only its attempts are drawn")
    for b in data.boundaries:
        how = f"resumed from step {b.step}" + exactness(b) if b.resumed else "started from step 0"
        out.append(f"attempt {b.attempt}: {how}")
    for f in data.failures:
        at = f" at step {f.step}" if f.step is not None else ""
        out.append(f"attempt {f.attempt}: failed{at}: {f.kind}")
    for r in data.redone:
        lost = "a node a spare replaced in place" if r.in_place else f"attempt {r.attempt - 1}"
        out.append(f"attempt {r.attempt}: redoes steps {r.first}-{r.last} ({r.count}), lost with {lost}")
    return out
