"""Spec -> local processes: one torchrun agent per node on this machine, c10d on 127.0.0.1.

The local backend is the default that runs anywhere (a laptop, a login node, CI). Several
"nodes" on one machine get disjoint CPU sets so their ranks do not fight over cores.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..launch import (device_ids_per_node, host_cpus, job_env, rendezvous_id, split_evenly,
                      torchrun_args)
from ..plan import AttemptContext, Plan
from ..runtime.topology import format_cpulist
from ..spec import JobSpec
from ..vendors import VendorProfile

PYTHON_NAMES = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")


def wmctl_home() -> Path:
    return Path(os.environ.get("WMCTL_HOME") or Path.home() / ".wmctl")


def run_dir(run: str) -> Path:
    return wmctl_home() / "runs" / run


def local_checkpoint_dir(spec: JobSpec) -> Path:
    """Where checkpoints go on this machine.

    A checkpoint dir under a host_path volume maps to that host path, so one spec serves
    containers and local runs alike; a relative dir is relative to the spec file; no dir
    means the run folder.
    """
    ckpt = spec.checkpoint.dir
    if not ckpt:
        return run_dir(spec.name) / "checkpoints"
    vol = spec.volume_for(ckpt)
    if vol is not None and vol.host_path is not None:
        rel = os.path.relpath(ckpt, vol.mount)
        base = Path(vol.host_path)
        base = base if base.is_absolute() else spec.source_dir / base
        return (base / rel).resolve() if rel != "." else base.resolve()
    path = Path(ckpt)
    return path if path.is_absolute() else (spec.source_dir / path).resolve()


def render_local(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext | None = None, *,
                 port: int | None = None, cpus: list[int] | None = None,
                 python: str | None = None) -> Plan:
    ctx = ctx or AttemptContext()
    python = python or sys.executable
    port = port or spec.local.master_port or spec.rendezvous.port
    attempt_dir = run_dir(spec.name) / f"attempt-{ctx.attempt}"
    ckpt = local_checkpoint_dir(spec)
    notes = [f"run folder {run_dir(spec.name)}", f"checkpoints in {ckpt}"]
    # The user's `python` is this interpreter, so the job sees the same torch and wmctl.
    command = [python if spec.command[0] in PYTHON_NAMES else spec.command[0], *spec.command[1:]]
    launcher = [python, "-m", "orchestrator.runtime.affinity"]
    cpu_sets: list[str | None] = [None] * spec.nodes
    if spec.nodes > 1:
        allowed = cpus if cpus is not None else host_cpus()
        if len(allowed) >= spec.nodes:
            cpu_sets = [format_cpulist(c) for c in split_evenly(allowed, spec.nodes)]
            notes.append(f"{spec.nodes} agents share this machine: CPUs per agent {', '.join(cpu_sets)}")
    # Agents on one machine would each claim every accelerator; give each its own slice, as the
    # Docker plan does per container. One agent keeps the default (all devices).
    device_ids = device_ids_per_node(spec, profile) if profile.visible_devices_env and spec.nodes > 1 else None
    if device_ids:
        notes.append(f"{spec.nodes} agents share this machine: {profile.visible_devices_env} per agent "
                     f"{'; '.join(device_ids)}")
    agents: list[dict[str, Any]] = []
    for node in range(spec.nodes):
        # The visible-devices env goes in before the user's env, which may still override it.
        backend_env = {profile.visible_devices_env: device_ids[node]} if device_ids else None
        env = job_env(spec, profile, ctx, checkpoint_dir=str(ckpt), backend_env=backend_env)
        argv = torchrun_args(spec, profile, endpoint=f"127.0.0.1:{port}", rdzv_id=rendezvous_id(spec, ctx),
                             node_rank=node, launcher=launcher, torchrun=[python, "-m", "torch.distributed.run"],
                             command=command)
        agents.append({
            "kind": "process", "node": node, "argv": argv,
            "env": {**env, "WMCTL_NODE_NAME": f"localhost-{node}"},
            "cwd": str(spec.context_dir), "cpus": cpu_sets[node],
            "log": str(attempt_dir / f"node-{node}.log"),
        })
    return Plan(backend="local", run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(),
                resources=agents, notes=notes, context=ctx,
                extra={"run_dir": str(run_dir(spec.name)), "attempt_dir": str(attempt_dir),
                       "checkpoint_dir": str(ckpt), "port": port})
