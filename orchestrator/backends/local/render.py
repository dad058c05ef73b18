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
    # spare nodes (restart.spares): how many of ``resources`` are spares (the last ones), and the
    # c10d store runs in a process of its own on ``port`` (docs/spares.md)
    spares: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        if not self.spares:
            data.pop("spares")      # a plan without spares reads as it always did
        return data


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
    spares = spec.restart.spares
    slots = spec.nodes + spares        # spare nodes are the last slots: agents that wait, warm
    cpu_sets: list[str | None] = [None] * slots
    if slots > 1 and len(host.cpus) >= slots:
        cpu_sets = [format_cpulist(c) for c in split_evenly(list(host.cpus), slots)]
        notes.append(f"{slots} agents share this machine: CPUs per agent {', '.join(map(str, cpu_sets))}")
    if spares:
        notes.append(f"{spares} spare node(s) (slots {', '.join(map(str, range(spec.nodes, slots)))}) wait beside "
                     f"the job's; the c10d store runs in a process of its own on 127.0.0.1:{port}")
    # Agents on one machine would each claim every accelerator; give each its own slice, as the
    # Docker plan does per container. One agent keeps the default (all devices).
    device_ids = device_ids_per_node(spec, profile) if profile.visible_devices_env and spec.nodes > 1 else None
    if device_ids:
        notes.append(f"{spec.nodes} agents share this machine: {profile.visible_devices_env} per agent "
                     f"{'; '.join(device_ids)}")
    agents: list[dict[str, Any]] = []
    for node in range(slots):
        # The visible-devices env goes in before the user's env, which may still override it.
        backend_env = {profile.visible_devices_env: device_ids[node % spec.nodes]} \
            if device_ids and profile.visible_devices_env else None
        env = job_env(spec, profile, ctx, checkpoint_dir=str(ckpt), backend_env=backend_env)
        argv = torchrun_args(spec, profile, endpoint=f"127.0.0.1:{port}",
                             rdzv_id=layout.rendezvous_id(spec.name, ctx.attempt),
                             node_rank=None if spares else node, store_apart=bool(spares), launcher=launcher,
                             torchrun=[python, "-m", "torch.distributed.run"],
                             command=command)
        agents.append({
            "kind": "process", "node": node, "argv": argv,
            "env": {**env, ENV_NODE_NAME: layout.local_host(node)},
            "cwd": str(spec.context_dir), "cpus": cpu_sets[node],
            "log": str(layout.node_log(spec.name, ctx.attempt, node, host.home)),
            **({"spare": node >= spec.nodes} if spares else {}),
        })
    request = LocalRequest(run_dir=run_dir, attempt_dir=attempt_dir, checkpoint_dir=run_ckpt, port=port,
                           spares=spares)
    return Plan(backend="local", run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(),
                request=request, resources=agents, notes=notes, context=ctx)
