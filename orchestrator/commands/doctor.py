"""``wmctl doctor``: run the in-job preflight on this machine and print what it found.

torch and the vendor plugin load inside the command, never when the CLI starts.
"""

from __future__ import annotations

import json
import os

import click

from ..errors import WmctlError

LABELS = {"ok": "[ ok  ]", "warn": "[warn ]", "error": "[error]"}


@click.command("doctor")
@click.option("--vendor", default=None,
              help="Vendor profile (cuda, rocm, musa, ascend, ...); default $WMCTL_VENDOR, else detected from sysfs.")
@click.option("--expect-devices", type=click.IntRange(min=0), default=None,
              help="Devices the vendor's torch module must see (default: at least one).")
@click.option("--shm-min", default=None, metavar="SIZE", help="Smallest acceptable /dev/shm, e.g. 16g.")
@click.option("--num-workers", type=click.IntRange(min=0), default=8, show_default=True,
              help="DataLoader workers the job will use (sizes the /dev/shm check).")
@click.option("--prefetch-factor", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--batch-size", "batch_bytes", default="0", metavar="SIZE", show_default=True,
              help="Bytes of one batch (e.g. 64m), to size /dev/shm for workers x prefetch x batch.")
@click.option("--shm-path", default="/dev/shm", show_default=True, hidden=True)
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def command(vendor: str | None, expect_devices: int | None, shm_min: str | None,
            num_workers: int, prefetch_factor: int, batch_bytes: str, shm_path: str, output: str) -> None:
    """Check devices, shared memory, dtype support and the vendor runtime."""
    from ..runtime.preflight import Finding, parse_size, run_preflight
    from ..runtime.topology import TopologyError, detect_vendor, list_devices, normalise_vendor

    try:
        shm_min_bytes = parse_size(shm_min) if shm_min is not None else None
    except ValueError as exc:
        raise WmctlError(f"--shm-min: {exc}") from None
    try:
        batch = parse_size(batch_bytes)
    except ValueError as exc:
        raise WmctlError(f"--batch-size: {exc}") from None
    source = "--vendor" if vendor else "WMCTL_VENDOR"
    name = vendor or os.environ.get("WMCTL_VENDOR") or "auto"
    try:
        name = detect_vendor("/") if name.lower() == "auto" else normalise_vendor(name)
    except TopologyError as exc:
        raise WmctlError(f"{source}: {exc}") from None

    findings = run_preflight(expect_devices, name, num_workers=num_workers, prefetch_factor=prefetch_factor,
                             batch_bytes=batch, shm_path=shm_path, shm_min_bytes=shm_min_bytes)
    if name != "cpu":
        devices, how = list_devices(name, "/")
        nodes = sorted({d.numa_node for d in devices})
        findings.append(
            Finding("ok", "sysfs", f"{len(devices)} {name} device(s) in sysfs ({how}), NUMA node(s) "
                    f"{', '.join(map(str, nodes))}") if devices else
            Finding("warn", "sysfs", f"no {name} PCI device in sysfs",
                    "the host has no such card, or its PCI vendor id differs from the table in "
                    "orchestrator/runtime/topology.py (check `lspci -nn`)"))

    errors = sum(f.level == "error" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    if output == "json":
        click.echo(json.dumps({"vendor": name, "findings": [f.to_dict() for f in findings],
                               "errors": errors, "warnings": warns}, indent=2))
    else:
        click.echo(f"wmctl doctor: vendor {name}")
        for f in findings:
            click.echo(f"{LABELS[f.level]} {f.check}: {f.message}")
            if f.hint and f.level != "ok":
                click.echo(f"        hint: {f.hint}")
        click.echo(f"{errors} error(s), {warns} warning(s)")
    if errors:
        # An error, not ctx.exit(1): cli.main runs click with standalone_mode=False, where
        # ctx.exit's code is returned rather than used as the exit status.
        raise WmctlError(f"doctor found {errors} error(s); see the hints above")
