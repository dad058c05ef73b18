"""Vendor profiles: one YAML file per accelerator vendor in ``images/``, loaded as plain data.

Adding a vendor is one YAML file (and its golden renders), no code. Facts that could not be
verified are listed in the file's ``unverified`` field so a wrong one is a one-line fix.
"""

# No `from __future__ import annotations`: loading a profile resolves every field's type, and a
# string annotation would be compiled to do so (see spec.py).

import functools
import os
from dataclasses import field
from pathlib import Path
from typing import Any

from .errors import ProfileError
from .runtime.protocol import ENV_VENDOR_PATH
from .runtime.records import record
from .runtime.vendor import RuntimeProfile, register
from .resources import images_dir
from .validate import Problems, build, index_url_problem


@record(frozen=True)
class DeviceRequest:
    """One ``--gpus``-style device request of `docker run` (a driver and its capabilities)."""

    driver: str = ""
    capabilities: list[list[str]] = field(default_factory=lambda: [["gpu"]])


@record(frozen=True)
class DockerExposure:
    """How `docker run` exposes the devices (and what the runtime needs to see them)."""

    device_requests: list[DeviceRequest] = field(default_factory=list)  # --gpus
    runtime: str | None = None               # --runtime
    devices: list[str] = field(default_factory=list)       # --device paths; {i} expands per device
    per_device: list[str] = field(default_factory=list)    # device paths repeated for each accelerator
    mounts: list[str] = field(default_factory=list)        # host driver paths bound read-only
    group_add: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    ulimits: dict[str, int] = field(default_factory=dict)
    visible_devices_env: str | None = None   # runtime-level env, e.g. NVIDIA_VISIBLE_DEVICES
    env: dict[str, str] = field(default_factory=dict)


@record(frozen=True)
class KubernetesExposure:
    """What a pod needs beside the device plugin's resource: env and host mounts."""

    env: dict[str, str] = field(default_factory=dict)
    host_mounts: list[str] = field(default_factory=list)   # hostPath mounts the device plugin does not add
    # the RuntimeClass the vendor's container runtime is registered under on its clusters, where
    # its devices need one (a spec's kubernetes.runtime_class overrides it); None: the default
    runtime_class: str | None = None


@record(frozen=True)
class SlurmExposure:
    """How an sbatch job asks for the devices, and how a container runtime on the node shows them."""

    # The GRES name a site usually gives these devices (`--gres=NAME:COUNT`). Sites choose their
    # own names (gres.conf): a spec's slurm.gres overrides it. None: the vendor has no devices.
    gres: str | None = None
    apptainer_flags: list[str] = field(default_factory=list)   # `apptainer exec` flags: --nv, --rocm


@record(frozen=True)
class RuntimeSection:
    """What the job's runtime needs beyond the top-level facts (it reads no YAML: see
    ``VendorProfile.runtime_profile``)."""

    torch_plugin: str | None = None          # the import that registers torch.<torch_module>
    libraries: list[str] = field(default_factory=list)       # ctypes.util.find_library names
    smi: list[str] = field(default_factory=list)             # management tools, any one of them
    device_sources: list[str] = field(default_factory=list)  # sysfs listings: nvidia-proc, drm, pci
    aliases: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)      # libs, module, pci


@record(frozen=True)
class VendorProfile:
    """An accelerator vendor, read from images/<vendor>.yaml: its devices, image and runtime facts."""

    name: str
    display_name: str
    accelerator: bool
    torch_module: str
    dist_backend: str
    base_image: str
    resource: str | None = None              # Kubernetes device-plugin resource name
    smi: list[str] = field(default_factory=list)
    topology_smi: list[str] = field(default_factory=list)
    base_has_torch: bool = True
    python: str = "python3"
    pci_vendor_ids: list[str] = field(default_factory=list)
    visible_devices_env: str | None = None   # in-process, e.g. CUDA_VISIBLE_DEVICES
    default_accelerators_per_node: int = 1
    runtime_libraries: list[str] = field(default_factory=list)  # preflight looks for these
    bf16_check: str | None = None
    env: dict[str, str] = field(default_factory=dict)           # every backend
    image_env: dict[str, str] = field(default_factory=dict)     # baked into the image
    system_packages: list[str] = field(default_factory=list)
    torch_packages: list[str] = field(default_factory=list)     # what pip needs when the base lacks torch
    # A PEP 503 index pip adds with --extra-index-url (build-image's pip steps, `wmctl wheelhouse`):
    # the CPU wheel index for the cpu profile, so torch is not PyPI's multi-GB CUDA build.
    torch_index_url: str | None = None
    docker: DockerExposure = field(default_factory=DockerExposure)
    kubernetes: KubernetesExposure = field(default_factory=KubernetesExposure)
    slurm: SlurmExposure = field(default_factory=SlurmExposure)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    # What a failing rank says when its device, not the job, failed (case-insensitive substrings
    # of the node's output): the run is retried away from that node, and the record says so.
    device_fault_patterns: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    notes: str = ""

    @property
    def pip_install_torch(self) -> bool:
        return not self.base_has_torch

    def runtime_profile(self) -> RuntimeProfile:
        """The part of this profile the job's runtime reads, handed over as WMCTL_VENDOR_PROFILE."""
        r = self.runtime
        return RuntimeProfile(
            name=self.name, torch_module=self.torch_module if self.accelerator else None,
            torch_plugin=r.torch_plugin, dist_backend=self.dist_backend,
            pci_vendor_ids=tuple(int(v, 16) for v in self.pci_vendor_ids),
            device_sources=tuple(r.device_sources), visible_devices_env=self.visible_devices_env,
            libraries=tuple(r.libraries), smi=tuple(r.smi), aliases=tuple(r.aliases),
            unverified=tuple(r.unverified))


def search_path(directory: Path | None = None) -> list[Path]:
    """Where profiles are looked for: the folders on WMCTL_VENDOR_PATH, then images/."""
    if directory is not None:
        return [directory]
    extra = [Path(p) for p in os.environ.get(ENV_VENDOR_PATH, "").split(os.pathsep) if p.strip()]
    return [*extra, images_dir()]


def _files(directory: Path | None = None) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in search_path(directory):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            found.setdefault(path.stem, path)    # the first folder on the path wins
    return found


def available_profiles(directory: Path | None = None) -> list[str]:
    return sorted(_files(directory))


@functools.lru_cache(maxsize=None)
def _load_cached(path: str) -> VendorProfile:
    import yaml

    p = Path(path)
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"vendor profile {p} cannot be read: {exc}") from None
    problems: Problems = []
    profile = build(VendorProfile, data, "", problems)
    if profile is not None and profile.torch_index_url is not None:
        problem = index_url_problem(profile.torch_index_url)
        if problem:
            problems.append(("torch_index_url", problem))
    if problems or profile is None:
        detail = "; ".join(f"{k}: {v}" for k, v in problems)
        raise ProfileError(f"vendor profile {p} is invalid: {detail}")
    if profile.name != p.stem:
        raise ProfileError(f"vendor profile {p}: name {profile.name!r} must match the file name {p.stem!r}")
    return profile


def load_profile(name: str, directory: Path | None = None) -> VendorProfile:
    """The profile called ``name`` or one of its aliases (nvidia -> cuda)."""
    files = _files(directory)
    path = files.get(name)
    if path is None:
        for candidate in files.values():
            profile = _load_cached(str(candidate))
            if name in profile.runtime.aliases:
                return profile
        folders = ", ".join(str(p) for p in search_path(directory))
        raise ProfileError(f"no vendor profile {name!r} in {folders} (available: {', '.join(sorted(files))})",
                           hint=f"add {name}.yaml to one of those folders, or to a folder on {ENV_VENDOR_PATH}")
    return _load_cached(str(path))


def register_runtime_profiles(directory: Path | None = None) -> None:
    """Tell this process's runtime (doctor, affinity, tests) every profile there is."""
    for name in available_profiles(directory):
        register(load_profile(name, directory).runtime_profile())


def profile_summary(profile: VendorProfile) -> dict[str, Any]:
    return {
        "vendor": profile.name, "resource": profile.resource, "torch": f"torch.{profile.torch_module}",
        "backend": profile.dist_backend, "smi": " ".join(profile.smi), "base": profile.base_image,
    }
