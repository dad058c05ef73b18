"""Spec -> local processes: one torchrun agent per node on this machine, c10d on 127.0.0.1.

The local backend is the default that runs anywhere (a laptop, a login node, CI). Several
"nodes" on one machine get disjoint CPU sets so their ranks do not fight over cores. Pure: the
host's CPUs, interpreter, home and chosen port come in as ``HostFacts``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ... import layout
from ...launch import device_ids_per_node, job_env, split_evenly, torchrun_args
from ...plan import AttemptContext, HostFacts, Plan, Request
from ...runtime.protocol import ENV_NODE_NAME, run_checkpoint_dir
from ...runtime.records import record
from ...runtime.topology import format_cpulist
from ...spec import JobSpec
from ...vendors import VendorProfile
from ..host_paths import host_path_source

PYTHON_NAMES = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")


@record(frozen=True)
class LocalRequest(Request):
    run_dir: Path
    attempt_dir: Path
    checkpoint_dir: Path
    port: int


def local_checkpoint_dir(spec: JobSpec, home: Path | None = None) -> Path:
    """The configured checkpoint folder on this machine (the run's own root is
    ``run_checkpoint_dir`` of it, as ``job_env`` hands it to the job).

    A checkpoint dir under a host_path volume maps to that host path, so one spec serves
    containers and local runs alike; a relative dir is relative to the spec file; no dir
    means the run folder.
    """
    ckpt = spec.checkpoint.dir
    if not ckpt:
        return layout.run_dir(spec.name, home) / layout.CHECKPOINTS
    vol = spec.volume_for(ckpt)
    if vol is not None and vol.host_path is not None:
        rel = os.path.relpath(ckpt, vol.mount)
        base = host_path_source(spec, vol.host_path)
        return (base / rel).resolve() if rel != "." else base.resolve()
    path = Path(ckpt)
    return path if path.is_absolute() else (spec.source_dir / path).resolve()


def render_local(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, host: HostFacts) -> Plan[LocalRequest]:
    python = host.python
    port = host.port or spec.local.master_port or spec.rendezvous.port
    run_dir = layout.run_dir(spec.name, host.home)
    attempt_dir = layout.attempt_dir(spec.name, ctx.attempt, host.home)
    ckpt = local_checkpoint_dir(spec, host.home)
    run_ckpt = Path(run_checkpoint_dir(str(ckpt), spec.name))
    notes = [f"run folder {run_dir}", f"checkpoints in {run_ckpt}"]
    # The user's `python` is this interpreter, so the job sees the same torch and wmctl.
    command = [python if spec.command[0] in PYTHON_NAMES else spec.command[0], *spec.command[1:]]
    launcher = [python, "-m", "orchestrator.runtime.affinity"]
    cpu_sets: list[str | None] = [None] * spec.nodes
    if spec.nodes > 1 and len(host.cpus) >= spec.nodes:
        cpu_sets = [format_cpulist(c) for c in split_evenly(list(host.cpus), spec.nodes)]
        notes.append(f"{spec.nodes} agents share this machine: CPUs per agent {', '.join(map(str, cpu_sets))}")
    # Agents on one machine would each claim every accelerator; give each its own slice, as the
    # Docker plan does per container. One agent keeps the default (all devices).
    device_ids = device_ids_per_node(spec, profile) if profile.visible_devices_env and spec.nodes > 1 else None
    if device_ids:
        notes.append(f"{spec.nodes} agents share this machine: {profile.visible_devices_env} per agent "
                     f"{'; '.join(device_ids)}")
    agents: list[dict[str, Any]] = []
    for node in range(spec.nodes):
        # The visible-devices env goes in before the user's env, which may still override it.
        backend_env = {profile.visible_devices_env: device_ids[node]} \
            if device_ids and profile.visible_devices_env else None
        env = job_env(spec, profile, ctx, checkpoint_dir=str(ckpt), backend_env=backend_env)
        argv = torchrun_args(spec, profile, endpoint=f"127.0.0.1:{port}",
                             rdzv_id=layout.rendezvous_id(spec.name, ctx.attempt),
                             node_rank=node, launcher=launcher, torchrun=[python, "-m", "torch.distributed.run"],
                             command=command)
        agents.append({
            "kind": "process", "node": node, "argv": argv,
            "env": {**env, ENV_NODE_NAME: layout.local_host(node)},
            "cwd": str(spec.context_dir), "cpus": cpu_sets[node],
            "log": str(layout.node_log(spec.name, ctx.attempt, node, host.home)),
        })
    request = LocalRequest(run_dir=run_dir, attempt_dir=attempt_dir, checkpoint_dir=run_ckpt, port=port)
    return Plan(backend="local", run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(),
                request=request, resources=agents, notes=notes, context=ctx)
