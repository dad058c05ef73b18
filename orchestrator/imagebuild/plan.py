"""The Dockerfile and the build context for a job's image: pure rendering, no engine.

``plan_build(spec, profile, ...)`` gathers everything a build needs (the Dockerfile text, the
files of the context after ``.dockerignore``, the tags, the content digest) without importing
docker; ``build.engine`` turns a ``BuildPlan`` into a real build and ``--dry-run`` prints it.

Safety: nothing from the spec or a profile can add a Dockerfile instruction. References and
paths are checked against a fixed alphabet before rendering; every other value is emitted as a
JSON string inside an exec-form array (no shell, no Docker variable expansion for RUN) or as a
double-quoted word with ``\\ " $`` escaped; control and line-separator characters are refused.

Two builds, split at the Dockerfile's ``DEPS_SPLIT`` line. The dependency image (every line
above it: base, system packages, torch, requirements, the wmctl runtime, WORKDIR) is tagged
``<repo>:wmctl-deps-<digest of those inputs>`` and built only when the engine lacks that tag; its
context::

    Dockerfile                                      the lines above the split
    wmctl/wheels/wmctl-<version>-py3-none-any.whl   the runtime, same version as this CLI
    wmctl/req/<path in image.context>               image.requirements and the files it names
                                                    with -r/-c, at their context-relative paths

The job's layers (labels, the code) are built FROM it; its context::

    Dockerfile                                      FROM the dependency image + the lines below
    src/...                                         image.context minus .dockerignore

So a code change sends the code alone, and the engine probes no dependency step at all (a
cached ``COPY --from`` still reads and hashes every wheel it copies, on every build).

Offline builds read image.wheelhouse from wheels images, not from a context: each group of
wheels goes to the engine once, as ``wmctl/wheelhouse:<group>-<digest of its wheels>`` (``FROM
scratch``; the torch step's wheels under /wmctl/wheelhouse-torch/, the rest under
/wmctl/wheelhouse/), and the dependency image copies them with ``COPY --from=`` that image: a
torch wheelhouse (hundreds of MB to GBs) is not tarred, sent and unpacked again; a new
requirement's wheel makes a new deps wheels image and leaves the torch one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..runtime.protocol import ENV_VENDOR_PROFILE
from .context import (REQUIREMENTS_DIR, WHEELHOUSE_DIR, WHEELHOUSE_TORCH_DIR, ContextScan, source_date,
                      scan_context, source_metadata)
from .digest import content_digest, deps_digest, wheelhouse_hashes, wheels_image_digest
from .dockerfile import WHEELS_DOCKERFILE, DockerfileInputs, render_dockerfile, split_dockerfile
from .quoting import check_ident, check_ref, check_single_line
from .requirements import inside, requirements_closure
from .wheelhouse import torch_wheel_set, wheelhouse_files


@dataclass
class BuildPlan:
    dockerfile: str
    context: ContextScan
    requirements: Path | None
    wheelhouse: Path | None
    wheelhouse_files: list[tuple[str, int]]
    wheel_name: str
    wheel_fingerprint: str
    build_args: dict[str, str]
    platform: str | None
    tag: str                 # the user's tag (or wmctl/<name>:latest)
    content_tag: str         # same repository, tag wmctl-<digest>
    digest: str
    # The dependency image (the Dockerfile's lines above its split), tagged by its own digest in
    # the same repository: wmctl-deps-<digest>. The job's layers are built FROM it.
    deps_tag: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # image.requirements and the files it names: (path relative to the context, file)
    requirements_files: list[tuple[str, Path]] = field(default_factory=list)
    torch_wheels: set[str] = field(default_factory=set)   # wheelhouse files copied before the torch step
    base: str = ""
    base_image_id: str | None = None   # the engine's id for base, part of the digest when known
    # offline builds: context folder (WHEELHOUSE_TORCH_DIR, WHEELHOUSE_DIR) -> the wheels image of
    # that group, which the Dockerfile copies from
    wheels_images: dict[str, str] = field(default_factory=dict)


    @property
    def tags(self) -> list[str]:
        return [self.tag, self.content_tag]

    @property
    def deps_dockerfile(self) -> str:
        """The dependency image's Dockerfile: every line above the split."""
        return split_dockerfile(self.dockerfile)[0]

    @property
    def code_dockerfile(self) -> str:
        """The job's own layers (labels, code), FROM the dependency image."""
        return f"FROM {self.deps_tag}\n" + split_dockerfile(self.dockerfile)[1]


# Where the wheels images live: one tag per wheelhouse content, shared by every job that uses it.
WHEELS_IMAGE_REPO = "wmctl/wheelhouse"


def split_tag(ref: str) -> tuple[str, str]:
    """registry:5000/team/wm:v3 -> ("registry:5000/team/wm", "v3"); digests are not tags."""
    if "@" in ref:
        raise BuildError(f"--tag/image.tag: {ref!r} is a digest reference; give a tag such as name:v1")
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag
    return ref, "latest"


def check_repository(repo: str, field_name: str) -> None:
    # Docker wants lowercase repository paths; the tag part may have capitals.
    path = repo.split("/", 1)[1] if "/" in repo and re.search(r"[.:]|^localhost$", repo.split("/", 1)[0]) else repo
    if not re.fullmatch(r"[a-z0-9]+([._\-]+[a-z0-9]+)*(/[a-z0-9]+([._\-]+[a-z0-9]+)*)*", path):
        raise BuildError(f"{field_name}: repository {repo!r} must be lowercase letters, digits and . _ - "
                         "separated by /, e.g. registry.example.com/team/worldmodel")


def plan_build(spec: Any, profile: Any, *, wheel_name: str, wheel_fingerprint: str, wmctl_version: str,
               tag: str | None = None, wheelhouse: Path | None = None,
               build_args: dict[str, str] | None = None, platform: str | None = None,
               created: str | None = None, source: dict[str, str] | None = None,
               base_image_id: str | None = None) -> BuildPlan:
    """Everything ``docker build`` will get, from a loaded JobSpec and its VendorProfile.
    ``base_image_id``: the engine's id for the base image, when the caller asked the engine (a
    dry run does not: its digest then leaves the base's identity out, and the summary says so)."""
    image = spec.image
    root = Path(spec.context_dir)
    base = image.base or profile.base_image
    check_ref(base, "image.base" if image.base else f"vendor profile {profile.name} base_image")

    user_tag = tag or image.tag
    if user_tag:
        check_ref(user_tag, "--tag" if tag else "image.tag")
        repo, tag_part = split_tag(user_tag)
        check_repository(repo, "--tag" if tag else "image.tag")
        user_tag = f"{repo}:{tag_part}"
    else:
        repo = f"wmctl/{spec.name}"
        check_repository(repo, "name")
        user_tag = f"{repo}:latest"

    args = dict(image.build_args)
    args.update(build_args or {})
    for key, value in args.items():
        check_ident(key, f"--build-arg/image.build_args {key}")
        check_single_line(value, f"--build-arg/image.build_args {key}")

    requirements = None
    requirements_files: list[tuple[str, Path]] = []
    if image.requirements:
        check_single_line(image.requirements, "image.requirements")
        requirements = (root / image.requirements)
        if not inside(requirements, root):
            raise BuildError(f"image.requirements: {image.requirements!r} is outside image.context ({root})")
        if not requirements.is_file():
            raise BuildError(f"image.requirements: {requirements} does not exist",
                             hint="give a path relative to image.context, e.g. requirements.txt")
        requirements_files = requirements_closure(requirements, root)

    wh = Path(wheelhouse) if wheelhouse is not None else spec.wheelhouse_dir
    wh_files = wheelhouse_files(wh) if wh is not None else []
    extra_excluded = []
    if wh is not None and inside(wh, root) and wh.resolve() != root.resolve():
        # The wheelhouse travels as wmctl/wheelhouse; a second copy under src/ would double the
        # image and bust the code layer whenever a wheel is added.
        extra_excluded.append(wh.resolve().relative_to(root.resolve()).as_posix())
    scan = scan_context(root, extra_excluded)
    torch_packages = tuple(profile.torch_packages) if profile.pip_install_torch else ()
    torch_wheels = torch_wheel_set(wh, wh_files, torch_packages) if wh is not None and torch_packages else set()
    dep_wheels = {rel for rel, _ in wh_files} - torch_wheels
    wheel_hashes = wheelhouse_hashes(wh, wh_files) if wh is not None else {}
    wheels_images = {}
    for folder, group, wanted in ((WHEELHOUSE_TORCH_DIR, "torch", torch_wheels), (WHEELHOUSE_DIR, "deps", dep_wheels)):
        if wanted:
            hashes = {rel: wheel_hashes[rel] for rel in wanted}
            identity = wheels_image_digest(folder, hashes, WHEELS_DOCKERFILE)
            wheels_images[folder] = f"{WHEELS_IMAGE_REPO}:{group}-{identity}"

    meta = source if source is not None else source_metadata(root)
    # Labels sit before the code (templates/Dockerfile.j2), so none may change with every build:
    # the build time is the image's own Created field, and a created label is set only when the
    # caller pins it (``created``, or SOURCE_DATE_EPOCH for reproducible builds). These two are
    # left out of the content digest: the same content with a new commit is still up to date.
    created = created or source_date()
    volatile = {**({"org.opencontainers.image.created": created} if created else {}),
                **({"org.opencontainers.image.revision": meta["revision"]} if meta.get("revision") else {})}
    stable = {
        "org.opencontainers.image.source": meta["source"],
        "org.opencontainers.image.title": spec.name,
        "io.wmctl.job": spec.name,
        "io.wmctl.vendor": profile.name,
        "io.wmctl.spec-hash": spec.spec_hash(),
        "io.wmctl.version": wmctl_version,
    }
    inputs = DockerfileInputs(
        job_name=spec.name, vendor=profile.name, base=base, python=profile.python,
        workdir=image.workdir, wheel_name=wheel_name, wmctl_version=wmctl_version,
        offline=wh is not None, requirements=requirements is not None,
        requirements_rel=requirements_files[0][0] if requirements_files else "requirements.txt",
        has_torch_wheels=bool(torch_wheels), has_dep_wheels=bool(dep_wheels),
        torch_wheels_image=wheels_images.get(WHEELHOUSE_TORCH_DIR, ""),
        dep_wheels_image=wheels_images.get(WHEELHOUSE_DIR, ""),
        torch_packages=torch_packages, torch_index_url=profile.torch_index_url,
        optional_packages=tuple(profile.system_packages), required_packages=tuple(image.system_packages),
        # The image knows its vendor as a job does: `python -m orchestrator.runtime.preflight` in it
        # needs no profile folder and no YAML parser.
        image_env=tuple(sorted({**profile.image_env, ENV_VENDOR_PROFILE: profile.runtime_profile().to_json()}.items())),
        build_arg_names=tuple(sorted(args)),
        labels=tuple(stable.items()),
    )
    canonical = render_dockerfile(inputs)
    digest = content_digest(canonical, scan, requirements_files, wheel_hashes, wheel_fingerprint, args, platform,
                            base_image_id)
    deps = deps_digest(split_dockerfile(canonical)[0], requirements_files, wheel_hashes, wheel_fingerprint, args,
                       platform, base_image_id)
    labels = {**stable, **volatile}
    dockerfile = render_dockerfile(DockerfileInputs(**{**inputs.__dict__, "labels": tuple(labels.items())}))
    return BuildPlan(
        dockerfile=dockerfile, context=scan, requirements=requirements, wheelhouse=wh,
        wheelhouse_files=wh_files, wheel_name=wheel_name, wheel_fingerprint=wheel_fingerprint,
        build_args=args, platform=platform, tag=user_tag, content_tag=f"{repo}:wmctl-{digest[:12]}",
        digest=digest, deps_tag=f"{repo}:wmctl-deps-{deps[:12]}", labels=labels,
        requirements_files=requirements_files, torch_wheels=torch_wheels,
        base=base, base_image_id=base_image_id, wheels_images=wheels_images,
    )


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def context_summary(plan: BuildPlan, max_excluded: int = 20) -> str:
    scan = plan.context
    lines = [
        f"context: {scan.root}",
        f"  files: {len(scan.files)} ({human_size(scan.total_size)}), sent as src/ -> image WORKDIR",
        f"  .dockerignore: {scan.ignore_source}; excluded: {len(scan.excluded)}",
    ]
    for rel in scan.excluded[:max_excluded]:
        lines.append(f"    - {rel}")
    if len(scan.excluded) > max_excluded:
        lines.append(f"    ... and {len(scan.excluded) - max_excluded} more")
    lines.append(f"  runtime wheel: wmctl/wheels/{plan.wheel_name}")
    if plan.requirements is not None:
        lines.append(f"  requirements: {plan.requirements} -> {REQUIREMENTS_DIR}/{plan.requirements_files[0][0]}")
        for rel, _path in plan.requirements_files[1:]:
            lines.append(f"    named with -r/-c: {rel} -> {REQUIREMENTS_DIR}/{rel}")
    if plan.wheelhouse is not None:
        size = sum(s for _, s in plan.wheelhouse_files)
        lines.append(f"  wheelhouse (offline build, pip --no-index): {plan.wheelhouse} "
                     f"({len(plan.wheelhouse_files)} files, {human_size(size)}; stays in the image's layers)")
        for ref in plan.wheels_images.values():
            lines.append(f"    sent once, as {ref} (built when the engine lacks it); the build copies from it")
        if plan.torch_wheels:
            torch_size = sum(s for rel, s in plan.wheelhouse_files if rel in plan.torch_wheels)
            lines.append(f"    for the torch step: {len(plan.torch_wheels)} files ({human_size(torch_size)}); "
                         "the rest is copied just before the requirements step")
    if plan.base_image_id:
        lines.append(f"  base image: {plan.base} ({plan.base_image_id[7:19]}), its id is part of the content digest")
    else:
        lines.append(f"  base image: {plan.base}; its id is not part of this content digest (no engine "
                     "asked, or the engine does not have it yet)")
    if plan.build_args:
        lines.append("  build args: " + ", ".join(sorted(plan.build_args)))
    if plan.platform:
        lines.append(f"  platform: {plan.platform}")
    lines.append("tags:")
    lines.append(f"  {plan.tag}")
    lines.append(f"  {plan.content_tag}   (content tag: unchanged context -> up to date, no rebuild)")
    lines.append(f"  {plan.deps_tag}   (the dependency image: the lines above the split, built when the "
                 "engine lacks it; the job's layers are built FROM it)")
    return "\n".join(lines)
