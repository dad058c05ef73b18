"""The Dockerfile: rendered from templates/Dockerfile.j2 with every value checked or quoted."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BuildError
from .context import REQUIREMENTS_DIR, WHEELHOUSE_DIR, WHEELHOUSE_TORCH_DIR
from .quoting import (DEB_PACKAGE, check_ident, check_image_path, check_index_url, check_ref, check_single_line,
                      dq, execform, index_args)


APT_SCRIPT = r"""set -e
nopt=$1; offline=$2; shift 2
i=0; n=$#; required=0
while [ "$i" -lt "$n" ]; do
  p=$1; shift; i=$((i+1))
  if dpkg -s "${p%%=*}" >/dev/null 2>&1; then continue; fi
  if [ "$i" -gt "$nopt" ]; then required=1; fi
  set -- "$@" "$p"
done
if [ "$#" -eq 0 ]; then echo "wmctl: system packages already present"; exit 0; fi
if [ "$offline" = 1 ] || ! command -v apt-get >/dev/null 2>&1; then
  if [ "$required" = 1 ]; then
    echo "wmctl: image.system_packages cannot be installed (offline build or no apt-get in the base image): $*" >&2
    exit 1
  fi
  echo "wmctl: skipping optional system packages (offline build or no apt-get): $*"; exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
rm -rf /var/lib/apt/lists/*"""

CHECK_SCRIPT = """import shutil, sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"wmctl: torch is not importable in this image ({exc}): use a base image with torch or add torch to image.requirements")
import orchestrator
if shutil.which("wmctl-bind") is None:
    sys.exit("wmctl: the wmctl-bind launcher is not on PATH after installing the wmctl wheel")
print("wmctl", orchestrator.__version__, "torch", torch.__version__, "launcher", shutil.which("wmctl-bind"))"""


@dataclass(frozen=True)
class DockerfileInputs:
    job_name: str
    vendor: str
    base: str
    python: str
    workdir: str
    wheel_name: str
    wmctl_version: str
    offline: bool = False
    requirements: bool = False
    requirements_rel: str = "requirements.txt"  # image.requirements, relative to the context
    # Offline builds: whether the context has wheels for the torch step / for the rest (a COPY of
    # a folder the context lacks fails the build, so an empty group is not copied).
    has_torch_wheels: bool = True
    has_dep_wheels: bool = True
    torch_packages: tuple[str, ...] = ()
    torch_index_url: str | None = None          # the profile's: an extra index for both pip steps
    optional_packages: tuple[str, ...] = ()     # the profile's: skipped when absent/offline
    required_packages: tuple[str, ...] = ()     # the user's image.system_packages
    image_env: tuple[tuple[str, str], ...] = ()
    build_arg_names: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()


def _validate(inputs: DockerfileInputs) -> None:
    check_ref(inputs.base, "image.base")
    check_image_path(inputs.workdir, "image.workdir")
    if not re.fullmatch(r"[A-Za-z0-9_./\-]+", inputs.python):
        raise BuildError(f"vendor profile python: {inputs.python!r} is not a plain executable name or path")
    if inputs.requirements:
        check_single_line(inputs.requirements_rel, "image.requirements")
    if not re.fullmatch(r"[A-Za-z0-9_.\-+]+\.whl", inputs.wheel_name):
        raise BuildError(f"internal: unexpected wheel file name {inputs.wheel_name!r}")
    for i, pkg in enumerate(inputs.optional_packages):
        if not DEB_PACKAGE.match(pkg):
            raise BuildError(f"vendor profile system_packages[{i}]: {pkg!r} is not a Debian package name")
    for i, pkg in enumerate(inputs.required_packages):
        if not DEB_PACKAGE.match(pkg):
            raise BuildError(f"image.system_packages[{i}]: {pkg!r} is not a Debian package name, e.g. numactl")
    if inputs.offline and inputs.required_packages:
        raise BuildError("image.system_packages: an offline build (image.wheelhouse) cannot apt-get "
                         f"{', '.join(inputs.required_packages)}",
                         hint="bake them into image.base, or build without a wheelhouse")
    for i, pkg in enumerate(inputs.torch_packages):
        check_single_line(pkg, f"vendor profile torch_packages[{i}]")
        if pkg.startswith("-"):
            raise BuildError(f"vendor profile torch_packages[{i}]: {pkg!r} looks like a pip option, not a package")
    if inputs.torch_index_url is not None:
        check_index_url(inputs.torch_index_url, f"vendor profile {inputs.vendor} torch_index_url")
    for key, value in inputs.image_env:
        check_ident(key, f"vendor profile image_env.{key}")
        check_single_line(value, f"vendor profile image_env.{key}")
    for name in inputs.build_arg_names:
        check_ident(name, f"image.build_args.{name}")
    for key, value in inputs.labels:
        check_single_line(key, "label name")
        check_single_line(value, f"label {key}")


def _ident_filter(value: str) -> str:
    return check_ident(value, "name")


def _ref_filter(value: str) -> str:
    return check_ref(value, "image reference")


def _path_filter(value: str) -> str:
    return check_image_path(value, "path")


def render_dockerfile(inputs: DockerfileInputs, template_text: str | None = None) -> str:
    """The Dockerfile text. Raises BuildError (naming the field) for a value that cannot be baked in."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    _validate(inputs)
    if template_text is None:
        from ..resources import templates_dir

        template_text = (templates_dir() / "Dockerfile.j2").read_text(encoding="utf-8")
    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters.update(dq=dq, execform=execform, ident=_ident_filter, ref=_ref_filter, path=_path_filter)
    # Online, the profile's torch index is an *extra* index: pip's configured one (PyPI, or a
    # mirror) keeps serving everything else, and for torch pip takes the best match across both,
    # which is the index's: its 2.13.0+cpu sorts after PyPI's 2.13.0 (PEP 440 local versions).
    # The requirements step gets it too, so torchvision/torchaudio there match the CPU torch.
    # Offline, only the wheelhouse is read (it was filled through the same index).
    pip_source = (["--no-index", "--find-links", "/tmp/wmctl/wheelhouse/"] if inputs.offline
                  else index_args(inputs.torch_index_url))
    torch_step = bool(inputs.torch_packages)
    packages = list(inputs.optional_packages) + list(inputs.required_packages)
    text = env.from_string(template_text).render(
        job_name=inputs.job_name, vendor=inputs.vendor, base=inputs.base, python=inputs.python,
        workdir=inputs.workdir.rstrip("/") or "/", wheel_name=inputs.wheel_name,
        wmctl_version=inputs.wmctl_version, offline=inputs.offline, requirements=inputs.requirements,
        requirements_path="/tmp/wmctl/req/" + inputs.requirements_rel,
        copy_torch_wheels=inputs.offline and torch_step and inputs.has_torch_wheels,
        copy_dep_wheels=inputs.offline and inputs.requirements and inputs.has_dep_wheels,
        wheelhouse_dir=WHEELHOUSE_DIR + "/", wheelhouse_torch_dir=WHEELHOUSE_TORCH_DIR + "/",
        requirements_dir=REQUIREMENTS_DIR + "/",
        torch_packages=list(inputs.torch_packages), pip_source=pip_source,
        system_packages=packages, optional_count=str(len(inputs.optional_packages)),
        offline_flag="1" if inputs.offline else "0", apt_script=APT_SCRIPT, check_script=CHECK_SCRIPT,
        image_env=list(inputs.image_env), build_arg_names=list(inputs.build_arg_names),
        labels=list(inputs.labels),
    )
    return text if text.endswith("\n") else text + "\n"
