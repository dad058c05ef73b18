"""``wmctl build-image SPEC``: render the Dockerfile from the vendor profile, build, tag, push.

``--dry-run`` prints the Dockerfile and the build context summary and loads no engine SDK.
A content tag (``<repo>:wmctl-<digest>``, from the Dockerfile, the base image's id on the engine,
the context files, the runtime wheel, the wheelhouse and build args) sits next to the user's tag:
when the engine already has it, the image is reported up to date and not rebuilt. What was built
and pushed is recorded in ``<spec folder>/.wmctl/images.json`` (see ``orchestrator.imagebuild.record``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import __version__
from ..errors import BuildError

if TYPE_CHECKING:
    from ..adaptors.dockerapi import ImageAPI


def parse_build_args(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuildError(f"--build-arg: {item!r} is not KEY=VALUE, e.g. --build-arg HTTP_PROXY=http://proxy:3128")
        out[key] = value
    return out


def load(spec_path: str, sets: tuple[str, ...] = ()):
    """The validated spec and its vendor profile (no engine)."""
    from ..specload import load_spec, parse_set_flags
    from ..vendors import load_profile

    spec = load_spec(spec_path, parse_set_flags(sets))
    return spec, load_profile(spec.image.vendor)


def plan(spec, profile, *, tag: str | None = None, build_args: tuple[str, ...] = (),
         platform: str | None = None, wheelhouse: str | None = None, client: ImageAPI | None = None):
    """Plan the build (no wheel build). With an engine ``client`` (``engine.connect()``) the base
    image's id on that engine goes into the content digest; without one no engine is touched and
    the digest leaves the base's identity out (the dry run's summary says so)."""
    from ..imagebuild import wheel
    from ..imagebuild.plan import plan_build
    from ..imagebuild.quoting import check_ref

    args = parse_build_args(build_args)
    base_id = None
    if client is not None:
        from ..imagebuild import engine

        base = spec.image.base or profile.base_image
        check_ref(base, "image.base" if spec.image.base else f"vendor profile {profile.name} base_image")
        base_id = engine.image_exists(client, base)
    return plan_build(
        spec, profile, wheel_name=wheel.wheel_name(), wheel_fingerprint=wheel.fingerprint(),
        wmctl_version=__version__, tag=tag, wheelhouse=Path(wheelhouse).resolve() if wheelhouse else None,
        build_args=args, platform=platform, base_image_id=base_id,
    )


def prepare(spec_path: str, *, sets: tuple[str, ...] = (), tag: str | None = None,
            build_args: tuple[str, ...] = (), platform: str | None = None, wheelhouse: str | None = None,
            client: ImageAPI | None = None):
    """Load the spec and plan the build: (spec, plan)."""
    spec, profile = load(spec_path, sets)
    return spec, plan(spec, profile, tag=tag, build_args=build_args, platform=platform, wheelhouse=wheelhouse,
                      client=client)


def _stale_wheels(api: ImageAPI, build, spec_path: str, prune: bool, quiet: bool) -> None:
    """Say how many wheels images of other wheelhouses the engine keeps, or remove them (--prune-wheels)."""
    import shlex

    from ..imagebuild import engine
    from ..imagebuild.plan import human_size

    stale = engine.stale_wheels_images(api, build)
    size = human_size(sum(int(i.get("Size") or 0) for i in stale))
    if prune:
        removed = engine.prune_wheels_images(api, stale)
        click.echo(f"removed {removed} wheels image(s) of other wheelhouses ({size})")
    elif stale and not quiet:
        click.echo(f"note: {len(stale)} wheels image(s) of other wheelhouses ({size}) are kept on the engine; "
                   f"`wmctl build-image {shlex.quote(spec_path)} --prune-wheels` removes them (a build that needs one "
                   "again sends its wheels again)")


@click.command(name="build-image", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the Dockerfile and the build context summary; build nothing.")
@click.option("-t", "--tag", help="Image tag (overrides image.tag), e.g. registry.example.com/team/wm:v3.")
@click.option("--push", is_flag=True, help="Push the tags after the build and record the pushed digest.")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer (and ignore an up-to-date content tag).")
@click.option("--build-arg", "build_args", multiple=True, metavar="KEY=VALUE", help="Docker build arg (repeatable).")
@click.option("--platform", help="Target platform passed to the engine, e.g. linux/amd64.")
@click.option("--wheelhouse", type=click.Path(file_okay=False),
              help="Offline build: every pip install reads only this folder (overrides image.wheelhouse).")
@click.option("--prune-wheels", is_flag=True,
              help="Remove the wheels images of other wheelhouses that wmctl made (offline builds leave one "
                   "per dependency change); never an image wmctl did not label.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the result (and errors).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a spec field, e.g. --set image.tag=x.")
def command(spec_path: str, dry_run: bool, tag: str | None, push: bool, no_cache: bool,
            build_args: tuple[str, ...], platform: str | None, wheelhouse: str | None, prune_wheels: bool,
            quiet: bool, sets: tuple[str, ...]) -> None:
    """Render the Dockerfile from the vendor profile and build (and push) the image."""
    from ..imagebuild.plan import context_summary

    spec, profile = load(spec_path, sets)
    options: dict[str, Any] = dict(tag=tag, build_args=build_args, platform=platform, wheelhouse=wheelhouse)
    if dry_run:
        # No engine here: the summary says the base image's id is left out of this digest.
        build = plan(spec, profile, **options)
        click.echo("# ---- Dockerfile ----")
        click.echo(build.dockerfile, nl=False)
        click.echo("# ---- build context ----")
        click.echo(context_summary(build))
        return

    from ..imagebuild import engine, progress, record, wheel

    api = engine.connect()
    build = plan(spec, profile, **options, client=api)
    with progress.make_reporter(quiet) as reporter:
        wheel_path = wheel.build_wheel()
        # An offline build gets no network at all: the air-gapped promise is checked, not assumed.
        result = engine.build_image(build, wheel_path, client=api, reporter=reporter, no_cache=no_cache,
                                    network_mode="none" if build.wheelhouse is not None else None)
    # Listing images costs the engine a walk over all of them (~0.1 s here): done when this build
    # made a wheels image (a dependency change, which leaves the previous one behind), or asked.
    if result.wheels_built or prune_wheels:
        _stale_wheels(api, build, spec_path, prune_wheels, quiet)
    entry = {
        "tag": build.tag, "content_tag": build.content_tag, "image_id": result.image_id,
        "spec_hash": spec.spec_hash(), "vendor": spec.image.vendor, "wmctl_version": __version__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if push:
        client = engine.get_client()
        with progress.make_reporter(quiet) as reporter:
            digest = engine.push_image(build.tag, client=client, reporter=reporter)
        engine.push_image(build.content_tag, client=client, reporter=progress.Reporter(quiet=True))
        repo = build.tag.rsplit(":", 1)[0]
        entry.update(repo_digest=f"{repo}@{digest}", digest=digest,
                     pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        click.echo(f"digest: {repo}@{digest}")
    path = record.record_image(Path(spec_path), spec.name, entry)
    if not quiet:
        click.echo(f"recorded in {path}")
