"""The job spec: plain dataclasses, loaded from YAML, validated with errors that name the field.

One spec runs unchanged on the local machine, a Docker host or Kubernetes. Loading never
touches an engine; ``load_spec`` either returns a complete, checked ``JobSpec`` or raises
``SpecError`` listing every problem (field path, what is wrong, how to fix it).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import posixpath
import re
import typing
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Union

from . import imageref
from .errors import SpecError
from .validate import INT32_MAX, Invalid, Problems, build, join, parse_duration, parse_quantity

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CPULIST = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")
K8S_NAME_MAX = 63
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The same alphabet dockerfile.check_image_path enforces at build time; checked at load so a
# spec that renders also builds (tests/unit/test_spec.py keeps the two in step).
IMAGE_PATH = re.compile(r"^/[A-Za-z0-9._\-/]*$")
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
# An NFS server is a host name or an address: a comma would add Docker mount options (rw,exec,suid).
NFS_SERVER = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                        r"[A-Za-z0-9])?)*\.?|[0-9A-Fa-f:.]+|\[[0-9A-Fa-f:.]+\])$")
# Env names that usually hold credentials: plain values there end up in manifests and `docker inspect`.
SECRET_ENV = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)($|_)|"
                        r"_KEY$", re.IGNORECASE)
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass
class NfsSource:
    server: str
    path: str


@dataclass
class EmptyDirSource:
    medium: Literal["", "Memory"] = ""
    size_limit: Union[str, int, None] = None

    @cached_property
    def size_limit_bytes(self) -> int | None:
        return None if self.size_limit is None else parse_quantity(self.size_limit)


@dataclass
class Volume:
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


@dataclass
class ImageSpec:
    vendor: str = "cpu"
    base: str | None = None
    requirements: str | None = None
    context: str = "."
    tag: str | None = None
    wheelhouse: str | None = None
    system_packages: list[str] = field(default_factory=list)
    build_args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"


@dataclass
class Resources:
    cpu: float | None = None
    memory: Union[str, int, None] = None
    shm: Union[str, int] = "16Gi"  # the field report: 64 MB crashed the DataLoader, 16 GB fixed it

    @cached_property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_quantity(self.memory)

    @cached_property
    def shm_bytes(self) -> int:
        return parse_quantity(self.shm)


@dataclass
class CheckpointSpec:
    dir: str | None = None
    every_steps: int = 200
    keep: int = 3


@dataclass
class RestartSpec:
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


@dataclass
class RendezvousSpec:
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


@dataclass
class SecretKeyRef:
    """An env value read from a Secret by the kubelet: the token never sits in the spec or manifest."""
    secret: str
    key: str
    optional: bool = False


@dataclass
class KubernetesSpec:
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
    secret_env: dict[str, SecretKeyRef] = field(default_factory=dict)  # HF_TOKEN: {secret: hf, key: token}
    # `submit --in-cluster`: the watcher's image (wmctl installed) and ServiceAccount
    watcher_image: str | None = None
    watcher_service_account: str = "wmctl-watcher"

    @cached_property
    def termination_grace_period_s(self) -> int:
        """Whole seconds, rounded up: a fraction must never render as an immediate SIGKILL."""
        return math.ceil(parse_duration(self.termination_grace_period))


@dataclass
class DockerSpec:
    network: str | None = None            # default: a private network per run
    cpusets: list[str] = field(default_factory=list)  # per node; default: split when nodes share a host
    runtime: str | None = None            # overrides the vendor profile's runtime
    # Who the containers run as: auto (the submitting user's uid:gid, so what they write to host
    # folders is the user's own; root stays root), image (the image's own USER), or UID[:GID] / NAME[:GROUP].
    user: str = "auto"


DOCKER_USER = re.compile(r"(\d{1,10}|[a-z_][a-z0-9_-]{0,31})(:(\d{1,10}|[a-z_][a-z0-9_-]{0,31}))?")


@dataclass
class LocalSpec:
    master_port: int | None = None        # default: a free port the OS picks (not rendezvous.port)


@dataclass
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


@dataclass
class JobSpec:
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
        data = self.to_dict()
        for f in dataclasses.fields(self):
            if f.metadata.get(HASHED_WHEN_SET) and getattr(self, f.name) == type(getattr(self, f.name))():
                del data[f.name]
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section) and isinstance(data.get(f.name), dict):
                # a field added to a section later: at its default it leaves the hash as it was
                for g in dataclasses.fields(section):
                    if g.metadata.get(HASHED_WHEN_SET) and getattr(section, g.name) == g.default:
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

# ---- loading ---------------------------------------------------------------------------------

def load_spec(path: str | Path, overrides: dict[str, Any] | None = None,
              profile_names: list[str] | None = None) -> JobSpec:
    """Read, override, validate. Raises SpecError with every problem found."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([("(file)", f"{path} does not exist; pass the path of a job spec YAML file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("(file)", f"cannot read {path}: {exc}")]) from None
    spec = parse_spec(text, overrides, source_dir=path.resolve().parent, profile_names=profile_names,
                      origin=str(path))
    return spec


def parse_spec(text: str, overrides: dict[str, Any] | None = None, *, source_dir: Path = Path("."),
               profile_names: list[str] | None = None, origin: str = "<spec>") -> JobSpec:
    from .yamlsafe import YamlProblem, load_with_text

    try:
        data, written = load_with_text(text)
    except YamlProblem as exc:
        where = f" at {exc.where}" if exc.where else ""
        raise SpecError([("(file)", f"{origin} is not a valid job spec{where}: {exc.problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([("(top level)", "a job spec is a mapping (name: ..., command: [...]); got "
                          f"{type(data).__name__}")])
    _keep_written_text(data, written)
    data = apply_overrides(data, overrides or {})
    return from_dict(data, source_dir=source_dir, profile_names=profile_names)


@lru_cache(maxsize=None)
def _text_maps(cls: type, prefix: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    """Paths of the spec's string-to-string maps (env, labels, build args, ...)."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is dict and typing.get_args(tp) == (str, str):
            out.append(prefix + (f.name,))
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += _text_maps(tp, prefix + (f.name,))
    return tuple(out)


def _keep_written_text(data: dict[str, Any], written: dict[tuple[Any, ...], str]) -> None:
    """A map of strings gets an unquoted value as the user wrote it: YAML 1.1 reads ``010`` as 8,
    ``yes`` as true and ``1.50`` as 1.5, and an env value the program reads as 8 or "True" is
    not the one in the spec."""
    for path in _text_maps(JobSpec):
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            for key, value in node.items():
                text = written.get(path + (key,))
                if text is not None and not isinstance(value, str):
                    node[key] = text


def from_dict(data: dict[str, Any], *, source_dir: Path = Path("."),
              profile_names: list[str] | None = None) -> JobSpec:
    problems: Problems = []
    spec = build(JobSpec, data, "", problems)
    if spec is None:
        raise SpecError(problems or [("(top level)", "invalid spec")])
    spec.source_dir = source_dir
    structural = bool(problems)
    try:
        check(spec, problems, profile_names)
    except (TypeError, AttributeError, ValueError):
        # A field that already failed conversion is None; report the problems found so far
        # rather than cross-field checks computed from values the user did not give.
        if not structural:
            raise
    if problems:
        raise SpecError(problems)
    return spec


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"nodes": 4, "image.tag": "x"}`` -> a deep copy of ``data`` with those paths set."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = data
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise SpecError([(dotted, f"cannot set {dotted}: {part} is not a mapping")])
            node = nxt
        node[parts[-1]] = value
    return data


def parse_set_flags(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--set key.path=value`` flags -> overrides; values are YAML scalars/lists (``--set nodes=4``)."""
    from .yamlsafe import YamlProblem, load

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
            raise SpecError([("--set", f"{item!r} is not KEY=VALUE with a dotted key, e.g. --set resources.shm=32Gi")])
        if tuple(key.split(".")[:-1]) in _text_maps(JobSpec):
            out[key] = raw      # an env value, a label: the text as given (`--set env.MODE=010`)
            continue
        try:
            out[key] = load(raw) if raw.strip() else ""
        except YamlProblem:
            out[key] = raw
    return out


# ---- the host -------------------------------------------------------------------------------------

def folder_problem(path: Path) -> str | None:
    """Why ``path`` is not a folder this process can use, or None. Never raises: a name too long
    or a permission error is an answer too."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{str(path)[:120]} cannot be read: {exc.strerror or exc}"
    return None if stat.S_ISDIR(mode) else f"{path} is a file, not a folder"


def context_problems(spec: JobSpec) -> Problems:
    """The local backend runs the job in image.context, and build-image sends it to the engine."""
    why = folder_problem(spec.context_dir)
    if why is None:
        return []
    return [("image.context", f"{why}; set image.context to the folder with your training code "
             "(relative to the spec file)")]


# ---- cross-field checks ------------------------------------------------------------------------

def profile_problems(spec: JobSpec, profile: Any) -> Problems:
    """What the spec asks that its vendor's profile cannot give."""
    if not profile.accelerator and spec.accelerators_per_node:
        return [("accelerators_per_node", f"the {profile.name} vendor has no accelerators to give "
                 f"({spec.accelerators_per_node} asked); drop accelerators_per_node, or set image.vendor to the "
                 "accelerator's vendor (cuda, rocm, musa, ascend, ...)")]
    return []


def warnings(spec: JobSpec) -> list[str]:
    """Legal but probably unwise: said once, on stderr, at load."""
    secret = sorted(k for k, v in spec.env.items() if v and SECRET_ENV.search(str(k)))
    if not secret:
        return []
    return [f"env {', '.join(secret)} look like credentials: plain env values are visible in the rendered "
            "plan, `docker inspect` and the pod spec; on Kubernetes keep them in a Secret and name it in "
            "kubernetes.secret_env (e.g. HF_TOKEN: {secret: hf, key: token}) or mount it as a `secret` volume"]


def check(spec: JobSpec, problems: Problems, profile_names: list[str] | None = None) -> None:
    """Catch real mistakes before anything is submitted."""
    _check_name(spec, problems)
    _check_image(spec, problems, profile_names)
    _check_command(spec, problems)
    _check_resources(spec, problems)
    _check_volumes(spec, problems)
    _check_env(spec, problems)
    _check_workdir(spec, problems)
    _check_affinity(spec, problems)
    _check_lifecycle(spec, problems)
    _check_kubernetes(spec, problems)
    _check_docker(spec, problems)


def _check_image(spec: JobSpec, problems: Problems, profile_names: list[str] | None) -> None:
    if profile_names is None:
        from .vendors import available_profiles
        profile_names = available_profiles()
    if spec.image.vendor not in profile_names:
        from .validate import did_you_mean
        hint = did_you_mean(spec.image.vendor, profile_names)
        problems.append(("image.vendor", f"unknown vendor {spec.image.vendor!r}{hint}"
                         f" (available: {', '.join(sorted(profile_names))})"))
    for fname in ("tag", "base"):
        value = getattr(spec.image, fname)
        why = imageref.problem(value) if value is not None else None
        if why:
            problems.append((f"image.{fname}", why))
    for i, pkg in enumerate(spec.image.system_packages):
        if not re.fullmatch(r"[a-z0-9][a-z0-9+.\-]*(=[A-Za-z0-9.+~:\-]+)?", pkg):
            problems.append((f"image.system_packages[{i}]", f"{pkg!r} is not a Debian package name"))
    for key in spec.image.build_args:
        if not ENV_NAME.fullmatch(key):
            problems.append((f"image.build_args.{key}", "build arg names are letters, digits and _"))
    workdir = spec.image.workdir
    if not IMAGE_PATH.fullmatch(workdir) or ".." in workdir.split("/"):
        problems.append(("image.workdir", f"{workdir!r} must be an absolute path inside the image of letters, "
                         "digits and . _ - / without '..' (build-image bakes it into the Dockerfile), "
                         "e.g. /workspace"))


def _check_command(spec: JobSpec, problems: Problems) -> None:
    _check_int(spec.nodes, "nodes", 1, MAX_NODES, problems, "Kubernetes caps an Indexed Job's parallelism there")
    if spec.accelerators_per_node is not None:
        _check_int(spec.accelerators_per_node, "accelerators_per_node", 0, MAX_ACCELERATORS_PER_NODE, problems)
    if spec.nproc_per_node is not None:
        _check_int(spec.nproc_per_node, "nproc_per_node", 1, MAX_PROCS_PER_NODE, problems)
    if not spec.command:
        problems.append(("command", "must list the program and its arguments, e.g. [python, train.py]"))
    elif not (spec.command[0] or "").strip():
        problems.append(("command[0]", "the program to run is empty; e.g. command: [python, train.py]"))
    for i, arg in enumerate(spec.command):
        if "\x00" in arg:
            problems.append((f"command[{i}]", "contains a NUL byte"))


def _check_workdir(spec: JobSpec, problems: Problems) -> None:
    _check_plain_text(spec.workdir, "workdir", problems)
    if spec.workdir is not None and not spec.workdir.startswith("/"):
        problems.append(("workdir", f"{spec.workdir!r} must be an absolute path in the container, e.g. /workspace"))


def _check_env(spec: JobSpec, problems: Problems) -> None:
    for key, value in spec.env.items():
        if not ENV_NAME.fullmatch(str(key)):
            problems.append((f"env.{key}", "environment variable names are letters, digits and _, not starting "
                             "with a digit"))
        if value is not None and "\x00" in value:
            problems.append((f"env.{key}", "contains a NUL byte"))
        if str(key).startswith("WMCTL_"):
            problems.append((f"env.{key}", "WMCTL_* variables are set by wmctl; use the matching spec field instead"))


def _check_lifecycle(spec: JobSpec, problems: Problems) -> None:
    """Checkpoints, restarts, rendezvous: the fields the self-healing loop runs on."""
    _check_int(spec.checkpoint.every_steps, "checkpoint.every_steps", 1, INT32_MAX, problems)
    _check_int(spec.checkpoint.keep, "checkpoint.keep", 1, INT32_MAX, problems,
               "wmctl always keeps 2 so a torn save has a fallback")
    _check_int(spec.restart.max_attempts, "restart.max_attempts", 1, 10_000, problems, "1 = no retries")
    for fname in ("backoff", "node_loss_timeout"):
        _check_duration(spec.restart, fname, f"restart.{fname}", problems)
    heartbeat = _check_duration(spec.restart, "heartbeat_timeout", "restart.heartbeat_timeout", problems)
    if heartbeat is not None and heartbeat < 1:
        problems.append(("restart.heartbeat_timeout", "must be at least 1s: with less, every attempt is a hang "
                         "before its first step; give the longest a healthy step (or a checkpoint save) may "
                         "take, e.g. 10m"))
    pending = _check_duration(spec.restart, "pending_timeout", "restart.pending_timeout", problems)
    if pending is not None and pending < 1:
        problems.append(("restart.pending_timeout", "must be at least 1s: a pod takes a moment to be "
                         "scheduled even on an idle cluster; give how long the job may wait to be placed, e.g. 30m"))
    pull = _check_duration(spec.restart, "image_pull_timeout", "restart.image_pull_timeout", problems)
    if pull is not None and pull < 1:
        problems.append(("restart.image_pull_timeout", "must be at least 1s: a container takes a moment to start "
                         "even from a cached image; give how long a cold pull of the image may take, e.g. 30m"))
    silence = _check_duration(spec.restart, "node_silence_timeout", "restart.node_silence_timeout", problems)
    if silence is not None and silence < 3:
        problems.append(("restart.node_silence_timeout", "must be at least 3s: a node beats once a second, and a "
                         "busy host can miss a beat or two; the default is 15s"))
    _check_duration(spec.rendezvous, "join_timeout", "rendezvous.join_timeout", problems)
    if spec.rendezvous.read_timeout is not None:
        read = _check_duration(spec.rendezvous, "read_timeout", "rendezvous.read_timeout", problems)
        if read is not None and read < 1:
            problems.append(("rendezvous.read_timeout", "must be at least 1s (torch refuses a read timeout "
                             "below one second); give how long a node may wait for node 0's store, e.g. 10m"))
    grace = _check_duration(spec.kubernetes, "termination_grace_period", "kubernetes.termination_grace_period",
                            problems)
    if grace is not None and grace < 1:
        problems.append(("kubernetes.termination_grace_period", "must be at least 1s: with less, SIGKILL "
                         "follows SIGTERM at once and no emergency checkpoint can be written; e.g. 90s"))
    if not 1 <= spec.rendezvous.port <= 65535:
        problems.append(("rendezvous.port", "must be a TCP port, 1-65535"))
    if spec.local.master_port is not None and not 1 <= spec.local.master_port <= 65535:
        problems.append(("local.master_port", "must be a TCP port, 1-65535"))
    if spec.checkpoint.dir is not None and spec.checkpoint.dir.strip() == "":
        problems.append(("checkpoint.dir", "must not be empty"))


def _check_docker(spec: JobSpec, problems: Problems) -> None:
    for i, cpus in enumerate(spec.docker.cpusets):
        if not CPULIST.fullmatch(cpus):
            problems.append((f"docker.cpusets[{i}]", f"{cpus!r} is not a CPU list like 0-15 or 0,2,4"))
    if spec.docker.cpusets and len(spec.docker.cpusets) != spec.nodes:
        problems.append(("docker.cpusets", f"give one CPU list per node ({spec.nodes}), got "
                         f"{len(spec.docker.cpusets)}"))
    user = spec.docker.user
    if user not in ("auto", "image") and not (isinstance(user, str) and DOCKER_USER.fullmatch(user)):
        problems.append(("docker.user", f"{user!r} is not auto, image, UID[:GID] or NAME[:GROUP] "
                         "(e.g. 1000:1000); auto runs containers as you, so host folders stay yours"))


def _check_name(spec: JobSpec, problems: Problems) -> None:
    name = spec.name
    if not isinstance(name, str) or not DNS_LABEL.fullmatch(name):
        problems.append(("name", f"{name!r} is not a valid run name: use lowercase letters, digits and '-', "
                         "starting with a letter and ending with a letter or digit (it becomes Kubernetes "
                         "object names and hostnames)"))
        return
    # The longest name wmctl derives: pod hostname <run>-a<attempt>-<index>, a DNS label (63).
    suffix = len(f"-a{max(spec.restart.max_attempts - 1, 0)}") + len(f"-{max(spec.nodes - 1, 0)}")
    if len(name) + suffix > K8S_NAME_MAX:
        problems.append(("name", f"{name!r} is {len(name)} characters; with the attempt and node suffixes "
                         f"(e.g. {name}-a{spec.restart.max_attempts - 1}-{spec.nodes - 1}) it would exceed "
                         f"{K8S_NAME_MAX}; shorten it to at most {K8S_NAME_MAX - suffix}"))


def _check_int(value: int, path: str, low: int, high: int, problems: Problems, why: str = "") -> None:
    if not low <= value <= high:
        problems.append((path, f"must be between {low} and {high}, got {value}" + (f" ({why})" if why else "")))


def _check_duration(obj: Any, fname: str, path: str, problems: Problems) -> float | None:
    """The duration in seconds, or None after recording why it is invalid."""
    try:
        return parse_duration(getattr(obj, fname))
    except Invalid as exc:
        problems.append((path, str(exc)))
        return None


def _check_resources(spec: JobSpec, problems: Problems) -> None:
    res = spec.resources
    if res.cpu is not None and res.cpu <= 0:
        problems.append(("resources.cpu", "must be a positive number of CPUs"))
    elif res.cpu is not None and res.cpu < MIN_CPU:
        # Kubernetes would render 0m (no request at all) and Docker 0 nano-CPUs (no limit).
        problems.append(("resources.cpu", f"{res.cpu:g} is below 1m (0.001 CPU), the smallest amount "
                         "Kubernetes and Docker can express; use 0.001 or more"))
    elif res.cpu is not None and res.cpu > MAX_CPUS:
        problems.append(("resources.cpu", f"{res.cpu:g} CPUs is more than any node has; use at most {MAX_CPUS}"))
    shm = mem = None
    try:
        shm = res.shm_bytes
    except Invalid as exc:
        problems.append(("resources.shm", str(exc)))
    try:
        mem = res.memory_bytes
    except Invalid as exc:
        problems.append(("resources.memory", str(exc)))
    if shm is not None and shm < 64 * 2**20:
        problems.append(("resources.shm", "below Docker's 64Mi default, which already crashes DataLoader workers; "
                         "use at least 1Gi (16Gi is a good default)"))
    if shm is not None and mem is not None and shm >= mem:
        problems.append(("resources.shm", f"{res.shm} of /dev/shm counts toward the memory limit "
                         f"({res.memory}) and would leave nothing for the processes; raise resources.memory "
                         "above shm plus what training needs, or lower resources.shm"))


def _check_volumes(spec: JobSpec, problems: Problems) -> None:
    names: dict[str, int] = {}
    mounts: dict[str, int] = {}
    for i, vol in enumerate(spec.volumes):
        path = f"volumes[{i}]"
        if not DNS_LABEL.fullmatch(vol.name or ""):
            problems.append((join(path, "name"), f"{vol.name!r} must be a DNS label (lowercase letters, digits, '-')"))
        elif vol.name.startswith(RESERVED_VOLUME_PREFIX):
            problems.append((join(path, "name"), f"{vol.name!r}: names starting with {RESERVED_VOLUME_PREFIX!r} are "
                             "reserved for the volumes wmctl adds (/dev/shm, vendor driver mounts); rename it"))
        if vol.name in names:
            problems.append((join(path, "name"), f"duplicate volume name {vol.name!r} "
                             f"(also volumes[{names[vol.name]}])"))
        names.setdefault(vol.name, i)
        normalized = _check_mount(vol, path, problems)
        if normalized in mounts:
            problems.append((join(path, "mount"), f"two volumes on one mount path {vol.mount!r} "
                             f"(also volumes[{mounts[normalized]}]); give each volume its own mount"))
        mounts.setdefault(normalized, i)
        _check_volume_source(vol, path, problems)


def _check_mount(vol: Volume, path: str, problems: Problems) -> str:
    """The mount path's problems; returns it normalised (and sets it so: /data/ and /data are one)."""
    mount = vol.mount or ""
    _check_plain_text(vol.mount, join(path, "mount"), problems)
    if any(c in mount for c in ",:"):
        problems.append((join(path, "mount"), f"{mount!r} contains ',' or ':', which Docker's volume syntax "
                         "reads as separators; use another path"))
    if not mount.startswith("/"):
        problems.append((join(path, "mount"), f"{mount!r} must be an absolute path in the container"))
    if ".." in mount.split("/"):
        problems.append((join(path, "mount"), f"{mount!r} contains '..'; write the path it means, "
                         "e.g. /workspace/data"))
    normalized = normalize_mount(mount) if mount else mount
    if mount and vol.mount != normalized:
        vol.mount = normalized
    if normalized == "/dev/shm":
        problems.append((join(path, "mount"), "/dev/shm is managed by wmctl; set resources.shm instead"))
    return normalized


def _check_volume_source(vol: Volume, path: str, problems: Problems) -> None:
    set_ = [s for s in Volume.SOURCES if getattr(vol, s) is not None]
    if len(set_) != 1:
        problems.append((path, f"give exactly one source ({', '.join(Volume.SOURCES)}); got "
                         f"{', '.join(set_) if set_ else 'none'}"))
    if vol.host_path is not None and not vol.host_path:
        problems.append((join(path, "host_path"), "must not be empty"))
    _check_plain_text(vol.host_path, join(path, "host_path"), problems)
    if vol.nfs is not None:
        _check_nfs(vol.nfs, join(path, "nfs"), problems)
    for fname in ("pvc", "secret", "config_map"):
        value = getattr(vol, fname)
        if value is not None and not _is_dns_subdomain(value):
            problems.append((join(path, fname), f"{value!r} is not a Kubernetes object name: lowercase "
                             "letters, digits, '-' and '.', at most 253 characters, e.g. wm-ckpt"))
    if vol.empty_dir is not None and vol.empty_dir.size_limit is not None:
        try:
            parse_quantity(vol.empty_dir.size_limit)
        except Invalid as exc:
            problems.append((join(path, "empty_dir.size_limit"), str(exc)))


def _check_plain_text(value: str | None, path: str, problems: Problems) -> None:
    """A path or name is one line of printable text: a newline or a NUL would end it early in a
    mount option, a printed command or a manifest."""
    if value is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        problems.append((path, f"{value[:60]!r} contains a control character (a newline, tab or NUL); "
                         "write it on one line"))


def _check_nfs(nfs: NfsSource, path: str, problems: Problems) -> None:
    if not NFS_SERVER.fullmatch(nfs.server or ""):
        problems.append((join(path, "server"), f"{nfs.server[:60]!r} is not a host name or IP address; give only "
                         "the server (e.g. nfs.example.com or 10.0.0.5): mount options are not accepted here"))
    _check_plain_text(nfs.path, join(path, "path"), problems)
    if not nfs.path.startswith("/"):
        problems.append((join(path, "path"), "must be an absolute export path"))
    elif "," in nfs.path:
        problems.append((join(path, "path"), f"{nfs.path!r} contains ',', which Docker reads as a mount option "
                         "separator"))


def _is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(value))


def normalize_mount(mount: str) -> str:
    """'/data//x/./' -> '/data/x'. posixpath keeps a leading '//' (POSIX leaves its meaning to the
    system); a container path has no such meaning, so it collapses too."""
    normalized = posixpath.normpath(mount)
    return "/" + normalized.lstrip("/") if normalized.startswith("//") else normalized


def _check_affinity(spec: JobSpec, problems: Problems) -> None:
    if isinstance(spec.affinity, dict):
        for rank, cpus in spec.affinity.items():
            if rank < 0:
                problems.append((f"affinity.{rank}", "local ranks start at 0"))
            if not isinstance(cpus, str) or not CPULIST.fullmatch(cpus):
                problems.append((f"affinity.{rank}", f"{cpus!r} is not a CPU list like 0-15 or 0,2,4"))


def _check_kubernetes(spec: JobSpec, problems: Problems) -> None:
    k = spec.kubernetes
    if len(k.namespace) > K8S_NAME_MAX or (
            not DNS_LABEL.fullmatch(k.namespace) and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", k.namespace)):
        problems.append(("kubernetes.namespace", f"{k.namespace!r} is not a valid namespace name"))
    _check_cluster_domain(spec, problems)
    label_key = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                           r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
    for fname in ("node_selector", "labels"):
        for key, value in getattr(k, fname).items():
            if not label_key.fullmatch(key):
                problems.append((f"kubernetes.{fname}.{key}", "not a valid label key"))
            if not label_value.fullmatch(value or ""):
                problems.append((f"kubernetes.{fname}.{key}", f"{value!r} is not a valid label value "
                                 "(at most 63 letters, digits, - _ .)"))
    for key in k.annotations:
        if not label_key.fullmatch(key):
            problems.append((f"kubernetes.annotations.{key}", "not a valid annotation key"))
    size = sum(len(key.encode()) + len((value or "").encode()) for key, value in k.annotations.items())
    if size > ANNOTATIONS_MAX_BYTES - ANNOTATIONS_WMCTL_RESERVE:
        problems.append(("kubernetes.annotations", f"{size:,} bytes in all; the API server refuses more than "
                         f"{ANNOTATIONS_MAX_BYTES:,} per object and wmctl adds up to "
                         f"{ANNOTATIONS_WMCTL_RESERVE:,}: keep large data in a ConfigMap"))
    for i, secret in enumerate(k.image_pull_secrets):
        if not _is_dns_subdomain(secret or ""):
            problems.append((f"kubernetes.image_pull_secrets[{i}]", f"{secret!r} is not a Secret name: lowercase "
                             "letters, digits, '-' and '.', e.g. regcred"))
    if k.watcher_image is not None and (why := imageref.problem(k.watcher_image)):
        problems.append(("kubernetes.watcher_image", why))
    for fname in ("queue", "scheduler", "service_account", "priority_class", "watcher_service_account"):
        value = getattr(k, fname)
        if value is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value):
            problems.append((f"kubernetes.{fname}", f"{value!r} is not a valid Kubernetes name"))
    for i, t in enumerate(k.tolerations):
        _check_toleration(t, f"kubernetes.tolerations[{i}]", label_key, label_value, problems)
    _check_int(k.ttl_seconds_after_finished, "kubernetes.ttl_seconds_after_finished", 0, INT32_MAX, problems)


def _check_cluster_domain(spec: JobSpec, problems: Problems) -> None:
    domain = spec.kubernetes.cluster_domain
    if len(domain) > 253 or not DNS_SUBDOMAIN.fullmatch(domain) or any(len(p) > 63 for p in domain.split(".")):
        problems.append(("kubernetes.cluster_domain", f"{domain!r} is not a DNS name; give the cluster's DNS "
                         "domain (kubelet --cluster-domain), e.g. cluster.local"))
        return
    # The rendezvous endpoint <job>-0.<service>.<namespace>.svc.<domain> must stay a valid DNS name.
    job = f"{spec.name}-a{max(spec.restart.max_attempts - 1, 0)}"
    fqdn = f"{job}-0.{job}.{spec.kubernetes.namespace}.svc.{domain}"
    if len(fqdn) > 253:
        problems.append(("kubernetes.cluster_domain", f"the rendezvous host {fqdn} would exceed 253 "
                         "characters; shorten the cluster domain, the namespace or the run name"))


def _check_toleration(t: dict[str, Any], path: str, label_key: re.Pattern, label_value: re.Pattern,
                      problems: Problems) -> None:
    """The rules the API server applies (core/v1 validation), so a bad toleration fails here, not at submit."""
    allowed = {"key", "operator", "value", "effect", "tolerationSeconds"}
    extra = set(t) - allowed
    if extra:
        problems.append((path, f"unknown keys {sorted(map(str, extra))}; allowed: {sorted(allowed)}"))
    # null is what YAML gives for `key:` with nothing after it: the same as leaving it out.
    t = {k: v for k, v in t.items() if v is not None}
    operator = t.get("operator", "Equal")      # the API server's default
    if operator not in TOLERATION_OPERATORS:
        problems.append((join(path, "operator"), f"{operator!r} is not one of {', '.join(TOLERATION_OPERATORS)}"))
    key = t.get("key", "")
    if not isinstance(key, str) or (key and not label_key.fullmatch(key)):
        problems.append((join(path, "key"), f"{key!r} is not a valid taint key"))
    elif not key and operator != "Exists":
        problems.append((join(path, "key"), "an empty key matches every taint only with operator: Exists"))
    value = t.get("value")
    if value is not None:
        if operator == "Exists" and value != "":
            problems.append((join(path, "value"), "operator Exists matches any value; drop value or use "
                             "operator: Equal"))
        elif not isinstance(value, str):
            problems.append((join(path, "value"), f"expected a string, got {value!r}; quote it"))
        elif not label_value.fullmatch(value):
            problems.append((join(path, "value"), f"{value!r} is not a valid taint value "
                             "(at most 63 letters, digits, - _ .)"))
    effect = t.get("effect", "")
    if effect not in ("", *TAINT_EFFECTS):
        problems.append((join(path, "effect"), f"{effect!r} is not one of {', '.join(TAINT_EFFECTS)} "
                         "(or empty for every effect)"))
    if "tolerationSeconds" in t:
        seconds = t["tolerationSeconds"]
        if effect != "NoExecute":
            problems.append((join(path, "tolerationSeconds"), "applies only to effect: NoExecute (other "
                             "effects never evict); set effect: NoExecute or drop tolerationSeconds"))
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            problems.append((join(path, "tolerationSeconds"), f"expected an integer number of seconds, "
                             f"got {seconds!r}"))
        else:
            _check_int(seconds, join(path, "tolerationSeconds"), 0, INT32_MAX, problems)
