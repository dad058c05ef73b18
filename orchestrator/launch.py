"""What every backend runs in a node: the torchrun command line and the WMCTL_* environment.

Pure functions of the spec, the vendor profile and the attempt; backends only decide the
rendezvous host and the node rank's source.
"""

from __future__ import annotations

import json
import math

from .plan import AttemptContext
from .runtime import protocol as p
from .spec import JobSpec
from .vendors import VendorProfile

LAUNCHER = "wmctl-bind"   # per-rank CPU/NUMA binding, then exec of the training command

# Which node hosts the c10d store. torch decides it by matching the endpoint's name to the
# machine's own (c10d_rendezvous_backend.py _create_tcp_store: _matches_machine_hostname, unless
# rdzv-conf is_host is given), which fails where node 0 cannot tell the endpoint is itself: a
# Kubernetes hostNetwork pod (the node's /etc/hosts), a Slurm node reached at its NodeAddr. This
# POSIX shell, given torchrun's argv as its positional parameters (nothing is interpolated into it),
# adds is_host=true on node rank 0 (PET_NODE_RANK, torchrun's own variable) and is_host=false on the
# others, to torchrun's own --rdzv-conf only (a user's word after `--` is left as it is), and leaves
# the rewritten argv in "$@". Each backend that needs it runs it before torchrun: Kubernetes with
# `exec "$@"`, Slurm's node script with its own wait and exit record.
STORE_HOST_SH = (
    'h=false; [ "$PET_NODE_RANK" = 0 ] && h=true; o=1\n'
    'for a; do shift\n'
    '  if [ "$o" = 1 ]; then case $a in --) o=0 ;; --rdzv-conf=*) a="$a,is_host=$h" ;; esac; fi\n'
    '  set -- "$@" "$a"\n'
    'done\n'
)


def accelerators_per_node(spec: JobSpec, profile: VendorProfile) -> int:
    if not profile.accelerator:
        return 0
    if spec.accelerators_per_node is not None:
        return spec.accelerators_per_node
    return profile.default_accelerators_per_node


def nproc_per_node(spec: JobSpec, profile: VendorProfile) -> int:
    """One rank per accelerator; on CPU one rank per requested CPU (at least one)."""
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    accel = accelerators_per_node(spec, profile)
    if accel:
        return accel
    return max(1, int(spec.resources.cpu)) if spec.resources.cpu else 1


def device_ids_per_node(spec: JobSpec, profile: VendorProfile) -> list[str] | None:
    """Which accelerators each node sees when every node shares one host (Docker, local):
    contiguous disjoint slices ('0,1,2,3'), 'all' when one node owns the host, None without
    accelerators. One split for both backends, so a job sees the same devices on either."""
    accel = accelerators_per_node(spec, profile)
    if not profile.accelerator or not accel:
        return None
    if spec.nodes == 1:
        return ["all"]
    return [",".join(str(i) for i in range(n * accel, (n + 1) * accel)) for n in range(spec.nodes)]


def torchrun_args(spec: JobSpec, profile: VendorProfile, *, endpoint: str, rdzv_id: str, peer_start_s: float = 0.0,
                  node_rank: int | None, store_apart: bool = False, launcher: list[str] | None = None,
                  torchrun: list[str] | None = None, command: list[str] | None = None) -> list[str]:
    """The full argv: torchrun, its flags, the binding launcher, the user's command.

    ``--max-restarts=0``: the supervisor owns retries; layers that retry on their own fight.
    ``node_rank=None`` leaves it to PET_NODE_RANK in the environment (Kubernetes sets it from
    the completion index through the downward API, so no shell is needed).
    ``store_apart``: the c10d store at ``endpoint`` is a process of its own (spare nodes,
    docs/spares.md), so no agent hosts it (``is_host=false``) and no node's death takes it down.
    ``--`` ends torchrun's options: argparse looks at every word for an abbreviated option, even
    after the program, so a user's ``--n 200000`` (or ``--no``, ``--log``, ``--max``, ``--run``)
    was read as an ambiguous abbreviation of torchrun's own flags and the launch failed (exit 2).
    argparse drops the first ``--`` only (Python 3.10-3.13 alike), so a user's own ``--`` stays.
    """
    argv = list(torchrun or ["torchrun"])
    argv += [
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={nproc_per_node(spec, profile)}",
    ]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    argv += [
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        # read_timeout: the c10d store's connect and read timeout
        # (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py _create_tcp_store, 60 s by
        # default); whole seconds, at least 1, as torch's get_as_int wants.
        # peer_start_s: how much later than this node a peer may start (a backend whose nodes pull
        # the image each on their own: a replacement node's cold pull); the watcher bounds it
        # (restart.image_pull_timeout), so a rendezvous never fails for a node still pulling.
        f"--rdzv-conf=join_timeout={int(spec.rendezvous.join_timeout_s + peer_start_s)},"
        f"read_timeout={max(1, math.ceil(spec.rendezvous.read_timeout_s + peer_start_s))}"
        + (",is_host=false" if store_apart else ""),
        "--max-restarts=0",
        "--no-python",
        "--",
        *(launcher if launcher is not None else [LAUNCHER]),
        *(command if command is not None else spec.command),
    ]
    return argv


def user_program(argv: list[str]) -> str | None:
    """The user's program in an argv ``torchrun_args`` built: the word after the launcher."""
    try:
        i = argv.index(LAUNCHER)
    except ValueError:
        return None
    return argv[i + 1] if i + 1 < len(argv) else None


def affinity_value(spec: JobSpec) -> str:
    if isinstance(spec.affinity, dict):
        return json.dumps({str(k): v for k, v in sorted(spec.affinity.items())}, sort_keys=True)
    return spec.affinity


def job_env(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, *,
            checkpoint_dir: str | None, backend_env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every node: profile env, wmctl's contract with the runtime, then the user's.

    The user's env comes last so it can override profile defaults (e.g. NCCL_DEBUG), but the
    WMCTL_* names are reserved (the spec loader rejects them in ``env``).
    """
    env: dict[str, str] = {}
    env.update(profile.env)
    env.update(backend_env or {})
    env.update({
        p.ENV_RUN: spec.name,
        p.ENV_ATTEMPT: str(ctx.attempt),
        # The checkpoint marker records it: a resume under a changed spec is warned about.
        p.ENV_SPEC_HASH: spec.spec_hash(),
        p.ENV_VENDOR: profile.name,
        # The runtime part of the profile itself: the job needs no copy of images/ (and no YAML
        # parser) to know its vendor, so a vendor unknown to the image's wmctl still works.
        p.ENV_VENDOR_PROFILE: profile.runtime_profile().to_json(),
        p.ENV_TORCH_MODULE: profile.torch_module,
        p.ENV_DIST_BACKEND: profile.dist_backend,
        p.ENV_AFFINITY: affinity_value(spec),
        p.ENV_CHECKPOINT_EVERY: str(spec.checkpoint.every_steps),
        p.ENV_CHECKPOINT_KEEP: str(max(2, spec.checkpoint.keep)),
        p.ENV_RESUME: "1" if (ctx.resume or ctx.attempt > 0) else "0",
        "PYTHONUNBUFFERED": "1",
    })
    if spec.restart.spares:
        # Round 0 of the attempt; each in-place recovery raises it (docs/spares.md, fencing).
        env[p.ENV_FENCE_EPOCH] = str(fence_epoch(ctx.attempt, 0))
    if checkpoint_dir:
        # Each run checkpoints into its own subfolder of the configured one, so two runs given
        # the same checkpoint.dir never resume from (or prune) each other's checkpoints.
        env[p.ENV_CHECKPOINT_DIR] = p.run_checkpoint_dir(checkpoint_dir, spec.name)
    if ctx.resume_from:
        env[p.ENV_RESUME_FROM] = ctx.resume_from
    # The in-job preflight checks each node sees the cards the spec asked for, not merely one
    # per local rank: a node that lost a card but still has enough for its ranks is caught.
    devices = accelerators_per_node(spec, profile)
    if devices > 0:
        env[p.ENV_EXPECT_DEVICES] = str(devices)
    env.update(spec.env)
    return env


def fence_epoch(attempt: int, round_: int) -> int:
    """The fencing epoch of round ``round_`` of ``attempt`` (round 0: as submitted; each in-place
    recovery opens the next): later rounds and later attempts always compare greater."""
    return attempt * p.EPOCHS_PER_ATTEMPT + round_


def split_evenly(items: list, parts: int) -> list[list]:
    """Split ``items`` into ``parts`` contiguous, disjoint, near-equal chunks."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(items[start:start + n])
        start += n
    return out
