"""``wmctl wheelhouse SPEC``: fill a folder with every wheel an offline image build needs.

Run it on a machine that has a package index; copy the folder to the air-gapped one and build
with ``image.wheelhouse`` (or ``wmctl build-image --wheelhouse DIR``). ``pip download`` fetches
wheels for the image's Python and platform, not this machine's: ``--only-binary=:all:`` because
nothing can be compiled without the index's build dependencies.
"""

from __future__ import annotations

import platform as _platform
import re
import subprocess
import sys
from pathlib import Path

import click

from ..errors import BuildError

# Newest glibc the default ladder assumes (Debian 11+, Ubuntu 20.04+, RHEL 8+): vendor images
# are at least that new.
NEWEST_GLIBC_MINOR = 28
# manylinux_2_5 (manylinux1) exists only for x86; everything else starts at 2_17 (PEP 599/600).
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def host_arch() -> str:
    machine = _platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine or "x86_64")


def default_platforms(arch: str | None = None) -> list[str]:
    """Every Linux platform tag a pip inside a glibc >= 2.28 image accepts, newest first, the way
    pip lists its own (packaging's _manylinux.platform_tags). ``pip download --platform`` takes
    the tags literally and only widens manylinux2014/2010 to the older legacy names, so one
    manylinux_2_28 tag alone would refuse the many wheels tagged manylinux_2_17/manylinux2014."""
    arch = arch or host_arch()
    tags = []
    for minor in range(NEWEST_GLIBC_MINOR, _OLDEST_GLIBC_MINOR.get(arch, 17) - 1, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in _LEGACY_MANYLINUX:
            tags.append(f"{_LEGACY_MANYLINUX[minor]}_{arch}")
    # Not on PyPI, but vendor indexes (their torch plugins) publish plain linux_<arch> wheels,
    # and pip in the image accepts them.
    tags.append(f"linux_{arch}")
    return tags


_PY_IN_TAG = re.compile(r"(?<![A-Za-z0-9])py(?:thon)?-?(\d)\.?(\d{1,2})(?![0-9])")


def image_python_version(base: str | None, python: str | None) -> tuple[str, str] | None:
    """(MAJOR.MINOR, where it was read) for the image's Python when its name says it: the
    profile's interpreter (python3.10), an official python image (python:3.11-slim), or a
    pyXY / py3.Y part of the base image reference (...-py3.10, ..._py310_...)."""
    if python:
        match = re.search(r"python(\d)\.(\d+)$", python.rsplit("/", 1)[-1])
        if match:
            return f"{match.group(1)}.{match.group(2)}", f"the vendor profile's python ({python})"
    if base:
        last = base.split("@", 1)[0].rsplit("/", 1)[-1]
        repo, _, tag = last.partition(":")
        match = re.match(r"(\d)\.(\d+)(?![0-9])", tag) if repo == "python" else None
        match = match or _PY_IN_TAG.search(last)
        if match:
            return f"{match.group(1)}.{match.group(2)}", f"the base image {base}"
    return None


def download_command(packages: list[str], requirements: Path | None, dest: Path, python_version: str,
                     platforms: list[str], torch_index_url: str | None = None) -> list[str]:
    """The pip download line. The profile's torch index is added with --extra-index-url, as in
    the image's pip steps: pip's own index (PyPI or a configured mirror) still serves every other
    package, which --index-url would have cut off (the CPU index carries torch and a few of its
    dependencies, not a job's requirements)."""
    from ..imagebuild.quoting import index_args

    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest),
           "--python-version", python_version, "--implementation", "cp", *index_args(torch_index_url)]
    for plat in platforms:
        cmd += ["--platform", plat]
    if requirements is not None:
        cmd += ["-r", str(requirements)]
    cmd += packages
    return cmd


@click.command(name="wheelhouse", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="Folder to fill (default: image.wheelhouse, else ./wheelhouse next to the spec).")
@click.option("--python-version", default=None,
              help="Python of the image, e.g. 3.10. Default: the image's, when the vendor profile's python "
                   "(python3.10) or the base image name (python:3.11-slim, ...-py3.10) says it; otherwise "
                   f"this interpreter's ({sys.version_info.major}.{sys.version_info.minor}), with a note.")
@click.option("--platform", "platforms", multiple=True,
              help="Wheel platform tag of the image (repeatable). Default, for this CPU arch: "
                   f"manylinux_2_{NEWEST_GLIBC_MINOR} down to manylinux_2_17/manylinux2014 (manylinux1 on "
                   "x86), then linux_<arch>.")
@click.option("--torch/--no-torch", "with_torch", default=None,
              help="Also download the vendor's torch packages (default: when the profile's base lacks torch).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a spec field.")
def command(spec_path: str, directory: str | None, python_version: str | None, platforms: tuple[str, ...],
            with_torch: bool | None, sets: tuple[str, ...]) -> None:
    """Fill a wheelhouse folder for offline (air-gapped) image builds."""
    from ..imagebuild.quoting import check_single_line
    from ..imagebuild.requirements import requirements_closure
    from ..specload import load_spec, parse_set_flags
    from ..vendors import load_profile

    spec = load_spec(spec_path, parse_set_flags(sets))
    profile = load_profile(spec.image.vendor)
    default = spec.wheelhouse_dir or Path(spec_path).resolve().parent / "wheelhouse"
    dest = Path(directory).resolve() if directory else default
    requirements = None
    if spec.image.requirements:
        check_single_line(spec.image.requirements, "image.requirements")
        requirements = spec.context_dir / spec.image.requirements
        if not requirements.is_file():
            raise BuildError(f"image.requirements: {requirements} does not exist")
        # The same checks as build-image: a wheelhouse for a file the build refuses helps no one.
        requirements_closure(requirements, spec.context_dir)
    include_torch = profile.pip_install_torch if with_torch is None else with_torch
    packages = list(profile.torch_packages) if include_torch else []
    if requirements is None and not packages:
        raise BuildError("nothing to download: the spec has no image.requirements and the vendor's base "
                         "image already has torch", hint="set image.requirements, or pass --torch")
    version = python_version
    if version is None:
        found = image_python_version(spec.image.base or profile.base_image, profile.python)
        if found is not None:
            version = found[0]
            click.echo(f"python {version}, from {found[1]}")
        else:
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            click.echo(f"note: neither the vendor profile nor the base image {spec.image.base or profile.base_image} "
                       f"names its Python version; using this machine's ({version}). Pass --python-version "
                       "if the image's differs, or pip will fetch wheels it cannot install.", err=True)
    if not all(part.isdigit() for part in version.split(".")) or version.count(".") != 1:
        raise BuildError(f"--python-version: {version!r} is not MAJOR.MINOR, e.g. 3.10")
    tags = list(platforms) or default_platforms()
    dest.mkdir(parents=True, exist_ok=True)
    cmd = download_command(packages, requirements, dest, version, tags, profile.torch_index_url)
    shown = ", ".join(tags) if platforms else f"{tags[0]} ... {tags[-1]} ({len(tags)} platform tags)"
    click.echo(f"pip download for python {version} ({shown}) into {dest}")
    if profile.torch_index_url:
        click.echo(f"torch index (vendor profile {profile.name}): {profile.torch_index_url}, "
                   "beside pip's configured index")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise BuildError("pip download did not finish within an hour") from None
    if result.returncode != 0:
        tail = "\n".join(f"    {line}" for line in (result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BuildError(f"pip download failed (exit {result.returncode}):\n{tail}",
                         hint="every package needs a binary wheel for that Python and platform; "
                              "check names and versions in image.requirements, or --python-version/--platform")
    wheels = sorted(p.name for p in dest.iterdir() if p.is_file())
    total = sum((dest / w).stat().st_size for w in wheels)
    click.echo(f"{len(wheels)} files, {total / 2**20:.1f} MiB in {dest}")
    click.echo(f"offline build: wmctl build-image {spec_path} --wheelhouse {dest}")
