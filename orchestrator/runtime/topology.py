"""Read the machine's CPU/NUMA/accelerator topology from sysfs, procfs and the cgroup cpuset.

Every reader takes ``root`` (default ``"/"``) so tests can point it at a fake tree built on disk.
Standard library only: the ``wmctl-bind`` launcher imports this before exec'ing the training
process, so it must load in milliseconds (no torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .vendor import CPU, RuntimeProfile, VendorUnknown, known, resolve

# How to find a vendor's accelerators comes from its profile (runtime.vendor): its PCI vendor
# ids and the listings tried in order, the first that finds devices wins ("pci", the generic scan
# of /sys/bus/pci/devices, comes last).

# PCI class (top 16 bits of the 24-bit class code) of accelerator functions: VGA, 3D controller,
# "other display controller" (AMD Instinct MI-series report this one), processing accelerator.
# Audio functions, NVSwitch bridges and NICs of the same vendor fall outside these classes.
ACCELERATOR_CLASSES = (0x0300, 0x0302, 0x0380, 0x1200)

class TopologyError(Exception):
    """A topology file exists but cannot be understood."""


@dataclass(frozen=True)
class Device:
    bdf: str          # PCI address, e.g. 0000:17:00.0
    numa_node: int    # -1 when the platform gives none
    vendor_id: int


@dataclass(frozen=True)
class Topology:
    vendor: str
    devices: tuple[Device, ...]
    node_cpus: dict[int, frozenset[int]]      # NUMA node -> its CPUs
    cores: tuple[frozenset[int], ...]         # physical cores: sets of SMT sibling CPUs
    allowed: frozenset[int]                   # CPUs this process may run on
    device_source: str = ""                   # which listing found the devices
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------- cpulists

def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8,10-11"`` -> {0,1,2,3,8,10,11}. Empty text is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if a < 0 or b < a:
                    raise ValueError
                cpus.update(range(a, b + 1))
            else:
                a = int(part)
                if a < 0:
                    raise ValueError
                cpus.add(a)
        except ValueError:
            raise TopologyError(f"bad CPU list {text!r}: expected e.g. '0-15' or '0-7,16-23'") from None
    return frozenset(cpus)


def format_cpulist(cpus) -> str:
    """{0,1,2,3,8} -> ``"0-3,8"`` (the kernel's own spelling)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# ---------------------------------------------------------------- file helpers

def _path(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(root: str, path: str) -> str | None:
    try:
        with open(_path(root, path), encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None


def _listdir(root: str, path: str) -> list[str]:
    try:
        return sorted(os.listdir(_path(root, path)))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


# ---------------------------------------------------------------- CPUs and NUMA

def read_node_cpus(root: str = "/") -> dict[int, frozenset[int]]:
    """NUMA node -> CPUs from /sys/devices/system/node/nodeN/cpulist (empty when no NUMA info)."""
    nodes: dict[int, frozenset[int]] = {}
    for name in _listdir(root, "/sys/devices/system/node"):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        text = _read(root, f"/sys/devices/system/node/{name}/cpulist")
        if text is not None:
            nodes[int(name[4:])] = parse_cpulist(text)
    return nodes


def read_online_cpus(root: str = "/") -> frozenset[int]:
    text = _read(root, "/sys/devices/system/cpu/online")
    if text:
        return parse_cpulist(text)
    cpus = {int(n[3:]) for n in _listdir(root, "/sys/devices/system/cpu") if n.startswith("cpu") and n[3:].isdigit()}
    return frozenset(cpus)


def read_cores(root: str = "/", cpus=None) -> tuple[frozenset[int], ...]:
    """Physical cores as sets of SMT siblings (thread_siblings_list), sorted by their first CPU.

    A CPU without topology information counts as a core of its own.
    """
    cpus = read_online_cpus(root) if cpus is None else cpus
    seen: set[int] = set()
    cores: list[frozenset[int]] = []
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        text = _read(root, f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        group = (parse_cpulist(text) if text else frozenset()) | {cpu}
        seen |= group
        cores.append(frozenset(group))
    return tuple(cores)


def read_cgroup_cpuset(root: str = "/") -> frozenset[int] | None:
    """The effective cpuset of this process's cgroup (v2, then v1); None when there is none."""
    candidates: list[str] = []
    cgroup = _read(root, "/proc/self/cgroup") or ""
    for line in cgroup.splitlines():
        # v2: "0::/path"; with a cgroup namespace the path is usually "/".
        if line.startswith("0::"):
            rel = line[3:].strip().lstrip("/")
            if rel:
                candidates.append(f"/sys/fs/cgroup/{rel}/cpuset.cpus.effective")
    candidates += [
        "/sys/fs/cgroup/cpuset.cpus.effective",            # v2, cgroup namespace root
        "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",     # v1
        "/sys/fs/cgroup/cpuset/cpuset.cpus",               # v1, older kernels
    ]
    for path in candidates:
        text = _read(root, path)
        if text:
            return parse_cpulist(text)
    return None


def read_allowed_cpus(root: str = "/") -> frozenset[int]:
    """CPUs this process may use. On the real root, sched_getaffinity (it already reflects the
    cgroup cpuset and any taskset); on a fake tree, its cgroup cpuset, else its online CPUs."""
    if os.path.abspath(root) == "/":
        return frozenset(os.sched_getaffinity(0))
    cpuset = read_cgroup_cpuset(root)
    return cpuset if cpuset is not None else read_online_cpus(root)


# ---------------------------------------------------------------- accelerators

def _pci_device(root: str, bdf: str) -> Device | None:
    base = f"/sys/bus/pci/devices/{bdf}"
    vendor_id = _hex(_read(root, f"{base}/vendor"))
    if vendor_id is None:
        return None
    node_text = _read(root, f"{base}/numa_node")
    try:
        node = int(node_text) if node_text is not None else -1
    except ValueError:
        node = -1
    return Device(bdf=bdf, numa_node=node, vendor_id=vendor_id)


def _is_accelerator(root: str, bdf: str, pci_ids) -> bool:
    base = f"/sys/bus/pci/devices/{bdf}"
    vendor_id = _hex(_read(root, f"{base}/vendor"))
    cls = _hex(_read(root, f"{base}/class"))
    return vendor_id in pci_ids and cls is not None and (cls >> 8) in ACCELERATOR_CLASSES


def _list_pci(root: str, pci_ids) -> list[str]:
    return [b for b in _listdir(root, "/sys/bus/pci/devices") if _is_accelerator(root, b, pci_ids)]


def _list_nvidia_proc(root: str, pci_ids) -> list[str]:
    # Entries are BDFs, sometimes with a shorter domain; normalise to sysfs spelling.
    out = []
    for name in _listdir(root, "/proc/driver/nvidia/gpus"):
        bdf = name.lower()
        if bdf.count(":") == 2 and len(bdf.split(":")[0]) != 4:
            dom, rest = bdf.split(":", 1)
            bdf = f"{int(dom, 16):04x}:{rest}"
        out.append(bdf)
    return out


def _list_drm(root: str, pci_ids) -> list[str]:
    # /sys/class/drm/cardN/device is a symlink to the PCI function; its basename is the BDF.
    out: set[str] = set()
    for name in _listdir(root, "/sys/class/drm"):
        if not (name.startswith("card") and name[4:].isdigit()):
            continue
        link = _path(root, f"/sys/class/drm/{name}/device")
        try:
            target = os.path.basename(os.path.realpath(link))
        except OSError:
            continue
        if _is_accelerator(root, target, pci_ids):
            out.add(target)
    return sorted(out)


_SOURCES = {"pci": _list_pci, "nvidia-proc": _list_nvidia_proc, "drm": _list_drm}


def normalise_vendor(vendor: str | None, env=None) -> str:
    """The profile name ``vendor`` (or an alias of it) stands for."""
    return profile_of(vendor, env).name


def profile_of(vendor: str | RuntimeProfile | None, env=None) -> RuntimeProfile:
    try:
        return resolve(vendor, env)
    except VendorUnknown as exc:
        raise TopologyError(str(exc)) from None


def list_devices(vendor: str | RuntimeProfile, root: str = "/", env=None) -> tuple[tuple[Device, ...], str]:
    """The vendor's accelerators in local-device order, and the listing that found them.

    Order is PCI bus order (sorted BDF); an in-process visible-devices variable with integer
    indices (e.g. CUDA_VISIBLE_DEVICES=2,3) selects from that order.
    """
    env = os.environ if env is None else env
    profile = profile_of(vendor, env)
    for source in profile.device_sources:
        bdfs = sorted(_SOURCES[source](root, profile.pci_vendor_ids))
        devices = [d for d in (_pci_device(root, b) for b in bdfs) if d is not None]
        if not devices:
            continue
        visible = env.get(profile.visible_devices_env or "", "").strip()
        if visible:
            parts = [p.strip() for p in visible.split(",") if p.strip()]
            if parts and all(p.isdigit() for p in parts):
                devices = [devices[int(p)] for p in parts if int(p) < len(devices)]
        return tuple(devices), source
    return (), ""


def detect_vendor(root: str = "/", env=None) -> str:
    """The first known vendor with accelerators on this machine, else ``cpu``."""
    for profile in known(env):
        if profile.pci_vendor_ids and _list_pci(root, profile.pci_vendor_ids):
            return profile.name
    return CPU.name


def read_topology(vendor: str | None = "cpu", root: str = "/", env=None) -> Topology:
    vendor = detect_vendor(root, env) if (vendor or "").lower() == "auto" else normalise_vendor(vendor, env)
    profile = profile_of(vendor, env)
    devices, source = list_devices(profile, root, env)
    allowed = read_allowed_cpus(root)
    online = read_online_cpus(root) | allowed
    notes = []
    if "pci" in profile.unverified:
        notes.append(f"the PCI vendor id of {vendor} is unverified; check `lspci -nn` if no device is found")
    return Topology(
        vendor=vendor,
        devices=devices,
        node_cpus=read_node_cpus(root),
        cores=read_cores(root, online),
        allowed=allowed,
        device_source=source,
        notes=tuple(notes),
    )
