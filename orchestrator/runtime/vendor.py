"""The vendor facts the job's runtime needs, received as data: no vendor is spelled in code.

The orchestrator resolves the job's vendor profile (``images/<vendor>.yaml``, or one on
``WMCTL_VENDOR_PATH``) and hands the runtime part of it to every node as compact JSON in
``WMCTL_VENDOR_PROFILE``, so a vendor that this image's copy of wmctl has never heard of still
works. Outside a job (``wmctl doctor``, ``wmctl affinity``, tests) the CLI registers every
profile it can read with ``register``. With neither, the runtime knows only ``CPU``: no
accelerator, gloo.

Standard library only: the launcher imports this before any worker starts.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, field, fields
from typing import Any, Mapping

from .records import record
from .protocol import ENV_DIST_BACKEND, ENV_TORCH_MODULE, ENV_VENDOR, ENV_VENDOR_PROFILE


class VendorUnknown(ValueError):
    """No profile of that name (or alias) is known to this process."""


@record(frozen=True)
class RuntimeProfile:
    """The part of a vendor profile the job's runtime reads (handed over as WMCTL_VENDOR_PROFILE)."""

    name: str
    torch_module: str | None = None          # torch.<module> holds the devices; None: no accelerator
    torch_plugin: str | None = None          # the import that registers that module
    dist_backend: str = "gloo"
    pci_vendor_ids: tuple[int, ...] = ()
    device_sources: tuple[str, ...] = ()     # sysfs listings tried in order ("pci" is the generic scan)
    visible_devices_env: str | None = None   # in-process visible-devices variable
    libraries: tuple[str, ...] = ()          # ctypes.util.find_library names
    smi: tuple[str, ...] = ()                # management tools, any one of them
    aliases: tuple[str, ...] = ()
    unverified: tuple[str, ...] = field(default=(), compare=False)   # "libs", "module", "pci"

    def __str__(self) -> str:
        return self.name

    @property
    def accelerator(self) -> bool:
        return self.torch_module is not None

    def to_json(self) -> str:
        data = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "RuntimeProfile":
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("expected a JSON object with a name")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                kwargs[key] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


CPU = RuntimeProfile(name="cpu", aliases=("none",))

_REGISTERED: dict[str, RuntimeProfile] = {}


def register(profile: RuntimeProfile) -> None:
    """Make ``profile`` known to this process (the CLI registers every profile it can read)."""
    _REGISTERED[profile.name] = profile


def from_env(env: Mapping[str, str] | None = None) -> RuntimeProfile | None:
    """The job's own profile, as the orchestrator handed it over; None when there is none."""
    raw = (os.environ if env is None else env).get(ENV_VENDOR_PROFILE, "").strip()
    if not raw:
        return None
    try:
        return RuntimeProfile.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise VendorUnknown(f"{ENV_VENDOR_PROFILE} is not a vendor profile ({exc}); wmctl sets it from "
                            "the job's profile: unset it or submit the job again") from None


def known(env: Mapping[str, str] | None = None) -> list[RuntimeProfile]:
    """Every profile this process knows: the job's own first, then the registered ones, then CPU."""
    out: dict[str, RuntimeProfile] = {}
    own = from_env(env)
    if own is not None:
        out[own.name] = own
    for p in _REGISTERED.values():
        out.setdefault(p.name, p)
    out.setdefault(CPU.name, CPU)
    return list(out.values())


def resolve(name: str | RuntimeProfile | None, env: Mapping[str, str] | None = None) -> RuntimeProfile:
    """The profile called ``name`` (or one of its aliases); ``None`` is CPU."""
    if isinstance(name, RuntimeProfile):
        return name
    wanted = (name or CPU.name).strip().lower()
    for p in known(env):
        if wanted in p.names():
            return p
    names = ", ".join(sorted(n for p in known(env) for n in p.names()))
    raise VendorUnknown(f"unknown vendor {name!r}: this process knows {names}; a job gets its profile from "
                        f"{ENV_VENDOR_PROFILE} (set by wmctl), a profile file goes in images/ or on WMCTL_VENDOR_PATH")


def for_job(env: Mapping[str, str] | None = None) -> RuntimeProfile:
    """The profile of the job this process belongs to: the one handed over, else the one
    ``WMCTL_VENDOR`` names, else the first known profile with the job's torch module, else CPU.
    With no profile but an accelerator torch module named, a profile of just that module: the
    job checks for it rather than quietly training on the CPU."""
    env = os.environ if env is None else env
    own = from_env(env)
    if own is not None:
        return own
    named = env.get(ENV_VENDOR, "").strip()
    if named:
        try:
            return resolve(named, env)
        except VendorUnknown:
            pass   # the torch module below still says what the job runs on
    module = (env.get(ENV_TORCH_MODULE) or CPU.name).strip().lower()
    found = next((p for p in known(env) if p.torch_module == module), None)
    if found is not None or module == CPU.name:
        return found or CPU
    return RuntimeProfile(name=named or module, torch_module=module,
                          dist_backend=(env.get(ENV_DIST_BACKEND) or CPU.dist_backend).strip())
