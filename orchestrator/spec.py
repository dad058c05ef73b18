"""The job spec's types: plain dataclasses and the limits they are checked against.

One spec runs unchanged on the local machine, a Docker host or Kubernetes. ``specload`` reads
one from YAML (``load_spec``) and either returns a complete, checked ``JobSpec`` or raises
``SpecError`` listing every problem (field path, what is wrong, how to fix it); ``speccheck``
holds those checks. Neither touches an engine.
"""

# No `from __future__ import annotations` here: loading resolves every field's type
# (validate.field_types), and resolving a string annotation compiles it, in every process that
# loads a spec. Written as objects, the annotations come with the module's cached bytecode.

import dataclasses
import hashlib
import json
import math
import posixpath
from dataclasses import field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Union

from .runtime.records import record
from .validate import parse_duration, parse_quantity

K8S_NAME_MAX = 63
AFFINITY_MODES = ("none", "numa", "exclusive")
RESERVED_VOLUME_PREFIX = "wmctl-"   # the /dev/shm and vendor driver volumes wmctl adds itself

# Upper bounds: values past them cannot be expressed by some backend, or describe no real machine.
MAX_NODES = 100_000                # Kubernetes caps an Indexed Job's parallelism at 100000
MAX_ACCELERATORS_PER_NODE = 256
MAX_PROCS_PER_NODE = 4096
MAX_CPUS = 4096
MIN_CPU = 0.001                    # 1m: the smallest CPU amount Kubernetes and Docker express
TOLERATION_OPERATORS = ("Exists", "Equal")
# apimachinery/pkg/api/validation/objectmeta.go: TotalAnnotationSizeLimitB, keys and values summed.
ANNOTATIONS_MAX_BYTES = 256 * 1024
ANNOTATIONS_WMCTL_RESERVE = 8 * 1024   # what wmctl adds itself (spec hash, cancel intent, ...)
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@record
class NfsSource:
    """An NFS export as a volume's source: the server (a host name or address) and the exported path."""

    server: str
    path: str


@record
class EmptyDirSource:
    """A scratch folder that lives as long as the node's container or pod (``Memory``: a tmpfs)."""

    medium: Literal["", "Memory"] = ""
    size_limit: Union[str, int, None] = None

    @cached_property
    def size_limit_bytes(self) -> int | None:
        return None if self.size_limit is None else parse_quantity(self.size_limit)


@record
class Volume:
    """One mount in every node: its name, where it mounts, and exactly one source."""

    name: str
    mount: str
    read_only: bool = False
    pvc: str | None = None
    host_path: str | None = None
    nfs: NfsSource | None = None
    empty_dir: EmptyDirSource | None = None
    secret: str | None = None
    config_map: str | None = None

    SOURCES = ("pvc", "host_path", "nfs", "empty_dir", "secret", "config_map")
    # Sources whose contents outlive a pod/container, so a checkpoint there survives a node.
    PERSISTENT = ("pvc", "host_path", "nfs")

    @property
    def source(self) -> str | None:
        set_ = [s for s in self.SOURCES if getattr(self, s) is not None]
        return set_[0] if len(set_) == 1 else None


@record
class ImageSpec:
    """The image the job runs in: the vendor profile, the base, what is installed, the context, the tag."""

    vendor: str = "cpu"
    base: str | None = None
    requirements: str | None = None
    context: str = "."
    tag: str | None = None
    wheelhouse: str | None = None
    system_packages: list[str] = field(default_factory=list)
    build_args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"


@record
class Resources:
    """What each node gets: CPUs, memory and /dev/shm."""

    cpu: float | None = None
    memory: Union[str, int, None] = None
    shm: Union[str, int] = "16Gi"  # the field report: 64 MB crashed the DataLoader, 16 GB fixed it

    @cached_property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_quantity(self.memory)

    @cached_property
    def shm_bytes(self) -> int:
        return parse_quantity(self.shm)


@record
class CheckpointSpec:
    """Where the job's checkpoints go, every how many steps, and how many are kept."""

    dir: str | None = None
    every_steps: int = 200
    keep: int = 3


@record
class RestartSpec:
    """How a failed attempt is retried, and the timeouts that say a node is lost or a job hangs."""

    max_attempts: int = 3
    backoff: Union[str, float] = "30s"
    exclude_failed_nodes: bool = True
    node_loss_timeout: Union[str, float] = "30s"
    heartbeat_timeout: Union[str, float] = "10m"
    # how long nodes may stay not created (a quota, PodSecurity) or not placed (Unschedulable)
    # while the cluster says why, before the attempt fails as `unschedulable`; a Job queued
    # (Kueue, Volcano) without such a reason waits as long as it takes
    pending_timeout: Union[str, float] = "30m"
    # how long a placed node may take to start its container (pull its image, create it) before
    # the attempt fails as `image_pull` with the kubelet's last cause; on Kubernetes the other
    # nodes' rendezvous waits this much longer for it (a cold 40 GB pull on a replacement node)
    image_pull_timeout: Union[str, float] = field(default="30m", metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    node_silence_timeout: Union[str, float] = "15s"   # a node's runtime beat missing this long = node lost
    auto_resume: bool = False
    retry_on_oom: bool = False
    # warm spare nodes started with each attempt: a dead node is replaced in place by one of them
    # (docs/spares.md); 0 keeps today's behaviour, a whole new attempt per failure
    spares: int = field(default=0, metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    # a spare used by an in-place recovery is replaced in the background (a new process,
    # container or pod) once the run has resumed, where the backend can start one
    replenish_spares: bool = field(default=True, metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    # a node whose time to reach the step's collective stays over straggler_ratio x the median of
    # the others for straggler_window steps is a straggler (runtime jobs that use StepTimer):
    # warn names it; replace swaps it for a warm spare at the next checkpoint (docs/spares.md)
    stragglers: str = field(default="warn", metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    straggler_ratio: float = field(default=1.3, metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    straggler_window: int = field(default=20, metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    # how long a node excluded for a lost node, a device fault or a hang is avoided by the next
    # runs on the same cluster too (Kubernetes, Slurm; `wmctl nodes`); 0 remembers nothing
    remember_exclusions: Union[str, float] = field(default="24h", metadata={"hashed_when_set": True})  # HASHED_WHEN_SET

    @cached_property
    def backoff_s(self) -> float:
        return parse_duration(self.backoff)

    @cached_property
    def node_loss_timeout_s(self) -> float:
        return parse_duration(self.node_loss_timeout)

    @cached_property
    def heartbeat_timeout_s(self) -> float:
        return parse_duration(self.heartbeat_timeout)

    @cached_property
    def pending_timeout_s(self) -> float:
        return parse_duration(self.pending_timeout)

    @cached_property
    def image_pull_timeout_s(self) -> float:
        return parse_duration(self.image_pull_timeout)

    @cached_property
    def node_silence_timeout_s(self) -> float:
        return parse_duration(self.node_silence_timeout)

    @cached_property
    def remember_exclusions_s(self) -> float:
        return parse_duration(self.remember_exclusions)


@record
class RendezvousSpec:
    """torchrun's c10d rendezvous: its port, and how long nodes wait for each other."""

    port: int = 29500
    join_timeout: Union[str, float] = "10m"   # c10d default is 600 s
    # How long a node's agent waits for the c10d store on pod 0 (torch's read_timeout, 60 s by
    # default, separate from join_timeout): a node that starts before a late pod 0 (a cold image
    # pull, a pod pending behind the last attempt's) must not give up first. None: join_timeout.
    read_timeout: Union[str, float, None] = None

    @cached_property
    def join_timeout_s(self) -> float:
        return parse_duration(self.join_timeout)

    @cached_property
    def read_timeout_s(self) -> float:
        return parse_duration(self.read_timeout) if self.read_timeout is not None else self.join_timeout_s


@record
class SecretKeyRef:
    """An env value read from a Secret by the kubelet: the token never sits in the spec or manifest."""
    secret: str
    key: str
    optional: bool = False


@record
class KubernetesSpec:
    """Where and how the job's pods run on Kubernetes."""

    namespace: str = "default"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    queue: str | None = None            # Kueue LocalQueue name
    scheduler: str | None = None        # e.g. volcano
    service_account: str | None = None
    priority_class: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    ttl_seconds_after_finished: int = 3600
    termination_grace_period: Union[str, float] = "90s"  # torchrun's own SIGTERM->SIGKILL is 30 s
    cluster_domain: str = "cluster.local"  # the rendezvous endpoint is the pod's FQDN under it
    # Pod knobs (checked in backends/kubernetes/check.py: pod_problems)
    pod_annotations: dict[str, str] = field(default_factory=dict)   # on the pods: Istio opt-out, Multus networks
    extra_resources: dict[str, str] = field(default_factory=dict)   # rdma/hca_shared_devices_a: 1, hugepages-1Gi: 8Gi
    host_network: bool = False          # hostNetwork, with dnsPolicy ClusterFirstWithHostNet
    capabilities: list[str] = field(default_factory=list)           # added to the container: IPC_LOCK, ...
    # the container's securityContext, in the API's names: runAsUser, runAsNonRoot, seccompProfile, ...
    security_context: dict[str, Any] = field(default_factory=dict, metadata={"hashed_when_set": True})
    # the pods' RuntimeClass (runtimeClassName); default: the vendor's
    runtime_class: str | None = field(default=None, metadata={"hashed_when_set": True})  # HASHED_WHEN_SET
    secret_env: dict[str, SecretKeyRef] = field(default_factory=dict)  # HF_TOKEN: {secret: hf, key: token}
    # `submit --in-cluster`: the watcher's image (wmctl installed) and ServiceAccount
    watcher_image: str | None = None
    watcher_service_account: str = "wmctl-watcher"

    @cached_property
    def termination_grace_period_s(self) -> int:
        """Whole seconds, rounded up: a fraction must never render as an immediate SIGKILL."""
        return math.ceil(parse_duration(self.termination_grace_period))


@record
class DockerSpec:
    """How the job's containers run on a Docker host."""

    network: str | None = None            # default: a private network per run
    cpusets: list[str] = field(default_factory=list)  # per node; default: split when nodes share a host
    runtime: str | None = None            # overrides the vendor profile's runtime
    # Who the containers run as: auto (the submitting user's uid:gid, so what they write to host
    # folders is the user's own; root stays root), image (the image's own USER), or UID[:GID] / NAME[:GROUP].
    user: str = "auto"



@record
class LocalSpec:
    """Settings of the local backend (processes on this machine)."""

    master_port: int | None = None        # default: a free port the OS picks (not rendezvous.port)


@record
class SlurmSpec:
    """Where and how an sbatch job asks for its nodes (checked in backends/slurm/check.py)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # Slurm's forms (MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) or a duration (90m, 24h);
    # None: the partition's default. A bare number is refused: minutes to Slurm, seconds to wmctl.
    time_limit: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    exclusive: bool | None = None         # None: whole nodes when nodes > 1
    gres: str | None = None               # NAME or NAME:TYPE, the site's; None: the vendor profile's; none: no GRES
    container: Literal["none", "pyxis", "apptainer"] = "none"
    signal_lead: Union[str, float] = "5m"  # the checkpoint signal (SIGTERM) this long before the time limit
    extra_options: list[str] = field(default_factory=list)  # --name[=value] sbatch options, checked one by one


# A JobSpec field added after specs were first hashed: left out of spec_hash while it holds its
# default, so its arrival did not change the hash (and the resume check) of any existing spec.
HASHED_WHEN_SET = "hashed_when_set"


@record
class JobSpec:
    """A job spec: what runs, on how many nodes, in which image, and how it recovers."""

    name: str
    command: list[str]
    image: ImageSpec = field(default_factory=ImageSpec)
    nodes: int = 1
    accelerators_per_node: int | None = None
    nproc_per_node: int | None = None
    resources: Resources = field(default_factory=Resources)
    volumes: list[Volume] = field(default_factory=list)
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    affinity: Union[Literal["none", "numa", "exclusive"], dict[int, str]] = "numa"
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    restart: RestartSpec = field(default_factory=RestartSpec)
    rendezvous: RendezvousSpec = field(default_factory=RendezvousSpec)
    kubernetes: KubernetesSpec = field(default_factory=KubernetesSpec)
    docker: DockerSpec = field(default_factory=DockerSpec)
    local: LocalSpec = field(default_factory=LocalSpec)
    slurm: SlurmSpec = field(default_factory=SlurmSpec, metadata={HASHED_WHEN_SET: True})

    # Set by load_spec, not by the user.
    source_dir: Path = field(default=Path("."), compare=False, repr=False, init=False)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source_dir", None)
        return data

    def spec_hash(self) -> str:
        """Stable digest of everything the user asked for (after overrides and defaults)."""
        data = _plain(self)
        data.pop("source_dir", None)
        for f in dataclasses.fields(self):
            if f.metadata.get(HASHED_WHEN_SET) and getattr(self, f.name) == type(getattr(self, f.name))():
                del data[f.name]
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section) and isinstance(data.get(f.name), dict):
                # a field added to a section later: at its default it leaves the hash as it was
                for g in dataclasses.fields(section):
                    default = g.default_factory() if g.default_factory is not dataclasses.MISSING else g.default
                    if g.metadata.get(HASHED_WHEN_SET) and getattr(section, g.name) == default:
                        data[f.name].pop(g.name, None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def context_dir(self) -> Path:
        return (self.source_dir / self.image.context).resolve()

    @property
    def wheelhouse_dir(self) -> Path | None:
        return None if self.image.wheelhouse is None else (self.source_dir / self.image.wheelhouse).resolve()

    def container_checkpoint_dir(self) -> str | None:
        """checkpoint.dir as the job inside a container sees it: relative to the working
        directory, with '.' and '..' folded, so it can be matched against volume mounts."""
        if not self.checkpoint.dir:
            return None
        return posixpath.normpath(posixpath.join(self.workdir or self.image.workdir, self.checkpoint.dir))

    def volume_for(self, path: str) -> Volume | None:
        """The volume whose mount holds ``path`` (the deepest one)."""
        best = None
        p = PurePosixPath(posixpath.normpath(path))
        for vol in self.volumes:
            m = PurePosixPath(vol.mount)
            if p == m or m in p.parents:
                if best is None or len(m.parts) > len(PurePosixPath(best.mount).parts):
                    best = vol
        return best


# Parsed values are parsed once (cached_property), the first time a renderer or the supervisor
# asks; the spec is not changed after loading except for the image pin, which parses nothing.


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` without its deep copies: the same JSON, for ``spec_hash`` (the dry run
    hashes the spec three times)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
