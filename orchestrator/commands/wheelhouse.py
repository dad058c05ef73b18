"""``wmctl wheelhouse SPEC``: fill a folder with every wheel an offline image build needs.

Run it on a machine that has a package index; copy the folder to the air-gapped one and build
with ``image.wheelhouse`` (or ``wmctl build-image --wheelhouse DIR``). ``pip download`` fetches
wheels for the image's Python and platform, not this machine's: ``--only-binary=:all:`` because
nothing can be compiled without the index's build dependencies.
"""

from __future__ import annotations

import platform as _platform
import subprocess
import sys
from pathlib import Path

import click

from ..errors import BuildError


def default_platforms() -> list[str]:
    # manylinux_2_28 covers Debian 11+/Ubuntu 20.04+ (glibc >= 2.28); pip accepts older manylinux
    # tags under it. Vendor images are Linux, whatever this machine is.
    machine = _platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine or "x86_64")
    return [f"manylinux_2_28_{arch}"]


def download_command(packages: list[str], requirements: Path | None, dest: Path, python_version: str,
                     platforms: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest),
           "--python-version", python_version, "--implementation", "cp"]
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
              help="Python of the image, e.g. 3.10 (default: this interpreter's, "
                   f"{sys.version_info.major}.{sys.version_info.minor}).")
@click.option("--platform", "platforms", multiple=True,
              help="Wheel platform tag of the image (repeatable; default manylinux_2_28 for this CPU arch).")
@click.option("--torch/--no-torch", "with_torch", default=None,
              help="Also download the vendor's torch packages (default: when the profile's base lacks torch).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a spec field.")
def command(spec_path: str, directory: str | None, python_version: str | None, platforms: tuple[str, ...],
            with_torch: bool | None, sets: tuple[str, ...]) -> None:
    """Fill a wheelhouse folder for offline (air-gapped) image builds."""
    from ..dockerfile import check_single_line
    from ..spec import load_spec, parse_set_flags
    from ..vendors import load_profile

    spec = load_spec(spec_path, parse_set_flags(sets))
    profile = load_profile(spec.image.vendor)
    dest = Path(directory).resolve() if directory else (spec.wheelhouse_dir or Path(spec_path).resolve().parent / "wheelhouse")
    requirements = None
    if spec.image.requirements:
        check_single_line(spec.image.requirements, "image.requirements")
        requirements = spec.context_dir / spec.image.requirements
        if not requirements.is_file():
            raise BuildError(f"image.requirements: {requirements} does not exist")
    include_torch = profile.pip_install_torch if with_torch is None else with_torch
    packages = list(profile.torch_packages) if include_torch else []
    if requirements is None and not packages:
        raise BuildError("nothing to download: the spec has no image.requirements and the vendor's base "
                         "image already has torch", hint="set image.requirements, or pass --torch")
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    if not all(part.isdigit() for part in version.split(".")) or version.count(".") != 1:
        raise BuildError(f"--python-version: {version!r} is not MAJOR.MINOR, e.g. 3.10")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = download_command(packages, requirements, dest, version, list(platforms) or default_platforms())
    click.echo(f"pip download for python {version} ({', '.join(list(platforms) or default_platforms())}) into {dest}")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise BuildError("pip download did not finish within an hour") from None
    if result.returncode != 0:
        tail = "\n".join(f"    {line}" for line in (result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BuildError(f"pip download failed (exit {result.returncode}):\n{tail}",
                         hint="every package needs a binary wheel for that Python and platform; "
                              "check names and versions in image.requirements")
    wheels = sorted(p.name for p in dest.iterdir() if p.is_file())
    total = sum((dest / w).stat().st_size for w in wheels)
    click.echo(f"{len(wheels)} files, {total / 2**20:.1f} MiB in {dest}")
    click.echo(f"offline build: wmctl build-image {spec_path} --wheelhouse {dest}")
