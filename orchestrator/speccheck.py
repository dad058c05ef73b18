"""The job spec's checks: real mistakes caught at load, each naming the field and the fix.

``check`` runs every rule on a built ``JobSpec`` (specload.from_dict calls it); ``warnings`` says
what is legal but probably unwise; ``profile_problems`` and ``context_problems`` check the spec
against its vendor profile and against this machine.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import imageref
from .names import (is_dns_subdomain, is_dns_subdomain_form, is_env_name, is_host_or_address, is_label_key,
                    is_label_value, is_object_name, is_rfc1035_label, is_rfc1123_label, looks_like_secret)
from .spec import (ANNOTATIONS_MAX_BYTES, ANNOTATIONS_WMCTL_RESERVE, K8S_NAME_MAX, MAX_ACCELERATORS_PER_NODE,
                   MAX_CPUS, MAX_NODES, MAX_PROCS_PER_NODE, MIN_CPU, RESERVED_VOLUME_PREFIX, TAINT_EFFECTS,
                   TOLERATION_OPERATORS, JobSpec, NfsSource, Volume)
from .validate import INT32_MAX, Invalid, Problems, join, parse_duration, parse_quantity

if TYPE_CHECKING:
    from .vendors import VendorProfile

# The patterns the checks match with, as text: re compiles (and keeps) each one the first time a
# check uses it, so a spec without affinity, say, never compiles CPULIST. Names (DNS labels,
# label keys, env names, NFS servers) are checked without patterns: orchestrator/names.py.
MAX_SPARES = 64          # restart.spares: warm nodes beside the job's, each a whole node's worth
CPULIST = r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$"
# The same alphabet dockerfile.check_image_path enforces at build time; checked at load so a
# spec that renders also builds (tests/unit/test_spec.py keeps the two in step).
IMAGE_PATH = r"^/[A-Za-z0-9._\-/]*$"
DOCKER_USER = r"(\d{1,10}|[a-z_][a-z0-9_-]{0,31})(:(\d{1,10}|[a-z_][a-z0-9_-]{0,31}))?"


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

def profile_problems(spec: JobSpec, profile: VendorProfile) -> Problems:
    """What the spec asks that its vendor's profile cannot give."""
    if not profile.accelerator and spec.accelerators_per_node:
        return [("accelerators_per_node", f"the {profile.name} vendor has no accelerators to give "
                 f"({spec.accelerators_per_node} asked); drop accelerators_per_node, or set image.vendor to the "
                 "accelerator's vendor (cuda, rocm, musa, ascend, ...)")]
    return []


def warnings(spec: JobSpec) -> list[str]:
    """Legal but probably unwise: said once, on stderr, at load."""
    secret = sorted(k for k, v in spec.env.items() if v and looks_like_secret(str(k)))
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
        if not is_env_name(key):
            problems.append((f"image.build_args.{key}", "build arg names are letters, digits and _"))
    workdir = spec.image.workdir
    if not re.fullmatch(IMAGE_PATH, workdir) or ".." in workdir.split("/"):
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
        if not is_env_name(str(key)):
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
    _check_int(spec.restart.spares, "restart.spares", 0, MAX_SPARES, problems, "0 = no spare nodes")
    if spec.restart.stragglers not in ("warn", "replace"):
        problems.append(("restart.stragglers", f"must be warn or replace, not {spec.restart.stragglers!r}: warn names "
                         "a slow node, replace also swaps it for a warm spare at the next checkpoint"))
    ratio = spec.restart.straggler_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 1.0 < ratio <= 100.0:
        problems.append(("restart.straggler_ratio", f"must be a number above 1 (at most 100), not {ratio!r}: "
                         "how many times the other nodes' median a straggler's step time is; the default is 1.3"))
    _check_int(spec.restart.straggler_window, "restart.straggler_window", 1, INT32_MAX, problems,
               "steps a node must stay slow before it is called a straggler; the default is 20")
    for fname in ("backoff", "node_loss_timeout", "remember_exclusions"):
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
        if not re.fullmatch(CPULIST, cpus):
            problems.append((f"docker.cpusets[{i}]", f"{cpus!r} is not a CPU list like 0-15 or 0,2,4"))
    if spec.docker.cpusets and len(spec.docker.cpusets) != spec.nodes:
        problems.append(("docker.cpusets", f"give one CPU list per node ({spec.nodes}), got "
                         f"{len(spec.docker.cpusets)}"))
    user = spec.docker.user
    if user not in ("auto", "image") and not (isinstance(user, str) and re.fullmatch(DOCKER_USER, user)):
        problems.append(("docker.user", f"{user!r} is not auto, image, UID[:GID] or NAME[:GROUP] "
                         "(e.g. 1000:1000); auto runs containers as you, so host folders stay yours"))


def _check_name(spec: JobSpec, problems: Problems) -> None:
    name = spec.name
    if not isinstance(name, str) or not is_rfc1035_label(name):
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
        if not is_rfc1035_label(vol.name or ""):
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
        if value is not None and not is_dns_subdomain(value):
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
    if not is_host_or_address(nfs.server or ""):
        problems.append((join(path, "server"), f"{nfs.server[:60]!r} is not a host name or IP address; give only "
                         "the server (e.g. nfs.example.com or 10.0.0.5): mount options are not accepted here"))
    _check_plain_text(nfs.path, join(path, "path"), problems)
    if not nfs.path.startswith("/"):
        problems.append((join(path, "path"), "must be an absolute export path"))
    elif "," in nfs.path:
        problems.append((join(path, "path"), f"{nfs.path!r} contains ',', which Docker reads as a mount option "
                         "separator"))


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
            if not isinstance(cpus, str) or not re.fullmatch(CPULIST, cpus):
                problems.append((f"affinity.{rank}", f"{cpus!r} is not a CPU list like 0-15 or 0,2,4"))


def _check_kubernetes(spec: JobSpec, problems: Problems) -> None:
    k = spec.kubernetes
    if len(k.namespace) > K8S_NAME_MAX or not is_rfc1123_label(k.namespace):
        problems.append(("kubernetes.namespace", f"{k.namespace!r} is not a valid namespace name"))
    _check_cluster_domain(spec, problems)
    for fname in ("node_selector", "labels"):
        for key, value in getattr(k, fname).items():
            if not is_label_key(key):
                problems.append((f"kubernetes.{fname}.{key}", "not a valid label key"))
            if not is_label_value(value or ""):
                problems.append((f"kubernetes.{fname}.{key}", f"{value!r} is not a valid label value "
                                 "(at most 63 letters, digits, - _ .)"))
    for key in k.annotations:
        if not is_label_key(key):
            problems.append((f"kubernetes.annotations.{key}", "not a valid annotation key"))
    size = sum(len(key.encode()) + len((value or "").encode()) for key, value in k.annotations.items())
    if size > ANNOTATIONS_MAX_BYTES - ANNOTATIONS_WMCTL_RESERVE:
        problems.append(("kubernetes.annotations", f"{size:,} bytes in all; the API server refuses more than "
                         f"{ANNOTATIONS_MAX_BYTES:,} per object and wmctl adds up to "
                         f"{ANNOTATIONS_WMCTL_RESERVE:,}: keep large data in a ConfigMap"))
    for i, secret in enumerate(k.image_pull_secrets):
        if not is_dns_subdomain(secret or ""):
            problems.append((f"kubernetes.image_pull_secrets[{i}]", f"{secret!r} is not a Secret name: lowercase "
                             "letters, digits, '-' and '.', e.g. regcred"))
    if k.watcher_image is not None and (why := imageref.problem(k.watcher_image)):
        problems.append(("kubernetes.watcher_image", why))
    for fname in ("queue", "scheduler", "service_account", "priority_class", "watcher_service_account"):
        value = getattr(k, fname)
        if value is not None and not is_object_name(value):
            problems.append((f"kubernetes.{fname}", f"{value!r} is not a valid Kubernetes name"))
    for i, t in enumerate(k.tolerations):
        _check_toleration(t, f"kubernetes.tolerations[{i}]", problems)
    _check_int(k.ttl_seconds_after_finished, "kubernetes.ttl_seconds_after_finished", 0, INT32_MAX, problems)


def _check_cluster_domain(spec: JobSpec, problems: Problems) -> None:
    domain = spec.kubernetes.cluster_domain
    if len(domain) > 253 or not is_dns_subdomain_form(domain) or any(len(p) > 63 for p in domain.split(".")):
        problems.append(("kubernetes.cluster_domain", f"{domain!r} is not a DNS name; give the cluster's DNS "
                         "domain (kubelet --cluster-domain), e.g. cluster.local"))
        return
    # The rendezvous endpoint <job>-0.<service>.<namespace>.svc.<domain> must stay a valid DNS name.
    job = f"{spec.name}-a{max(spec.restart.max_attempts - 1, 0)}"
    fqdn = f"{job}-0.{job}.{spec.kubernetes.namespace}.svc.{domain}"
    if len(fqdn) > 253:
        problems.append(("kubernetes.cluster_domain", f"the rendezvous host {fqdn} would exceed 253 "
                         "characters; shorten the cluster domain, the namespace or the run name"))


def _check_toleration(t: dict[str, Any], path: str, problems: Problems) -> None:
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
    if not isinstance(key, str) or (key and not is_label_key(key)):
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
        elif not is_label_value(value):
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
