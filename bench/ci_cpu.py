"""Where CI's CPU goes, per test: a pytest plugin, then a report.

The suite is CPU-bound on CI's two cores (97 % busy over a whole `-n 4` run), so a test's wall
time is mostly its share of the cores, and what shortens CI is CPU taken out, not seconds of
waiting. Each xdist worker moves itself into a cgroup of its own (cgroup v1 ``cpuacct``, root
needed); a test's figure is that cgroup's CPU over its setup, call and teardown, every process
it started included (watchers, torchrun agents, workers, `wmctl` calls). Not included: Docker
containers and Slurm jobs (their daemons' cgroups), and the daemons themselves; the report says
how much of the machine's busy time that left out.

    sudo env PYTHONPATH=bench CI_CPU_OUT=/tmp/cpu.jsonl .venv/bin/python -m pytest -p ci_cpu \\
        -n 4 --dist loadgroup
    python bench/ci_cpu.py /tmp/cpu.jsonl            # the 40 costliest tests and files

Measured this way (2026-12-07, 2664 tests, 1277 s): 2472 CPU-s busy, 1651 in tests' own
processes (integration 807, runtime 540, kube 111, docker 69 host-side, slurm 65, unit 58), 821 in
containers, Slurm jobs and daemons. A 2-node local attempt costs about 8 CPU-s, nearly all of it
four interpreters importing torch (two torchrun agents, two workers).

Then (2026-12-07, 2647 tests): the test job alone on one rank imports no torch, and the suite's
processes write and reuse bytecode (CI's image sets PYTHONDONTWRITEBYTECODE=1). `.ci/run` on a
fresh clone on this machine: before, tests 1153 s (20:14 in all); after, three runs within the
hour, tests 801, 955 and 958 s (14:08 to 17:03 in all). One integration file (test_lifecycle.py,
25 one-node runs) 168 -> 128 CPU-s from the test job alone.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Any

ROOT = "/sys/fs/cgroup/cpuacct"
_state: dict[str, Any] = {"cg": None, "out": None, "start": {}, "stat": None}


def _usage() -> float:
    with open(f"{_state['cg']}/cpuacct.usage", encoding="utf-8") as fh:
        return int(fh.read()) / 1e9


def _busy() -> float:
    """The machine's busy CPU seconds since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat", encoding="utf-8") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def pytest_configure(config: Any) -> None:
    out = os.environ.get("CI_CPU_OUT", "/tmp/ci-cpu.jsonl")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:                  # the controller: the machine's busy time over the run
        _state["stat"] = (out, _busy(), time.time())
        return
    cg = f"{ROOT}/wmctl_ci_{worker}"
    os.makedirs(cg, exist_ok=True)
    with open(f"{cg}/cgroup.procs", "w", encoding="utf-8") as fh:
        fh.write(str(os.getpid()))
    _state["cg"], _state["out"] = cg, open(out, "a", encoding="utf-8")


def pytest_unconfigure(config: Any) -> None:
    if _state["stat"] is not None:
        out, busy, started = _state["stat"]
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"machine_busy": round(_busy() - busy, 1), "wall": round(time.time() - started, 1)})
                     + "\n")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _state["cg"]:
        _state["start"][nodeid] = (_usage(), time.time())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _state["cg"] and nodeid in _state["start"]:
        cpu0, wall0 = _state["start"].pop(nodeid)
        _state["out"].write(json.dumps({"id": nodeid, "cpu": round(_usage() - cpu0, 2),
                                        "wall": round(time.time() - wall0, 2)}) + "\n")
        _state["out"].flush()


def report(path: str, top: int = 40) -> None:
    rows, machine = [], None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            data = json.loads(line)
            if "machine_busy" in data:
                machine = data
            else:
                rows.append(data)
    total = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s in their own processes")
    if machine:
        print(f"machine busy {machine['machine_busy']:.0f} CPU-s over {machine['wall']:.0f} s; "
              f"not in tests' processes (containers, Slurm jobs, daemons): {machine['machine_busy'] - total:.0f}")
    files: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        files[r["id"].split("::")[0]] += r["cpu"]
    print("\ncostliest files:")
    for name, cpu in sorted(files.items(), key=lambda kv: -kv[1])[:top // 2]:
        print(f"  {cpu:7.1f}  {name}")
    print("\ncostliest tests (CPU-s, wall s):")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"  {r['cpu']:6.1f} {r['wall']:6.1f}  {r['id']}")


if __name__ == "__main__":
    report(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ci-cpu.jsonl")
