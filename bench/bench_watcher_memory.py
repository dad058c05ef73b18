"""The watcher's memory and CPU while a job prints progress lines for a long time (issue 22, item 5).

A synthetic job (one node, one rank, no torch in the worker) prints ``--lines`` WMCTL-PROGRESS
step lines at ``--rate`` lines a second, through a real foreground `wmctl submit` on the local
backend. The watcher (the submit process) is sampled from /proc every half second: its resident
memory (VmRSS) and its CPU time. Printed: RSS when the job's first line is out, at 25/50/75/100 %
of the lines, the peak, and the watcher's CPU share of one core over the job's printing.
Goal: RSS flat (under 80 MB) and under 5 % of a core, for 1,000,000 lines at 1,000 a second.

    PYTHONPATH=. python bench/bench_watcher_memory.py                  # 1,000,000 lines: ~17 min
    PYTHONPATH=. python bench/bench_watcher_memory.py --lines 100000   # ~2 min

Optionally ``--cr``: each progress line is preceded by a tqdm-like redraw without a newline.
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

JOB = r'''
import json, sys, time
lines, rate, count_file, cr = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
out = sys.stdout
start = time.time()
batch = max(1, int(rate / 100))                  # 100 writes a second
for i in range(1, lines + 1):
    if cr:
        out.write("\r%3d%%|%s| %d/%d" % (100 * i // lines, "#" * (10 * i // lines), i, lines))
        out.write("\n" if i % batch == 0 else "")
    out.write("WMCTL-PROGRESS " + json.dumps({"event": "step", "step": i, "loss": 1.0 / i,
                                              "samples": 32 * i, "time": time.time()}) + "\n")
    if i % batch == 0:
        out.flush()
        ahead = start + i / rate - time.time()
        if ahead > 0:
            time.sleep(ahead)
    if i % 1000 == 0 or i == lines:
        with open(count_file + ".tmp", "w") as fh:
            fh.write(str(i))
        import os
        os.replace(count_file + ".tmp", count_file)
out.write(f"WMCTL-PROGRESS {json.dumps({'event': 'exit', 'status': 'completed', 'step': lines})}\n")
out.flush()
'''


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="progress lines the job prints")
    ap.add_argument("--rate", type=float, default=1000.0, help="lines a second")
    ap.add_argument("--cr", action="store_true", help="a tqdm-like '\\r' redraw before each line")
    args = ap.parse_args()
    if args.lines < 4 or args.rate <= 0:
        sys.exit("--lines must be at least 4 and --rate above 0")

    home = Path(tempfile.mkdtemp(prefix="wmctl-bench-mem-"))
    ctx = home / "ctx"
    ctx.mkdir()
    (ctx / "flood.py").write_text(JOB)
    count = home / "count"
    spec = {"name": "flood", "nodes": 1, "nproc_per_node": 1, "affinity": "none",
            "image": {"vendor": "cpu", "context": str(ctx)},
            "command": ["python", "flood.py", str(args.lines), str(args.rate), str(count), "1" if args.cr else "0"],
            "restart": {"max_attempts": 1, "heartbeat_timeout": "600s"}}
    (home / "flood.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(REPO)}
    with open(home / "watcher.out", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "submit", str(home / "flood.yaml"),
                                 "--auto-resume", "--plain"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(home))
        marks: dict[str, int] = {}
        peak = 0
        cpu0 = t0 = None
        cpu1 = t1 = None
        while proc.poll() is None:
            rss, cpu = rss_kb(proc.pid), cpu_s(proc.pid)
            done = int(count.read_text() or 0) if count.exists() else 0
            if rss is not None and cpu is not None:
                if t0 is None and done > 0:
                    marks["start"], cpu0, t0 = rss, cpu, time.monotonic()
                if t0 is not None:
                    peak = max(peak, rss)
                    for pct in (25, 50, 75, 100):
                        if f"{pct}%" not in marks and done >= args.lines * pct // 100:
                            marks[f"{pct}%"] = rss
                            if pct == 100:
                                cpu1, t1 = cpu, time.monotonic()
            time.sleep(0.5)
    code = proc.returncode
    print(f"watcher memory, {args.lines:,} progress lines at {args.rate:,.0f}/s"
          f"{' with tqdm-like redraws' if args.cr else ''} (local backend; submit exit {code})")
    for name in ("start", "25%", "50%", "75%", "100%"):
        print(f"  RSS at {name:>5}: " + (f"{marks[name] / 1024:6.1f} MB" if name in marks else "   -"))
    print(f"  RSS peak     : {peak / 1024:6.1f} MB")
    if cpu0 is not None and cpu1 is not None and t0 is not None and t1 is not None and t1 > t0:
        print(f"  CPU share    : {100 * (cpu1 - cpu0) / (t1 - t0):5.1f} % of one core over {t1 - t0:.0f} s")
    else:
        print("  CPU share    : -  (the job's lines were not all seen; see " + str(home / "watcher.out") + ")")
    metrics = home / "runs" / "flood" / "metrics.jsonl"
    if metrics.exists():
        print(f"  metrics.jsonl: {metrics.stat().st_size / 1e6:.1f} MB on disk")
    if code != 0:
        print((home / "watcher.out").read_text()[-3000:])


if __name__ == "__main__":
    main()
