"""Spec -> Kubernetes objects: a headless Service, an Indexed Job, optionally a Volcano PodGroup.

The structure lives in ``templates/kubernetes/*.yaml.j2`` (users may override the folder);
this module computes every value, renders, parses the YAML back and checks the result.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from ... import __version__
from ... import labels as L
from ... import layout
from ...errors import SpecError
from ...launch import STORE_HOST_SH as STORE_HOST_ARGV_SH
from ...launch import accelerators_per_node, job_env, torchrun_args
from ...plan import AttemptContext, HostFacts, Plan, Request
from ...runtime.protocol import ENV_NODE_NAME, ENV_POD_NAME
from ...runtime.records import record
from ...spec import JobSpec, Volume
from ...templating import render_objects
from ...validate import format_quantity
from ...vendors import VendorProfile
from . import spares as sp
from .check import BASELINE_CAPABILITIES, capabilities, pod_problems, volume_problems

SHM_VOLUME = "wmctl-dshm"
DRIVER_VOLUME = "wmctl-driver-{i}"
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@record(frozen=True)
class KubernetesRequest(Request):
    """A Kubernetes plan's request: the namespace its objects go to."""

    namespace: str


def render_kubernetes(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext | None = None,
                      host: HostFacts | None = None, *, template_dir=None) -> Plan[KubernetesRequest]:
    """Nothing of the planning host goes in: the pods run on the cluster's nodes."""
    ctx = ctx or AttemptContext()
    image = spec.image.tag
    if not image:
        raise SpecError([("image.tag", "the kubernetes backend runs an image: set image.tag or pass --image")])
    problems = volume_problems(spec) + pod_problems(spec, profile.resource)
    if problems:
        raise SpecError(problems)
    digest = spec.spec_hash()
    values = kubernetes_values(spec, profile, ctx, image, digest)
    objects: list[dict[str, Any]] = []
    if values["scheduler_name"] == "volcano":
        objects += render_objects("kubernetes/podgroup.yaml.j2", values, template_dir)
    objects += render_objects("kubernetes/service.yaml.j2", values, template_dir)
    if values["spares"]:
        objects += render_objects("kubernetes/spares.yaml.j2", values, template_dir)
    objects += render_objects("kubernetes/job.yaml.j2", values, template_dir)
    check_rendered(objects, values)
    notes = list(values["notes"])
    return Plan(backend="kubernetes", run=spec.name, attempt=ctx.attempt, spec_hash=digest,
                request=KubernetesRequest(namespace=spec.kubernetes.namespace), resources=objects, notes=notes,
                context=ctx)


def kubernetes_values(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, image: str,
                      digest: str) -> dict[str, Any]:
    k = spec.kubernetes
    job_name = layout.attempt_name(spec.name, ctx.attempt)
    notes: list[str] = []
    labels = {**k.labels, **L.run_labels(spec.name, ctx.attempt)}
    annotations = {
        **k.annotations,
        L.SPEC_HASH: digest,
        L.VERSION: __version__,
    }
    if ctx.parent is not None:
        annotations[L.PARENT_ATTEMPT] = str(ctx.parent)
    if ctx.excluded_nodes:
        annotations[L.EXCLUDED_NODES] = ",".join(ctx.excluded_nodes)
    job_labels = dict(labels)
    suspend = False
    scheduler_name = k.scheduler
    pod_annotations = {**k.pod_annotations, L.SPEC_HASH: digest}
    if scheduler_name == "volcano":
        pod_annotations[L.VOLCANO_GROUP] = job_name
        notes.append(f"gang-scheduled by Volcano: PodGroup {job_name} with minMember "
                     f"{spec.nodes + spec.restart.spares}")
    elif k.queue:
        job_labels[L.KUEUE_QUEUE] = k.queue
        suspend = True   # Kueue unsuspends the Job when the queue admits it
        notes.append(f"queued in Kueue LocalQueue {k.queue!r}: the Job is created suspended until admitted")

    # The FQDN, not <job>-0.<service>: torch hosts the c10d TCPStore on the agent whose own
    # canonical name equals the endpoint host (_matches_machine_hostname). kubelet writes this
    # FQDN first in the pod's /etc/hosts, so pod 0 recognises itself without waiting for the
    # headless Service's DNS record; the short name needs DNS and races pod 0's start.
    spares = spec.restart.spares
    endpoint = f"{pod_fqdn(spec, job_name, 0)}:{spec.rendezvous.port}"
    if spares:      # the store in a pod of its own (spares.py): any node, node 0 included, may die
        endpoint = f"{sp.store_fqdn(spec, job_name)}:{spec.rendezvous.port}"
    # each node pulls the image on its own: the rendezvous waits out a peer's cold pull, which the
    # watcher bounds by restart.image_pull_timeout (issue 23 item 3)
    command = torchrun_args(spec, profile, endpoint=endpoint, rdzv_id=layout.rendezvous_id(spec.name, ctx.attempt),
                            node_rank=None, peer_start_s=spec.restart.image_pull_timeout_s, store_apart=bool(spares),
                            torchrun=sp.TORCHRUN if spares else None)
    if spec.nodes > 10:
        # torch elastic's dynamic rendezvous ranks the agents by sorting their node descriptors
        # (FQDN, pid, id: dynamic_rendezvous.py _mark_rendezvous_complete), not by --node-rank.
        notes.append(f"node ranks follow c10d's sorted host names, not the completion index (PET_NODE_RANK): pod 0 is "
                     f"rank 0, but {job_name}-10 ranks before {job_name}-2; a job that needs index = rank reads "
                     "JOB_COMPLETION_INDEX")
    if k.host_network and not spares:
        command = store_host_by_index(command)
        notes.append("host_network: pod 0 hosts the rendezvous store by its completion index (is_host), not by "
                     "its name: a hostNetwork pod's /etc/hosts is its node's, without the pod's own FQDN")
    ckpt = spec.checkpoint.dir
    env = job_env(spec, profile, ctx, checkpoint_dir=ckpt, backend_env=profile.kubernetes.env)
    _note_node_local_checkpoint(spec, ctx, notes)
    # wmctl's own values use no $(VAR) reference (the node rank comes through fieldRef), so
    # every string is escaped: Docker and local pass them literally and so must Kubernetes.
    command = sp.keeper_command(spec, job_name, command, notes) if spares else command
    command = [escape_expansion(a) for a in command]
    env_list: list[dict[str, Any]] = [{"name": n, "value": escape_expansion(v)} for n, v in env.items()]
    # torchrun reads --node-rank from PET_NODE_RANK: the completion index, no shell needed. With
    # spares the rendezvous ranks the nodes (a spare's index is past --nnodes): none is set.
    env_list += [] if spares else [
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{L.COMPLETION_INDEX_ANNOTATION}']"}}}]
    env_list += sp.pod_env() if spares else []
    env_list += [
        {"name": ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    # The kubelet reads these from the Secrets when it starts the container: no value in the spec,
    # the manifest or the run record.
    for var, ref in k.secret_env.items():
        key_ref: dict[str, Any] = {"name": ref.secret, "key": ref.key}
        if ref.optional:
            key_ref["optional"] = True
        env_list.append({"name": var, "valueFrom": {"secretKeyRef": key_ref}})
    pod_security = _pod_security_notes(spec, notes)

    volumes, mounts = _volumes(spec, profile)
    if spares:
        volume, mount = sp.files_mount()
        volume["configMap"]["name"] = sp.files_name(job_name)
        volumes.append(volume)
        mounts.append(mount)
    resources = _resources(spec, profile, notes)
    tolerations = _tolerations(spec)
    node_affinity = None
    if ctx.excluded_nodes:
        node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                  "values": list(ctx.excluded_nodes)}]}]}}
        own = [n for n in ctx.excluded_nodes if n not in ctx.remembered_nodes]   # the others: a note of their own
        if own:
            notes.append(f"excluding nodes that failed earlier attempts: {', '.join(own)}")
    grace = k.termination_grace_period_s
    return {
        **sp.spare_values(spec, job_name, ctx.attempt, labels, node_affinity),
        "job_name": job_name, "service_name": job_name, "namespace": k.namespace,
        "labels": labels, "job_labels": job_labels, "annotations": annotations,
        "pod_labels": labels, "pod_annotations": pod_annotations,
        "selector": {L.RUN: spec.name, L.ATTEMPT: str(ctx.attempt)},
        "nodes": spec.nodes, "rdzv_port": spec.rendezvous.port,
        "ttl_seconds_after_finished": k.ttl_seconds_after_finished, "suspend": suspend,
        "termination_grace_period_seconds": grace,
        "scheduler_name": scheduler_name, "volcano_queue": k.queue if scheduler_name == "volcano" else None,
        "service_account": k.service_account, "priority_class": k.priority_class,
        "image_pull_secrets": [{"name": s} for s in k.image_pull_secrets],
        "node_selector": dict(k.node_selector), "node_affinity": node_affinity,
        "tolerations": tolerations, "image": image, "command": command,
        "working_dir": spec.workdir or spec.image.workdir, "env": env_list, "resources": resources,
        "volume_mounts": mounts, "volumes": volumes, "notes": notes,
        "host_network": k.host_network, "security_context": pod_security,
        "runtime_class": k.runtime_class or profile.kubernetes.runtime_class,
    }


def pod_fqdn(spec: JobSpec, job_name: str, index: int) -> str:
    """<hostname>.<subdomain>.<namespace>.svc.<cluster domain> of an Indexed Job's pod: the Job
    controller names each pod's hostname <job>-<index>, the same as a Docker node's name."""
    return f"{job_name}-{index}.{job_name}.{spec.kubernetes.namespace}.svc.{spec.kubernetes.cluster_domain}"


# A '$' the kubelet would rewrite: before '$', before '(' and before a non-ASCII character
# (its expansion copies the byte after '$' as if it were a whole character, which splits a
# UTF-8 sequence: '$世' would arrive mangled).
_EXPANDED = re.compile(r"\$(?=[$(]|[^\x00-\x7f])")


# For hostNetwork pods: the kubelet gives them their node's /etc/hosts (pkg/kubelet/kubelet_pods.go
# ensureHostsFile: a hostNetwork pod gets the node's file, not the managed one with the pod's FQDN),
# so pod 0 cannot tell from the endpoint's name that it is the store's host. The same command runs
# in every Indexed pod: launch.STORE_HOST_SH (is_host from the completion index, PET_NODE_RANK from
# the downward API), then torchrun in its place.
STORE_HOST_SH = STORE_HOST_ARGV_SH + 'exec "$@"'


def store_host_by_index(command: list[str]) -> list[str]:
    """``command`` (torchrun's argv) run so that pod 0 hosts the c10d store by its index."""
    return ["/bin/sh", "-c", STORE_HOST_SH, "wmctl-store-host", *command]


def escape_expansion(text: str) -> str:
    """Make Kubernetes' $(VAR) expansion of command, args and env values give back ``text``.

    The kubelet turns '$$' into '$' and '$(NAME)' into NAME's value, and keeps a '$' before any
    other ASCII character or at the end. Doubling exactly the '$' it would rewrite is therefore
    exact: '$(X)' -> '$$(X)', '$$' -> '$$$', '$HOME' unchanged.
    """
    return _EXPANDED.sub("$$", text)


def _note_node_local_checkpoint(spec: JobSpec, ctx: AttemptContext, notes: list[str]) -> None:
    if not (spec.restart.auto_resume or ctx.resume) or not spec.checkpoint.dir:
        return
    if spec.nodes == 1 and not spec.restart.exclude_failed_nodes:
        return
    vol = spec.volume_for(spec.container_checkpoint_dir() or spec.checkpoint.dir)
    if vol is None or vol.host_path is None:
        return
    # Not an error: the host path may be a shared mount on every node, which wmctl cannot see.
    notes.append(f"checkpoint dir {spec.checkpoint.dir} is on host_path volume {vol.name!r} ({vol.host_path}), "
                 "which each node keeps for itself unless that path is a shared mount on every node: a resumed "
                 "attempt placed on another node would start from scratch; put the checkpoint on storage every "
                 "node sees (a pvc or nfs volume)")


def _pod_security_notes(spec: JobSpec, notes: list[str]) -> dict[str, Any] | None:
    """The container's securityContext (added capabilities), with what hostNetwork and the
    capabilities mean for the namespace's PodSecurity level and for the rendezvous."""
    k = spec.kubernetes
    if k.host_network:
        notes.append("host_network: the pods use their nodes' network (dnsPolicy ClusterFirstWithHostNet, so the "
                     f"rendezvous host still resolves through cluster DNS); port {spec.rendezvous.port} must be free "
                     "on every node, and the namespace's PodSecurity level must be privileged")
    caps = capabilities(spec)
    own = copy.deepcopy(k.security_context)     # the spec's securityContext (check.security_problems)
    if own.get("privileged") is True:
        notes.append("security_context privileged: true is beyond PodSecurity baseline: the namespace must allow "
                     "privileged pods (pod-security.kubernetes.io/enforce: privileged)")
    if not caps:
        return own or None
    beyond = [c for c in caps if c not in BASELINE_CAPABILITIES]
    if beyond:
        notes.append(f"capabilities {', '.join(beyond)} are beyond PodSecurity baseline: the namespace must allow "
                     "privileged pods (pod-security.kubernetes.io/enforce: privileged)")
    return {**own, "capabilities": {**own.get("capabilities", {}), "add": caps}}


def _resources(spec: JobSpec, profile: VendorProfile, notes: list[str]) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if spec.resources.cpu is not None:
        cpu = spec.resources.cpu
        limits["cpu"] = str(int(cpu)) if float(cpu).is_integer() else f"{int(cpu * 1000)}m"
    mem = spec.resources.memory_bytes
    shm = spec.resources.shm_bytes
    if mem is not None:
        # tmpfs pages of /dev/shm are charged to the container: the limit must hold both.
        limits["memory"] = format_quantity(mem)
        notes.append(f"memory limit {format_quantity(mem)} includes up to {format_quantity(shm)} of /dev/shm, "
                     f"leaving {format_quantity(mem - shm)} for the processes")
    else:
        notes.append(f"no memory limit: /dev/shm is bounded only by its sizeLimit {format_quantity(shm)}")
    accel = accelerators_per_node(spec, profile)
    if profile.resource and accel:
        # a Quantity is a string in the API's JSON; kubernetes 37's client refuses an int here, so
        # every accelerator job failed to submit
        limits[profile.resource] = str(accel)
    for name, qty in spec.kubernetes.extra_resources.items():
        limits[name] = qty            # a string: "1" stays a quantity for every YAML reader
    notes.append(_qos_note(spec))
    if not limits:
        return {}
    # requests == limits: Guaranteed QoS once cpu and memory are both set, so the static CPU
    # manager can give exclusive cores (device and extended resources do not count for QoS).
    return {"limits": dict(limits), "requests": dict(limits)}


def _qos_note(spec: JobSpec) -> str:
    """The pod's QoS class (core/v1 qos GetPodQOS: only cpu and memory count), said in the plan."""
    cpu, mem = spec.resources.cpu is not None, spec.resources.memory is not None
    if cpu and mem:
        return "pod QoS class: Guaranteed (cpu and memory requests equal their limits)"
    if cpu or mem:
        return (f"pod QoS class: Burstable (only {'cpu' if cpu else 'memory'} is set): no exclusive cores; set "
                "resources.cpu and resources.memory for Guaranteed")
    return ("pod QoS class: BestEffort (no cpu or memory set): first evicted under node memory pressure, no "
            "exclusive cores; set resources.cpu and resources.memory for Guaranteed")


def _tolerations(spec: JobSpec) -> list[dict[str, Any]]:
    # Rounded up: truncating 0.4s would give 0, which evicts at the first not-ready blip.
    seconds = max(1, math.ceil(spec.restart.node_loss_timeout_s))
    user = [{k: v for k, v in t.items() if v is not None} for t in spec.kubernetes.tolerations]
    user_keys = {t.get("key") for t in user}
    # The default is a 300 s toleration added by the admission plugin: a lost node would hold
    # the run for ~6 minutes before Kubernetes even deletes its pod.
    ours = [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in NODE_LOSS_TAINTS if key not in user_keys]
    return user + ours


def _volumes(spec: JobSpec, profile: VendorProfile) -> tuple[list[dict], list[dict]]:
    volumes: list[dict[str, Any]] = [{
        "name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": format_quantity(spec.resources.shm_bytes)}}]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    for vol in spec.volumes:
        volumes.append({"name": vol.name, **_volume_source(vol)})
        mount: dict[str, Any] = {"name": vol.name, "mountPath": vol.mount}
        if vol.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    # No user volume can take these names: the spec reserves the wmctl- prefix.
    for i, path in enumerate(profile.kubernetes.host_mounts):
        name = DRIVER_VOLUME.format(i=i)
        volumes.append({"name": name, "hostPath": {"path": path}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    return volumes, mounts


def _volume_source(vol: Volume) -> dict[str, Any]:
    if vol.pvc is not None:
        src: dict[str, Any] = {"claimName": vol.pvc}
        if vol.read_only:
            src["readOnly"] = True
        return {"persistentVolumeClaim": src}
    if vol.host_path is not None:
        return {"hostPath": {"path": vol.host_path, "type": "DirectoryOrCreate"}}
    if vol.nfs is not None:
        src = {"server": vol.nfs.server, "path": vol.nfs.path}
        if vol.read_only:
            src["readOnly"] = True
        return {"nfs": src}
    if vol.empty_dir is not None:
        src = {}
        if vol.empty_dir.medium:
            src["medium"] = vol.empty_dir.medium
        if vol.empty_dir.size_limit_bytes is not None:
            src["sizeLimit"] = format_quantity(vol.empty_dir.size_limit_bytes)
        return {"emptyDir": src}
    if vol.secret is not None:
        return {"secret": {"secretName": vol.secret}}
    return {"configMap": {"name": vol.config_map}}


def check_rendered(objects: list[dict[str, Any]], values: dict[str, Any]) -> None:
    """The parsed output carries exactly the values computed: a template edit cannot drop or
    mangle the command, env or mounts without this failing loudly."""
    jobs = [o for o in objects if o.get("kind") == "Job"]
    services = [o for o in objects if o.get("kind") == "Service"]
    if len(jobs) != 1 or len(services) != 1:
        kinds = [o.get("kind") for o in objects]
        raise RuntimeError(f"kubernetes templates must yield one Job and one Service, got {kinds}")
    job = jobs[0]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    expect = {
        "command": (container.get("command"), values["command"]),
        "env": (container.get("env"), values["env"]),
        "volumeMounts": (container.get("volumeMounts"), values["volume_mounts"]),
        "volumes": (pod.get("volumes"), values["volumes"]),
        "completions": (job["spec"].get("completions"), values["slots"]),
        "backoffLimit": (job["spec"].get("backoffLimit"), None if values["spares"] else 0),
        "backoffLimitPerIndex": (job["spec"].get("backoffLimitPerIndex"), 0 if values["spares"] else None),
        "maxFailedIndexes": (job["spec"].get("maxFailedIndexes"), values["spares"] or None),
        "restartPolicy": (pod.get("restartPolicy"), "Never"),
    }
    for what, (got, want) in expect.items():
        if got != want:
            raise RuntimeError(f"rendered Job {what} differs from the computed value: {got!r} != {want!r}")
    shm = [m for m in container.get("volumeMounts", []) if m.get("mountPath") == "/dev/shm"]
    if len(shm) != 1:
        raise RuntimeError("rendered Job must mount exactly one /dev/shm volume")
