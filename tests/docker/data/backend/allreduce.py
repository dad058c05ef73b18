"""A tiny 2-node gloo job: all_reduce, a report of what the container gives it, progress lines.

WMCTL_TEST_LOOP_S=N: keep doing one all_reduce + progress line every 0.2 s for N seconds (a
job that is still running when a test injects a fault).
"""

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from orchestrator.runtime.protocol import format_progress


def cgroup_cpuset() -> str | None:
    for path in ("/sys/fs/cgroup/cpuset/cpuset.cpus", "/sys/fs/cgroup/cpuset.cpus.effective"):
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError:
            continue
    return None


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    st = os.statvfs("/dev/shm")
    with open("/proc/mounts") as fh:
        targets = sorted({line.split()[1] for line in fh})
    report = {"rank": rank, "world": dist.get_world_size(), "node": os.environ.get("WMCTL_NODE_NAME"),
              "shm_bytes": st.f_blocks * st.f_frsize, "cpuset": cgroup_cpuset(),
              "affinity": sorted(os.sched_getaffinity(0)), "mounts": targets}
    print("BACKEND-REPORT " + json.dumps(report), flush=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if rank == 0:
        print(format_progress("step", step=1, sum=t.item()), flush=True)
    deadline = time.monotonic() + float(os.environ.get("WMCTL_TEST_LOOP_S", "0"))
    step = 1
    while time.monotonic() < deadline:
        time.sleep(0.2)
        dist.all_reduce(t)
        step += 1
        if rank == 0:
            print(format_progress("step", step=step), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
