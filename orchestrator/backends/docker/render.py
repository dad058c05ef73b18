"""Spec -> Docker: one private network and one container per node on one Docker host.

Each container is described with the Docker SDK's ``containers.create`` keyword names (mounts,
device requests and ulimits in Engine API form), plus the equivalent ``docker run`` command
line, quoted, for review and for users who want to run it by hand.
"""

from __future__ import annotations

import copy
import shlex

from typing import Any


from ... import labels as L
from ... import layout
from ...errors import SpecError
from ...launch import accelerators_per_node, device_ids_per_node, job_env, split_evenly, torchrun_args
from ...plan import AttemptContext, HostFacts, Plan, Request
from ...runtime.protocol import ENV_LOCAL_TAG, ENV_NODE_NAME
from ...runtime.records import record
from ...runtime.topology import format_cpulist
from ...spec import JobSpec
from ...vendors import VendorProfile
from ..host_paths import host_path_source
from . import spares as S


@record(frozen=True)
class DockerRequest(Request):
    network: str
    # spare nodes (restart.spares): how many of the slot containers are spares (the last ones);
    # the c10d store runs in a container of its own (docs/spares.md)
    spares: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        if not self.spares:
            data.pop("spares")      # a plan without spares reads as it always did
        return data


def render_docker(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, host: HostFacts) -> Plan[DockerRequest]:
    image = spec.image.tag
    if not image:
        raise SpecError([("image.tag", "the docker backend runs an image: set image.tag or pass --image")])
    job_name = layout.attempt_name(spec.name, ctx.attempt)
    network = spec.docker.network or job_name
    notes: list[str] = []
    spares = spec.restart.spares
    slots = spec.nodes + spares        # spare nodes are the last slots: containers whose keeper waits, warm
    cpusets = _cpusets(spec, list(host.cpus), notes, slots)
    device_ids = _device_ids(spec, profile, notes, slots)
    store = S.store_name(spec.name, ctx.attempt)
    endpoint = f"{store if spares else layout.node_name(spec.name, ctx.attempt, 0)}:{spec.rendezvous.port}"
    command = torchrun_args(spec, profile, endpoint=endpoint, rdzv_id=layout.rendezvous_id(spec.name, ctx.attempt),
                            node_rank=None, store_apart=bool(spares),
                            torchrun=[S.PYTHON_WORD, "-m", "torch.distributed.run"] if spares else None)
    mounts, volumes_to_create = _mounts(spec, profile)
    if spares:
        notes.append(f"{spares} spare node(s) (slots {', '.join(map(str, range(spec.nodes, slots)))}) wait beside the "
                     f"job's, each container running wmctl's keeper (runtime/keeper.py, mounted read-only); the c10d "
                     f"store runs in a container of its own, {store}:{spec.rendezvous.port}")
    resources: list[dict[str, Any]] = []
    if spec.docker.network is None:
        resources.append({"kind": "network", "name": network, "driver": "bridge",
                          "labels": L.run_labels(spec.name, ctx.attempt)})
    resources += volumes_to_create
    grace = spec.kubernetes.termination_grace_period_s
    user = container_user(spec, host, notes)
    if spares:
        store_env = {"PYTHONUNBUFFERED": "1", **({"HOME": "/tmp"} if user is not None and spec.docker.user == "auto"
                                                 else {})}
        apart = S.store_container(spec.name, ctx.attempt, image=image, port=spec.rendezvous.port, network=network,
                                  user=user, env=store_env, spec_hash=spec.spec_hash())
        resources.append({"kind": "store", "aliases": [store], "create": apart,
                          "docker_run": docker_run_line(apart, [store])})
    for node in range(slots):
        name = layout.node_name(spec.name, ctx.attempt, node)
        labels = {**L.run_labels(spec.name, ctx.attempt), L.NODE: str(node), L.NODES: str(slots),
                  L.SPEC_HASH: spec.spec_hash()}
        if ctx.parent is not None:
            labels[L.PARENT_ATTEMPT] = str(ctx.parent)
        if ctx.excluded_nodes:
            labels[L.EXCLUDED_NODES] = ",".join(ctx.excluded_nodes)
        backend_env = dict(profile.docker.env)
        if user is not None and spec.docker.user == "auto":
            # a uid with no passwd entry in the image gets HOME=/, which it cannot write (caches)
            backend_env["HOME"] = "/tmp"
        # With --gpus the NVIDIA toolkit sets its own visible-devices env from DeviceIDs.
        if profile.docker.visible_devices_env and device_ids is not None and not profile.docker.device_requests:
            backend_env[profile.docker.visible_devices_env] = device_ids[node]
        env = job_env(spec, profile, ctx, checkpoint_dir=spec.checkpoint.dir, backend_env=backend_env)
        if spares:
            # c10d gives node ranks in each round; the keeper finds its torchrun and workers by this tag
            env[ENV_LOCAL_TAG] = name
        else:
            env["PET_NODE_RANK"] = str(node)
        env[ENV_NODE_NAME] = name
        create: dict[str, Any] = {
            "name": name, "image": image, "command": S.keeper_command(node, command) if spares else command,
            "hostname": name, "environment": env, "labels": labels, "working_dir": spec.workdir or spec.image.workdir,
            "shm_size": spec.resources.shm_bytes,
            "mounts": [*mounts, *S.mounts(spec.name, ctx.attempt, host.home)] if spares else mounts,
            "network": network, "stop_signal": "SIGTERM", "stop_timeout": grace,
        }
        if user is not None:
            create["user"] = user
        if spec.resources.memory_bytes is not None:
            create["mem_limit"] = spec.resources.memory_bytes
        if spec.resources.cpu is not None and not cpusets:
            create["nano_cpus"] = int(spec.resources.cpu * 1e9)
        if cpusets:
            create["cpuset_cpus"] = cpusets[node]
        _device_exposure(create, profile, device_ids[node] if device_ids else None,
                         accelerators_per_node(spec, profile))
        # Containers share the command, mounts and profile lists; copies keep each container's
        # description its own (and the YAML plan free of &id001 anchors).
        create = copy.deepcopy(create)
        resources.append({"kind": "container", "node": node, "aliases": [name], "create": create,
                          "docker_run": docker_run_line(create, [name]),
                          **({"spare": node >= spec.nodes} if spares else {})})
    return Plan(backend="docker", run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(),
                request=DockerRequest(network=network, spares=spares), resources=resources, notes=notes, context=ctx)


def container_user(spec: JobSpec, host: HostFacts, notes: list[str]) -> str | None:
    """``--user`` for the containers: the submitting user's uid:gid under ``docker.user: auto``
    (root, a remote engine and rootless/userns-remapped engines give no host user: the image's own
    user runs), the spec's value when set, None for ``image``."""
    if spec.docker.user == "image":
        return None
    if spec.docker.user != "auto":
        return spec.docker.user
    if host.user is None:
        return None
    uid, gid = host.user
    notes.append(f"containers run as uid {uid} gid {gid} (you), so what they write to host folders is yours; "
                 "docker.user: image keeps the image's own user")
    return f"{uid}:{gid}"


def _cpusets(spec: JobSpec, cpus: list[int], notes: list[str], slots: int) -> list[str]:
    """CPUs per slot container (nodes, then spares). With spares, explicit docker.cpusets name the
    nodes' and may name the spares' too; a spare without one of its own, or a host with fewer CPUs
    than slots, shares a node's (listed in a note)."""
    if spec.docker.cpusets:
        given = list(spec.docker.cpusets)
        return [given[i % len(given)] for i in range(slots)] if slots > len(given) else given
    if slots == 1:
        return []
    if len(cpus) < spec.nodes:
        raise SpecError([("nodes", f"{spec.nodes} nodes share one Docker host with only {len(cpus)} CPUs; "
                          "lower nodes or give docker.cpusets explicitly")])
    if len(cpus) < slots:      # spares beyond the CPUs: each shares the CPUs of a node
        parts = [format_cpulist(c) for c in split_evenly(cpus, spec.nodes)]
        parts += [parts[i % spec.nodes] for i in range(spec.nodes, slots)]
        notes.append(f"{spec.nodes} nodes and {slots - spec.nodes} spare(s) share one Docker host with {len(cpus)} "
                     f"CPUs: CPUs per slot {', '.join(parts)} (a spare shares a node's)")
        return parts
    parts = [format_cpulist(c) for c in split_evenly(cpus, slots)]
    what = "node" if slots == spec.nodes else "slot (nodes, then spares)"
    notes.append(f"{slots} {'nodes' if slots == spec.nodes else 'slots'} share one Docker host: "
                 f"CPUs split per {what} as {', '.join(parts)}")
    return parts


def _device_ids(spec: JobSpec, profile: VendorProfile, notes: list[str], slots: int) -> list[str] | None:
    """Which accelerators each slot container sees; 'all' when one node owns the host (and has no
    spare); a spare gets a slice of its own, as a node does."""
    if slots == spec.nodes:
        ids = device_ids_per_node(spec, profile)
    else:
        accel = accelerators_per_node(spec, profile)
        ids = None if not profile.accelerator or not accel else \
            [",".join(str(i) for i in range(n * accel, (n + 1) * accel)) for n in range(slots)]
    if ids is not None and slots > 1:
        notes.append(f"{slots} {'nodes' if slots == spec.nodes else 'slots'} share one Docker host: "
                     f"accelerators split per {'node' if slots == spec.nodes else 'slot'} as {'; '.join(ids)}")
    return ids


def _device_exposure(create: dict[str, Any], profile: VendorProfile, ids: str | None, accel: int) -> None:
    d = profile.docker
    if ids is None:
        return
    if d.device_requests:
        reqs = []
        for r in d.device_requests:
            req: dict[str, Any] = {"Driver": r.driver, "Capabilities": r.capabilities}
            if ids == "all":
                req["Count"] = -1
            else:
                req["DeviceIDs"] = ids.split(",")
            reqs.append(req)
        create["device_requests"] = reqs
    if d.runtime:
        create["runtime"] = d.runtime
    devices = list(d.devices)
    index_list = list(range(accel)) if ids == "all" else [int(i) for i in ids.split(",")]
    for pattern in d.per_device:
        devices += [pattern.format(i=i) for i in index_list]
    if devices:
        create["devices"] = [f"{p}:{p}:rwm" for p in devices]
    for key, attr in (("group_add", "group_add"), ("security_opt", "security_opt"), ("cap_add", "cap_add")):
        if getattr(d, attr):
            create[key] = list(getattr(d, attr))
    if d.ulimits:
        create["ulimits"] = [{"Name": k, "Soft": v, "Hard": v} for k, v in sorted(d.ulimits.items())]
    for path in d.mounts:
        create["mounts"] = create["mounts"] + [{"Target": path, "Source": path, "Type": "bind", "ReadOnly": True}]


def _mounts(spec: JobSpec, profile: VendorProfile) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for i, vol in enumerate(spec.volumes):
        kind = vol.source
        if kind == "host_path" and vol.host_path is not None:
            src = str(host_path_source(spec, vol.host_path))
            mounts.append({"Target": vol.mount, "Source": src, "Type": "bind", "ReadOnly": vol.read_only})
        elif kind == "pvc":
            # A named Docker volume stands in for a PVC: it outlives containers, like a PVC.
            mounts.append({"Target": vol.mount, "Source": vol.pvc, "Type": "volume", "ReadOnly": vol.read_only})
            volumes.append({"kind": "volume", "name": vol.pvc, "driver": "local", "driver_opts": {}})
        elif kind == "nfs" and vol.nfs is not None:
            name = f"{spec.name}-{vol.name}"
            opts = {"type": "nfs", "o": f"addr={vol.nfs.server}" + (",ro" if vol.read_only else ""),
                    "device": f":{vol.nfs.path}"}
            mounts.append({"Target": vol.mount, "Source": name, "Type": "volume", "ReadOnly": vol.read_only})
            volumes.append({"kind": "volume", "name": name, "driver": "local", "driver_opts": opts})
        elif kind == "empty_dir" and vol.empty_dir is not None:
            if vol.empty_dir.medium == "Memory":
                m: dict[str, Any] = {"Target": vol.mount, "Type": "tmpfs"}
                if vol.empty_dir.size_limit is not None:
                    m["TmpfsOptions"] = {"SizeBytes": vol.empty_dir.size_limit_bytes}
                mounts.append(m)
            else:
                mounts.append({"Target": vol.mount, "Type": "volume", "ReadOnly": False})
        else:
            raise SpecError([(f"volumes[{i}]", f"{kind} volumes exist only on Kubernetes; use host_path on Docker")])
    return mounts, volumes


# create key -> the `docker run` flag repeated once per item
_REPEATED_FLAGS = (("devices", "--device"), ("group_add", "--group-add"), ("security_opt", "--security-opt"),
                   ("cap_add", "--cap-add"))


def _mount_flag(m: dict[str, Any]) -> list[str]:
    if m["Type"] == "tmpfs":
        size = m.get("TmpfsOptions", {}).get("SizeBytes")
        return ["--tmpfs", m["Target"] + (f":size={size}" if size else "")]
    if m["Type"] == "volume" and "Source" not in m:
        return ["-v", m["Target"]]
    return ["-v", f"{m['Source']}:{m['Target']}" + (":ro" if m.get("ReadOnly") else "")]


def docker_bytes(n: int) -> str:
    """A size the docker CLI reads (go-units RAMInBytes: binary b/k/m/g, case-insensitive): 1g,
    512m or plain bytes. A Kubernetes quantity (1Gi) is refused by `docker run`."""
    for unit, factor in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def docker_run_line(create: dict[str, Any], aliases: list[str]) -> str:
    """The equivalent ``docker run`` command, every value shell-quoted."""
    argv = ["docker", "run", "-d", "--name", create["name"], "--hostname", create["hostname"],
            "--network", create["network"]]
    for a in aliases:
        argv += ["--network-alias", a]
    if create.get("user"):
        argv += ["--user", create["user"]]
    argv += ["--shm-size", docker_bytes(create["shm_size"])]
    if "mem_limit" in create:
        argv += ["--memory", docker_bytes(create["mem_limit"])]
    if "cpuset_cpus" in create:
        argv += ["--cpuset-cpus", create["cpuset_cpus"]]
    if "nano_cpus" in create:
        argv += ["--cpus", f"{create['nano_cpus'] / 1e9:g}"]
    for req in create.get("device_requests", []):
        argv += ["--gpus", "all" if req.get("Count") == -1 else f"\"device={','.join(req['DeviceIDs'])}\""]
    if create.get("runtime"):
        argv += ["--runtime", create["runtime"]]
    for key, flag in _REPEATED_FLAGS:
        for item in create.get(key, []):
            argv += [flag, item]
    for u in create.get("ulimits", []):
        argv += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    for m in create["mounts"]:
        argv += _mount_flag(m)
    for k, v in create["environment"].items():
        argv += ["-e", f"{k}={v}"]
    for k, v in create["labels"].items():
        argv += ["--label", f"{k}={v}"]
    argv += ["-w", create["working_dir"], "--stop-timeout", str(create["stop_timeout"]), create["image"]]
    argv += list(create["command"])
    return shlex.join(argv)


