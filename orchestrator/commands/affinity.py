"""``wmctl affinity``: print the per-rank CPU/NUMA binding plan the launcher would apply here."""

from __future__ import annotations

import json

import click

from ..errors import OptionError


@click.command("affinity")
@click.option("--nproc", type=click.IntRange(min=1), required=True, help="Ranks on this machine (nproc_per_node).")
@click.option("--mode", default="numa", show_default=True,
              help="none, numa, exclusive, or a JSON map like '{\"0\": \"0-15\", \"1\": \"16-31\"}'.")
@click.option("--vendor", default="auto", show_default=True,
              help="Vendor profile name (see images/ and WMCTL_VENDOR_PATH) or auto.")
@click.option("--sysfs-root", default="/", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="Read the topology below this folder (a copy of another machine's /sys and /proc).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def command(nproc: int, mode: str, vendor: str, sysfs_root: str, output: str) -> None:
    """Print the per-rank CPU/NUMA binding plan for this machine."""
    from ..runtime.affinity import AffinityError, plan_binding
    from ..runtime.topology import TopologyError, format_cpulist, read_topology
    from ..vendors import register_runtime_profiles

    register_runtime_profiles()      # the runtime reads no YAML: hand it every profile there is

    try:
        topo = read_topology(vendor, sysfs_root)
        plan = plan_binding(topo, nproc, mode)
    except TopologyError as exc:
        raise OptionError(f"--vendor: {exc}") from None
    except AffinityError as exc:
        raise OptionError(f"--mode/--nproc: {exc.message}", hint=exc.hint) from None

    if output == "json":
        data = plan.to_dict()
        data["vendor"] = topo.vendor
        data["device_source"] = topo.device_source
        data["devices"] = [{"bdf": d.bdf, "numa_node": d.numa_node} for d in topo.devices]
        data["numa_nodes"] = {str(n): format_cpulist(c) for n, c in sorted(topo.node_cpus.items())}
        click.echo(json.dumps(data, indent=2))
        return

    nodes = ", ".join(f"{n}: {format_cpulist(c)}" for n, c in sorted(topo.node_cpus.items())) or "none"
    click.echo(f"vendor: {topo.vendor}   devices: {len(topo.devices)}"
               f"{f' (from {topo.device_source})' if topo.device_source else ''}")
    click.echo(f"allowed CPUs: {format_cpulist(topo.allowed)}   NUMA nodes: {nodes}")
    click.echo(f"mode: {plan.mode}" + (f" (asked: {plan.requested})" if plan.mode != plan.requested else ""))
    rows = [("LOCAL_RANK", "DEVICE", "NUMA", "CPUS", "COUNT", "THREADS")]
    for r in plan.ranks:
        rows.append((str(r.local_rank), r.device or "-", "-" if r.numa_node is None else str(r.numa_node),
                     format_cpulist(r.cpus), str(len(r.cpus)), str(r.threads)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for note in (*topo.notes, *plan.notes):
        click.echo(f"note: {note}")
