"""Build fake sysfs/procfs/cgroup trees on disk for the topology readers.

Real files and real symlinks, laid out like the kernel's, so the readers under test do exactly
what they do on a machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.runtime.topology import format_cpulist


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


class FakeSysfs:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def cpus(self, n: int, smt: bool = False) -> "FakeSysfs":
        """``n`` online CPUs; with ``smt`` CPU i and i + n/2 are siblings (Linux's numbering)."""
        _write(self.root, "/sys/devices/system/cpu/online", format_cpulist(range(n)))
        half = n // 2
        for cpu in range(n):
            sibs = {cpu, (cpu + half) % n} if smt else {cpu}
            _write(self.root, f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list",
                   format_cpulist(sibs))
        return self

    def node(self, index: int, cpus) -> "FakeSysfs":
        _write(self.root, f"/sys/devices/system/node/node{index}/cpulist", format_cpulist(cpus))
        return self

    def pci(self, bdf: str, vendor: int, cls: int = 0x030200, numa_node: int = -1,
            drm_card: int | None = None) -> "FakeSysfs":
        base = f"/sys/bus/pci/devices/{bdf}"
        _write(self.root, f"{base}/vendor", f"0x{vendor:04x}")
        _write(self.root, f"{base}/class", f"0x{cls:06x}")
        _write(self.root, f"{base}/numa_node", str(numa_node))
        if drm_card is not None:
            link = self.root / f"sys/class/drm/card{drm_card}"
            link.mkdir(parents=True, exist_ok=True)
            os.symlink(self.root / base.lstrip("/"), link / "device")
        return self

    def nvidia_proc(self, bdf: str) -> "FakeSysfs":
        _write(self.root, f"/proc/driver/nvidia/gpus/{bdf}/information", "Model: fake")
        return self

    def cgroup_v2(self, cpus) -> "FakeSysfs":
        _write(self.root, "/proc/self/cgroup", "0::/")
        _write(self.root, "/sys/fs/cgroup/cpuset.cpus.effective", format_cpulist(cpus))
        return self

    def cgroup_v1(self, cpus) -> "FakeSysfs":
        _write(self.root, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus", format_cpulist(cpus))
        return self


def two_socket_8gpu(root: Path, vendor: int = 0x10DE, smt: bool = True) -> FakeSysfs:
    """2 NUMA nodes x 64 CPUs (32 cores x 2 threads), 8 accelerators, 4 per node.

    Node 0: CPUs 0-15 and their siblings 32-47; node 1: 16-31 and 48-63 (Linux numbering).
    Devices are added in shuffled order so that sorting by BDF is exercised.
    """
    fs = FakeSysfs(root).cpus(64, smt=smt)
    fs.node(0, list(range(0, 16)) + list(range(32, 48)))
    fs.node(1, list(range(16, 32)) + list(range(48, 64)))
    buses = ["18", "3b", "0a", "2a", "9a", "ba", "ab", "ca"]  # 4 below 0x80 (node 0), 4 above
    for bus in buses:
        fs.pci(f"0000:{bus}:00.0", vendor, 0x030200, 0 if int(bus, 16) < 0x80 else 1)
    # Same vendor, not accelerators: an audio function and an NVSwitch bridge.
    fs.pci("0000:0a:00.1", vendor, 0x040300, 0)
    fs.pci("0000:e0:00.0", vendor, 0x068000, 1)
    return fs
