"""Preflight checks before training starts (the NaN/inf dtype guard is runtime.dtype_guard).

Three ways in:
- ``in_job(...)`` at the start of a training script: each node's local rank 0 checks its
  devices, /dev/shm against the DataLoader settings and the dtype, prints what it found, and stops
  the job only when training would be pointless (an accelerator vendor without a usable device).
- ``python -m orchestrator.runtime.preflight`` in the image: the doctor without click (the image
  installs the runtime with --no-deps), e.g. ``docker run IMAGE python -m orchestrator.runtime.preflight``.
- ``wmctl doctor`` on a machine with the full CLI.

Standard library at import time; torch and the vendor's plugin load inside the checks, so
importing this module stays cheap.
"""

from __future__ import annotations

import ctypes.util
import importlib
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Callable

from .advice import hint
from .dtype_guard import DtypeGuard
from .protocol import ENV_SYSFS_ROOT, ENV_VENDOR
from .vendor import RuntimeProfile, for_job, from_env

MiB = 1 << 20
GiB = 1 << 30
DOCKER_DEFAULT_SHM = 64 * MiB

@dataclass(frozen=True)
class Finding:
    level: str      # ok | warn | error
    check: str
    message: str
    hint: str = ""
    fatal: bool = False   # an error that makes training pointless: in_job() stops the job

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.fatal:
            del out["fatal"]
        return out


# ---------------------------------------------------------------- device module

def _vendor_row(vendor: str | RuntimeProfile) -> dict:
    """The vendor's runtime facts, from its profile (runtime.vendor): the torch module, the
    import that registers it, its runtime libraries and SMI tools."""
    from .topology import profile_of

    p = profile_of(vendor)
    return {"module": p.torch_module, "plugin": p.torch_plugin, "libs": p.libraries, "smi": p.smi,
            "unverified": ", ".join(p.unverified), "name": p.name}


def load_device_module(vendor: str | RuntimeProfile, import_module: Callable = importlib.import_module):
    """The vendor's torch device module (e.g. torch.cuda, torch.musa); None for cpu.

    Raises ImportError (with the missing name) when torch or the vendor plugin is absent.
    """
    row = _vendor_row(vendor)
    torch = import_module("torch")
    if row["module"] is None:
        return None
    if row["plugin"]:
        import_module(row["plugin"])  # registers torch.<module>
    module = getattr(torch, row["module"], None)
    if module is None:
        raise ImportError(f"torch.{row['module']} is not registered", name=f"torch.{row['module']}")
    return module


def check_runtime_libraries(vendor: str | RuntimeProfile, find_library: Callable = ctypes.util.find_library,
                            which: Callable = shutil.which) -> list[Finding]:
    row = _vendor_row(vendor)
    found: list[Finding] = []
    if row["libs"]:
        missing = [lib for lib in row["libs"] if not find_library(lib)]
        note = f" (library names unverified for {vendor})" if "libs" in row.get("unverified", "") else ""
        if missing:
            found.append(Finding(
                "warn", "runtime-library",
                f"vendor runtime library not found: {', '.join('lib' + m + '.so' for m in missing)}{note}",
                "use the vendor's image, or mount its runtime path into the container and add it to "
                "LD_LIBRARY_PATH / ldconfig",
            ))
        else:
            found.append(Finding("ok", "runtime-library", f"found {', '.join('lib' + m + '.so' for m in row['libs'])}"))
    if row["smi"]:
        tools = [t for t in row["smi"] if which(t)]
        if tools:
            found.append(Finding("ok", "smi", f"{tools[0]} on PATH"))
        else:
            found.append(Finding(
                "warn", "smi", f"no vendor SMI tool on PATH ({' or '.join(row['smi'])})",
                "the driver utilities are not in the container: use the vendor runtime (e.g. --runtime) "
                "or mount the driver's bin folder",
            ))
    return found


def check_devices(vendor: str | RuntimeProfile, expected: int | None, *, device_module=None, minimum: int | None = None,
                  import_module: Callable = importlib.import_module,
                  find_library: Callable = ctypes.util.find_library,
                  which: Callable = shutil.which) -> list[Finding]:
    """The vendor's torch module imports and sees ``expected`` devices (None: at least
    ``minimum``, default one). No usable device at all is marked fatal."""
    row = _vendor_row(vendor)
    if row["module"] is None:
        return [Finding("ok", "devices", "vendor cpu: no accelerator expected")]
    name = f"torch.{row['module']}"
    if device_module is None:
        try:
            device_module = load_device_module(vendor, import_module)
        except ImportError as exc:
            what = row["plugin"] or "torch"
            return [Finding(
                "error", "device-module",
                f"{name} is not available: {exc.name or what} cannot be imported",
                f"install {what} matching the torch version (or use the vendor's PyTorch image); "
                + hint("no_devices"), fatal=True,
            ), *check_runtime_libraries(vendor, find_library, which)]
    try:
        available = bool(device_module.is_available())
        count = int(device_module.device_count())
    except RuntimeError as exc:  # e.g. a driver that is too old for the runtime
        available, count = False, 0
        reason = f": {exc}"
    else:
        reason = ""
    least = max(1, minimum or 1)
    want = expected if expected is not None else least
    if available and (count == want if expected is not None else count >= least):
        return [Finding("ok", "devices", f"{name} sees {count} device(s)")]
    extra = check_runtime_libraries(vendor, find_library, which)
    causes = [f.message for f in extra if f.level != "ok"]
    return [Finding(
        "error", "devices",
        f"{name}.device_count() is {count}, expected {want if expected is not None else f'at least {least}'}"
        f" (is_available={available}){reason}",
        hint("no_devices") + ("; also: " + "; ".join(causes) if causes else "")
        + ("; check the visible-devices variables and the device-plugin request" if count else ""),
        fatal=not available or count == 0,
    ), *extra]


# ---------------------------------------------------------------- shared memory

def check_shm(num_workers: int, prefetch_factor: int = 2, batch_bytes: int = 0, *, shm_path: str = "/dev/shm",
              min_bytes: int | None = None, statvfs: Callable = os.statvfs) -> Finding:
    """/dev/shm is large enough for the DataLoader's worker -> main process batches.

    Rule: with workers, warn below max(1 GiB, workers x prefetch x batch x 2); error at or below
    Docker's 64 MiB default (the report's crash within two minutes). ``min_bytes`` (the doctor's
    --shm-min) makes anything smaller an error.
    """
    try:
        st = statvfs(shm_path)
    except OSError as exc:
        return Finding("warn" if num_workers else "ok", "shm", f"{shm_path} cannot be read: {exc.strerror}",
                       "mount a tmpfs at /dev/shm (resources.shm in the job spec)")
    size = st.f_frsize * st.f_blocks
    free = st.f_frsize * st.f_bavail
    need = num_workers * max(prefetch_factor, 1) * max(batch_bytes, 0) * 2
    fix = ("set resources.shm in the job spec (docker --shm-size 16g; on Kubernetes an emptyDir medium Memory "
           "at /dev/shm)")
    human = f"{shm_path} is {_size(size)} ({_size(free)} free)"
    if min_bytes is not None and size < min_bytes:
        return Finding("error", "shm", f"{human}, below the required {_size(min_bytes)}", fix)
    if num_workers <= 0:
        return Finding("ok", "shm", f"{human}; DataLoader without workers does not use it")
    if size <= DOCKER_DEFAULT_SHM:
        return Finding("error", "shm",
                       f"{human}: Docker's default; DataLoader with {num_workers} workers will crash (bus error)", fix)
    floor = max(GiB, need)
    if size < floor:
        return Finding("warn", "shm", f"{human}, below {_size(floor)} for {num_workers} workers"
                       + (f" x prefetch {prefetch_factor} x {_size(batch_bytes)} batches x 2" if need else ""), fix)
    if free < need:
        return Finding("warn", "shm", f"{human}, less free than the {_size(need)} the DataLoader may need",
                       "free /dev/shm (stale files of crashed runs) or raise resources.shm")
    return Finding("ok", "shm", human)


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """``16g``, ``64Mi``, ``1GiB``, ``512m``, ``1024`` (bytes) -> bytes (binary units)."""
    m = _SIZE.fullmatch(str(text).strip().lower())
    if not m:
        raise ValueError(f"bad size {text!r}: use e.g. 16g, 512Mi or 1GiB")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b|i)?")


# ---------------------------------------------------------------- dtype support

def check_bf16(vendor: str | RuntimeProfile, device_module=None) -> Finding:
    if _vendor_row(vendor)["module"] is None or device_module is None:
        return Finding("ok", "bf16", "cpu: bf16 autocast available (fp16 is not used on cpu)")
    fn = getattr(device_module, "is_bf16_supported", None)
    try:
        supported = bool(fn()) if fn is not None else None
    except RuntimeError as exc:
        return Finding("warn", "bf16", f"is_bf16_supported() failed: {exc}", "the guard will start at fp16")
    if supported:
        return Finding("ok", "bf16", "bf16 supported")
    if supported is None:
        return Finding("warn", "bf16", "the device module cannot say whether bf16 works",
                       "the dtype guard falls back to fp16 then fp32 on NaN/inf loss")
    return Finding("warn", "bf16", "bf16 not supported by this device (e.g. MTT S80)",
                   "train in fp16 with a GradScaler; the dtype guard starts at fp16")


def run_preflight(expected_devices: int | None = None, vendor: str | RuntimeProfile = "cpu", *, device_module=None,
                  minimum_devices: int | None = None, num_workers: int = 0, prefetch_factor: int = 2,
                  batch_bytes: int = 0,
                  shm_path: str = "/dev/shm", shm_min_bytes: int | None = None,
                  statvfs: Callable = os.statvfs, import_module: Callable = importlib.import_module,
                  find_library: Callable = ctypes.util.find_library,
                  which: Callable = shutil.which) -> list[Finding]:
    """All checks for this machine; callers decide what an error means (doctor exits non-zero)."""
    findings = check_devices(vendor, expected_devices, device_module=device_module, minimum=minimum_devices,
                             import_module=import_module, find_library=find_library, which=which)
    if device_module is None and not any(f.level == "error" for f in findings):
        try:
            device_module = load_device_module(vendor, import_module)
        except ImportError:
            device_module = None
    if not any(f.check == "runtime-library" for f in findings) and _vendor_row(vendor)["module"] is not None:
        findings += [f for f in check_runtime_libraries(vendor, find_library, which)]
    findings.append(check_shm(num_workers, prefetch_factor, batch_bytes, shm_path=shm_path,
                              min_bytes=shm_min_bytes, statvfs=statvfs))
    if not any(f.check in ("device-module", "devices") and f.level == "error" for f in findings):
        findings.append(check_bf16(vendor, device_module))  # meaningless without a device
    return findings


def sysfs_finding(vendor: str | RuntimeProfile, root: str = "/") -> Finding | None:
    """What sysfs shows of the vendor's cards (None for cpu): a driver-side view that does not
    depend on torch, to tell "no card" from "card present, torch cannot use it"."""
    from .topology import list_devices, profile_of

    if not profile_of(vendor).accelerator:
        return None
    devices, how = list_devices(vendor, root)
    nodes = sorted({d.numa_node for d in devices})
    if devices:
        return Finding("ok", "sysfs", f"{len(devices)} {vendor} device(s) in sysfs ({how}), NUMA node(s) "
                       f"{', '.join(map(str, nodes))}")
    return Finding("warn", "sysfs", f"no {vendor} PCI device in sysfs",
                   "the host has no such card, or its PCI vendor id differs from the profile's "
                   "pci_vendor_ids (check `lspci -nn`)")


LABELS = {"ok": "[ ok  ]", "warn": "[warn ]", "error": "[error]"}


def counts(findings: list[Finding]) -> tuple[int, int]:
    return sum(f.level == "error" for f in findings), sum(f.level == "warn" for f in findings)


def format_text(findings: list[Finding], title: str) -> list[str]:
    """The doctor's text report: a title, one line per finding (+ hint), the totals."""
    lines = [title]
    for f in findings:
        lines.append(f"{LABELS[f.level]} {f.check}: {f.message}")
        if f.hint and f.level != "ok":
            lines.append(f"        hint: {f.hint}")
    errors, warns = counts(findings)
    lines.append(f"{errors} error(s), {warns} warning(s)")
    return lines


def format_json(findings: list[Finding], vendor: str | RuntimeProfile) -> dict:
    errors, warns = counts(findings)
    return {"vendor": vendor, "findings": [f.to_dict() for f in findings], "errors": errors, "warnings": warns}


def check_dtype(dtype: str | None, vendor: str | RuntimeProfile, device_module=None) -> Finding | None:
    """The precision training starts in, against what the device supports."""
    if not dtype:
        return None
    on_device = _vendor_row(vendor)["module"] is not None and device_module is not None
    if dtype == "bf16" and on_device and not DtypeGuard._bf16_supported(device_module):
        return Finding("warn", "dtype", "training asks for bf16, which this device does not support",
                       "the dtype guard starts at fp16 with a GradScaler; or pass fp16 / fp32 explicitly")
    if dtype == "fp16" and not on_device:
        return Finding("warn", "dtype", "fp16 on cpu: autocast has no useful fp16 path", "use bf16 or fp32 on cpu")
    return Finding("ok", "dtype", f"training starts in {dtype}; the dtype guard steps down on NaN/inf")


class PreflightFailed(SystemExit):
    """The job cannot do anything useful here (e.g. no usable accelerator): stop at once."""


def in_job(*, num_workers: int = 0, prefetch_factor: int = 2, batch_bytes: int = 0, dtype: str | None = None,
           progress=None, env=None, stream=None, fatal: bool = True, **checks) -> list[Finding]:
    """Preflight at job start; call it on every rank, it runs on each node's local rank 0.

    Device count: WMCTL_EXPECT_DEVICES exactly when set, else at least LOCAL_WORLD_SIZE (one
    device per local rank). Prints the findings (stderr, doctor format, one ``wmctl preflight:``
    prefix per line) and, through ``progress`` on global rank 0, one ``preflight`` progress line.
    Raises PreflightFailed only for a fatal finding (no usable device on an accelerator vendor),
    which would otherwise make the job train on the CPU or crash later; every other finding is
    advice. ``checks`` go to run_preflight (tests pass fakes).
    """
    env = os.environ if env is None else env

    def env_int(name: str) -> int | None:
        raw = (env.get(name) or "").strip()
        try:
            return int(raw) if raw else None
        except ValueError:
            return None

    if (env_int("LOCAL_RANK") or 0) != 0:
        return []
    vendor = for_job(env)
    from .protocol import ENV_EXPECT_DEVICES

    findings = run_preflight(env_int(ENV_EXPECT_DEVICES), vendor, minimum_devices=env_int("LOCAL_WORLD_SIZE"),
                             num_workers=num_workers, prefetch_factor=prefetch_factor, batch_bytes=batch_bytes,
                             **checks)
    device_module = checks.get("device_module")
    if device_module is None and not any(f.fatal for f in findings) and _vendor_row(vendor)["module"]:
        try:
            device_module = load_device_module(vendor, checks.get("import_module", importlib.import_module))
        except ImportError:
            device_module = None
    dtype_finding = check_dtype(dtype, vendor, device_module)
    if dtype_finding is not None:
        findings.append(dtype_finding)
    out = stream or sys.stderr
    host = env.get("HOSTNAME") or os.uname().nodename
    for line in format_text(findings, f"vendor {vendor.name} on {host}"):
        out.write(f"wmctl preflight: {line}\n")
    out.flush()
    if progress is not None:
        errors, warns = counts(findings)
        progress.emit("preflight", vendor=vendor.name, errors=errors, warnings=warns,
                      findings=[f.to_dict() for f in findings if f.level != "ok"])
    fatal_ones = [f for f in findings if f.fatal]
    if fatal and fatal_ones:
        f = fatal_ones[0]
        raise PreflightFailed(f"wmctl preflight: stopping: {f.message}; {f.hint}")
    return findings


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.runtime.preflight``: the doctor inside the image, without click."""
    import argparse
    import json

    from .topology import TopologyError, detect_vendor, normalise_vendor

    ap = argparse.ArgumentParser(prog="python -m orchestrator.runtime.preflight",
                                 description="Check devices, shared memory, dtype support and the vendor runtime.")
    ap.add_argument("--vendor", default=None,
                    help="vendor profile (cuda, rocm, musa, ascend, ...); default the job's, else detected from sysfs")
    ap.add_argument("--expect-devices", type=int, default=None,
                    help="devices the vendor's torch module must see (default: at least one)")
    ap.add_argument("--shm-min", default=None, metavar="SIZE", help="smallest acceptable /dev/shm, e.g. 16g")
    ap.add_argument("--num-workers", type=int, default=8, help="DataLoader workers the job will use (default 8)")
    ap.add_argument("--prefetch-factor", type=int, default=2)
    ap.add_argument("--batch-size", dest="batch_bytes", default="0", metavar="SIZE",
                    help="bytes of one batch (e.g. 64m), to size /dev/shm for workers x prefetch x batch")
    ap.add_argument("--shm-path", default="/dev/shm", help=argparse.SUPPRESS)
    ap.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = ap.parse_args(argv)
    for name in ("expect_devices", "num_workers"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be 0 or more")
    if args.prefetch_factor < 1:
        ap.error("--prefetch-factor must be at least 1")
    try:
        shm_min = parse_size(args.shm_min) if args.shm_min is not None else None
        batch = parse_size(args.batch_bytes)
    except ValueError as exc:
        ap.error(str(exc))
    source = "--vendor" if args.vendor else ENV_VENDOR
    own = from_env()
    sysfs_root = os.environ.get(ENV_SYSFS_ROOT) or "/"     # as the launcher reads it
    name = args.vendor or os.environ.get(ENV_VENDOR) or (own.name if own else "auto")
    try:
        name = detect_vendor(sysfs_root) if name.lower() == "auto" else normalise_vendor(name)
    except TopologyError as exc:
        ap.error(f"{source}: {exc}")
    findings = collect(name, args.expect_devices, num_workers=args.num_workers,
                       prefetch_factor=args.prefetch_factor, batch_bytes=batch, shm_path=args.shm_path,
                       shm_min_bytes=shm_min, sysfs_root=sysfs_root)
    if args.output == "json":
        print(json.dumps(format_json(findings, name), indent=2))
    else:
        print("\n".join(format_text(findings, f"wmctl preflight: vendor {name}")))
    return 1 if counts(findings)[0] else 0


def collect(vendor: str | RuntimeProfile, expected_devices: int | None = None, *, sysfs_root: str = "/",
            **kw) -> list[Finding]:
    """Everything the doctor reports: run_preflight plus the sysfs view of the cards."""
    findings = run_preflight(expected_devices, vendor, **kw)
    extra = sysfs_finding(vendor, sysfs_root)
    if extra is not None:
        findings.append(extra)
    return findings


if __name__ == "__main__":
    sys.exit(main())
