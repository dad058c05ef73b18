"""``wmctl doctor``: run the in-job preflight on this machine and print what it found.

torch and the vendor plugin load inside the command, never when the CLI starts. Inside an image
(no click) the same report is ``python -m orchestrator.runtime.preflight``.
"""

from __future__ import annotations

import json
import os

import click

from ..errors import MachineUnfit, OptionError


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
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--kubernetes", "kube", is_flag=True,
              help="Check a Kubernetes cluster instead of this machine: access, devices, CRDs, PodSecurity, DNS.")
@click.option("--slurm", "slurm_cluster", is_flag=True,
              help="Check a Slurm cluster from this submit host: sinfo, partition, GRES, munge, shared filesystem.")
@click.option("--context", default=None, help="kubeconfig context (with --kubernetes).")
@click.option("--kubeconfig", default=None, help="kubeconfig file(s), ':'-separated (with --kubernetes).")
@click.option("-n", "--namespace", default=None,
              help="Namespace (with --kubernetes; default: the spec's, else default).")
@click.option("--spec", "spec_path", default=None, metavar="SPEC",
              help="Job spec whose needs to check (with --kubernetes: queue, PVCs, PriorityClass, hostPath; with "
                   "--slurm: partition, nodes, GRES, checkpoint dir).")
def command(vendor: str | None, expect_devices: int | None, shm_min: str | None,
            num_workers: int, prefetch_factor: int, batch_bytes: str, shm_path: str, output: str,
            kube: bool, slurm_cluster: bool, context: str | None, kubeconfig: str | None, namespace: str | None,
            spec_path: str | None) -> None:
    """Check devices, shared memory, dtype support and the vendor runtime."""
    if slurm_cluster:
        if kube or context or kubeconfig or namespace:
            raise OptionError("--slurm goes without --kubernetes, --context, --kubeconfig and -n")
        return _slurm(vendor, spec_path, output)
    if kube:
        return _kubernetes(vendor, context, kubeconfig, namespace, spec_path, output)
    if context or kubeconfig or namespace or spec_path:
        raise OptionError("--context, --kubeconfig, -n and --spec go with --kubernetes (--spec also with --slurm)")
    # The checks and the report live in the runtime, so `python -m orchestrator.runtime.preflight`
    # (inside images, without click) says exactly what this command says.
    from ..runtime.preflight import collect, counts, format_json, format_text, parse_size
    from ..runtime.protocol import ENV_VENDOR
    from ..runtime.topology import TopologyError, detect_vendor, normalise_vendor
    from ..vendors import register_runtime_profiles

    register_runtime_profiles()      # the runtime reads no YAML: hand it every profile there is

    try:
        shm_min_bytes = parse_size(shm_min) if shm_min is not None else None
    except ValueError as exc:
        raise OptionError(f"--shm-min: {exc}") from None
    try:
        batch = parse_size(batch_bytes)
    except ValueError as exc:
        raise OptionError(f"--batch-size: {exc}") from None
    source = "--vendor" if vendor else ENV_VENDOR
    name = vendor or os.environ.get(ENV_VENDOR) or "auto"
    try:
        name = detect_vendor("/") if name.lower() == "auto" else normalise_vendor(name)
    except TopologyError as exc:
        raise OptionError(f"{source}: {exc}") from None

    findings = collect(name, expect_devices, num_workers=num_workers, prefetch_factor=prefetch_factor,
                       batch_bytes=batch, shm_path=shm_path, shm_min_bytes=shm_min_bytes)
    errors, _ = counts(findings)
    if output == "json":
        click.echo(json.dumps(format_json(findings, name), indent=2))
    else:
        for line in format_text(findings, f"wmctl doctor: vendor {name}"):
            click.echo(line)
    if errors:
        # An error, not ctx.exit(): cli.main runs click with standalone_mode=False, where
        # ctx.exit's code is returned rather than used as the exit status. Its own exit code (9):
        # the checks ran and found the machine unfit, which is neither bad input nor a wmctl bug.
        raise MachineUnfit(f"doctor found {errors} error(s); see the hints above")


def _kubernetes(vendor: str | None, context: str | None, kubeconfig: str | None, namespace: str | None,
                spec_path: str | None, output: str) -> None:
    """``doctor --kubernetes``: the cluster preflight (backends/kubernetes/doctor.py)."""
    from ..adaptors.kubernetes import load_api_client, single_try
    from ..backends.kubernetes.doctor import check_cluster, report_json
    from ..runtime.preflight import counts, format_text
    from ..specload import load_spec
    from ..vendors import load_profile

    spec = load_spec(spec_path) if spec_path else None
    name = vendor or (spec.image.vendor if spec is not None else None)
    profile = load_profile(name) if name else None
    ns = namespace or (spec.kubernetes.namespace if spec is not None else "default")
    api_client = single_try(load_api_client(context, kubeconfig))
    try:
        findings = check_cluster(api_client, ns, spec, profile)
    finally:
        api_client.close()
    errors, _ = counts(findings)
    if output == "json":
        click.echo(report_json(findings, ns))
    else:
        for line in format_text(findings, f"wmctl doctor: Kubernetes namespace {ns}"
                                + (f", vendor {profile.name}" if profile else "")):
            click.echo(line)
    if errors:
        raise MachineUnfit(f"doctor found {errors} error(s) in the cluster; see the hints above")


def _slurm(vendor: str | None, spec_path: str | None, output: str) -> None:
    """``doctor --slurm``: the Slurm preflight from the submit host (backends/slurm/doctor.py)."""
    from ..backends.slurm.doctor import check_cluster
    from ..runtime.preflight import counts, format_text
    from ..specload import load_spec
    from ..vendors import load_profile

    spec = load_spec(spec_path) if spec_path else None
    name = vendor or (spec.image.vendor if spec is not None else None)
    profile = load_profile(name) if name else None
    findings = check_cluster(spec, profile)
    errors, _ = counts(findings)
    if output == "json":
        click.echo(json.dumps({"findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        for line in format_text(findings, "wmctl doctor: Slurm" + (f", vendor {profile.name}" if profile else "")):
            click.echo(line)
    if errors:
        raise MachineUnfit(f"doctor found {errors} error(s) in the Slurm cluster; see the hints above")
