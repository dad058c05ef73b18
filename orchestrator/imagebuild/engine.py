"""The engine side of a build: the context tar, the build with its progress, push.

Builds talk to the engine through ``adaptors.dockerapi`` (an ``ImageAPI``): plain HTTP on the
local socket when nothing needs a registry, the Docker SDK otherwise (a remote engine, a base
image the engine must pull with the user's credentials). Pushes use the SDK (``adaptors.docker``)."""

from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable

from ..adaptors import docker as sdk
from ..adaptors.dockerapi import EngineAPIError, ImageAPI, SdkImages, SocketImages, local_socket
from ..errors import BuildError, EngineUnavailable
from .context import REQUIREMENTS_DIR, WHEELHOUSE_DIR, WHEELHOUSE_TORCH_DIR
from .dockerfile import WHEELS_DOCKERFILE, WHEELS_LABEL
from .plan import WHEELS_IMAGE_REPO, BuildPlan, split_tag
from .progress import ANSI_RE, MISSING_WHEEL_RE, NO_VERSION_RE, Reporter, STEP_RE, Step, TAIL_LINES, short


# ---- engine ------------------------------------------------------------------------------------

def get_client(timeout: int = 600) -> Any:
    """A Docker client from the environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH),
    checked with a ping so an absent engine fails here, with the hint, not mid-build."""
    client = sdk.client(timeout=timeout)
    errors, rexc = sdk.errors()
    try:
        client.ping()
    except (errors.DockerException, rexc.ConnectionError) as exc:
        raise EngineUnavailable(f"cannot reach the Docker engine at {sdk.where()}: {exc}",
                                hint=sdk.ENGINE_HINT) from None
    return client


def connect() -> ImageAPI:
    """The engine the Docker environment names, for a build: its local socket without the SDK
    when it is local (DOCKER_HOST unset or unix://), else through the SDK (``get_client``)."""
    path = local_socket()
    return SocketImages(path) if path is not None else SdkImages(get_client())


def for_build(api: ImageAPI, plan: BuildPlan, pull: bool) -> ImageAPI:
    """The API to build ``plan`` with: the engine pulls a base image it lacks (or every base with
    ``pull``) with the registry credentials only the SDK sends, so that build goes through it."""
    if isinstance(api, SocketImages) and (pull or not plan.base_image_id):
        return SdkImages(get_client())
    return api


# ---- build context ---------------------------------------------------------------------------------

def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, fileobj=io.BytesIO(data))


def _add_file(tar: tarfile.TarFile, name: str, path: Path, mode: int | None = None) -> None:
    info = tar.gettarinfo(str(path), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if mode is not None:
        info.mode = mode
    if info.isreg():
        with open(path, "rb") as fh:
            tar.addfile(info, fh)
    else:
        tar.addfile(info)


def write_deps_context(plan: BuildPlan, wheel_path: Path, fileobj: IO[bytes]) -> int:
    """The dependency image's build context (its Dockerfile, the runtime wheel, the requirements
    files; no code, no wheelhouse) to ``fileobj``; return the number of entries."""
    count = 0
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "Dockerfile", plan.deps_dockerfile.encode("utf-8"))
        _add_file(tar, f"wmctl/wheels/{plan.wheel_name}", wheel_path, 0o644)
        count += 2
        for rel, path in plan.requirements_files:
            _add_file(tar, f"{REQUIREMENTS_DIR}/{rel}", path, 0o644)
            count += 1
        # No wheelhouse here: the Dockerfile copies it from the wheels image (write_wheels_context).
    return count


def write_code_context(plan: BuildPlan, fileobj: IO[bytes]) -> int:
    """The job's own build context (its Dockerfile FROM the dependency image, and the code: what a
    code-only rebuild sends) to ``fileobj``; return the number of entries."""
    count = 1
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "Dockerfile", plan.code_dockerfile.encode("utf-8"))
        root = plan.context.root
        _add_bytes_dir(tar, "src")
        for entry in plan.context.entries:
            _add_file(tar, f"src/{entry.rel}", root / entry.rel)
            count += 1
    return count


def write_wheels_context(plan: BuildPlan, folder: str, fileobj: IO[bytes]) -> int:
    """The build context of the wheels image ``plan.wheels_images[folder]``: its Dockerfile and
    that group of the wheelhouse (the torch step's wheels, or the rest); return the number of wheels."""
    if plan.wheelhouse is None:
        raise BuildError("internal: a wheels image is built only for an offline build (image.wheelhouse)")
    count = 0
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "Dockerfile", WHEELS_DOCKERFILE.encode("utf-8"))
        for rel, _size in plan.wheelhouse_files:
            if (WHEELHOUSE_TORCH_DIR if rel in plan.torch_wheels else WHEELHOUSE_DIR) == folder:
                _add_file(tar, f"{folder}/{rel}", plan.wheelhouse / rel, 0o644)
                count += 1
    return count


def _add_bytes_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    tar.addfile(info)


# ---- build ---------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    image_id: str
    tags: list[str]
    up_to_date: bool
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0
    wheels_built: list[str] = field(default_factory=list)   # wheels images this build had to make


def _failure(steps: list[Step], message: str, tail: Iterable[str]) -> BuildError:
    last = steps[-1] if steps else None
    where = f"step {last.number}/{last.total}: {short(last.instruction, 300)}" if last else "before the first step"
    lines = list(tail)
    text = f"image build failed at {where}\n  {message.strip()}"
    if lines:
        text += "\n  last output lines:\n" + "\n".join(f"    {line}" for line in lines)
    hint = None
    joined = "\n".join(lines + [message])
    missing = MISSING_WHEEL_RE.findall(joined) or NO_VERSION_RE.findall(joined)
    if missing:
        names = ", ".join(dict.fromkeys(missing))
        if last is not None and "--no-index" in last.instruction:
            hint = (f"the wheelhouse has no wheel for {names}: run `wmctl wheelhouse SPEC` on a machine with "
                    "a package index (or add the wheel to the folder), then build again")
        else:
            hint = f"pip cannot find {names}: check the name and version in image.requirements and the index"
    elif last is not None and last.instruction.startswith("FROM"):
        hint = "check image.base (or the vendor profile's base_image): the engine cannot find or pull it"
    return BuildError(text, hint=hint)


def _lines(chunks: Iterable[dict[str, Any]]):
    """Split the engine's stream chunks into whole lines (a chunk may hold part of a line)."""
    buf = ""
    for chunk in chunks:
        if "stream" in chunk:
            buf += chunk["stream"]
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                yield ("line", ANSI_RE.sub("", line).rstrip("\r"))
        else:
            if buf:
                yield ("line", ANSI_RE.sub("", buf))
                buf = ""
            yield ("chunk", chunk)
    if buf:
        yield ("line", ANSI_RE.sub("", buf))


def image_exists(api: ImageAPI, ref: str) -> str | None:
    """The engine's image id for ``ref``, or None when the engine does not have it."""
    try:
        return api.image_id(ref)
    except EngineAPIError as exc:
        raise BuildError(f"the Docker engine could not look up image {ref}: {exc.explanation}") from None


def _tag(api: ImageAPI, image: str, ref: str) -> None:
    repo, tag = split_tag(ref)
    try:
        api.tag(image, repo, tag)
    except EngineAPIError as exc:
        raise BuildError(f"the Docker engine could not tag {image[:19]} as {ref}: {exc.explanation}") from None


def build_image(plan: BuildPlan, wheel_path: Path, *, client: ImageAPI | None = None,
                reporter: Reporter | None = None, no_cache: bool = False, network_mode: str | None = None,
                pull: bool = False) -> BuildResult:
    """Build ``plan`` (or report it up to date). Raises BuildError with the failing step.
    The reporter is closed on every way out, so a live spinner never outlives the build."""
    reporter = reporter or Reporter()
    try:
        return _build(plan, wheel_path, client or connect(), reporter, no_cache, network_mode, pull)
    finally:
        reporter.close()


def _build(plan: BuildPlan, wheel_path: Path, api: ImageAPI, reporter: Reporter, no_cache: bool,
           network_mode: str | None, pull: bool) -> BuildResult:
    t0 = time.monotonic()
    if not no_cache:
        existing = image_exists(api, plan.content_tag)
        if existing:
            _tag(api, existing, plan.tag)
            reporter.result(f"up to date: {plan.content_tag} ({existing[7:19]}); tagged {plan.tag}")
            return BuildResult(existing, plan.tags, True, [], time.monotonic() - t0)

    wheels_built: list[str] = []
    steps: list[Step] = []
    if no_cache or image_exists(api, plan.deps_tag) is None:
        for folder, ref in plan.wheels_images.items():
            if no_cache or image_exists(api, ref) is None:
                _build_wheels_image(plan, folder, ref, api, reporter, no_cache)
                wheels_built.append(ref)
        with tempfile.TemporaryFile(prefix="wmctl-deps-") as ctx:
            write_deps_context(plan, wheel_path, ctx)
            ctx.seek(0)
            reporter.status(f"building the dependency image {plan.deps_tag} (once per its content)")
            _deps_id, steps = _run_build(for_build(api, plan, pull), reporter, ctx, tag=plan.deps_tag,
                                         no_cache=no_cache, pull=pull, build_args=plan.build_args,
                                         platform=plan.platform, network_mode=network_mode)
    with tempfile.TemporaryFile(prefix="wmctl-context-") as ctx:
        write_code_context(plan, ctx)
        ctx.seek(0)
        reporter.status(f"sending the code to {os.environ.get('DOCKER_HOST') or 'the local engine'}")
        # FROM the dependency image the engine has: nothing to pull, no build arg to consume.
        image_id, code_steps = _run_build(api, reporter, ctx, tag=plan.tag, no_cache=no_cache, pull=False,
                                          build_args={}, platform=plan.platform, network_mode=network_mode)
    steps += code_steps
    if not image_id.startswith("sha256:"):     # only "Successfully built <short id>" came: ask for the full one
        image_id = image_exists(api, image_id) or image_id
    _tag(api, image_id, plan.content_tag)
    seconds = time.monotonic() - t0
    cached = sum(1 for s in steps if s.cached)
    reporter.result(f"built {image_id[7:19]} in {seconds:.1f}s ({cached}/{len(steps)} steps cached): "
                    + ", ".join(plan.tags))
    return BuildResult(image_id, plan.tags, False, steps, seconds, wheels_built)


def _build_wheels_image(plan: BuildPlan, folder: str, ref: str, api: ImageAPI, reporter: Reporter,
                        no_cache: bool) -> None:
    """Send one group of the wheelhouse to the engine once, as ``ref`` (FROM scratch, no network)."""
    with tempfile.TemporaryFile(prefix="wmctl-wheels-") as ctx:
        count = write_wheels_context(plan, folder, ctx)
        ctx.seek(0)
        reporter.status(f"sending {count} wheels of the wheelhouse as {ref}, once per content")
        _run_build(api, reporter, ctx, tag=ref, no_cache=no_cache, pull=False, build_args={},
                   platform=plan.platform, network_mode="none")


def _run_build(api: ImageAPI, reporter: Reporter, ctx: IO[bytes], *, tag: str,  # noqa: C901 (one pass over the stream)
               no_cache: bool, pull: bool, build_args: dict[str, str], platform: str | None,
               network_mode: str | None) -> tuple[str, list[Step]]:
    """One engine build of the context tar ``ctx``, its steps reported: (image id, steps)."""
    steps: list[Step] = []
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    image_id = None
    pull_status: dict[str, str] = {}
    try:
        stream = api.build(ctx, tag=tag, no_cache=no_cache, pull=pull, build_args=build_args or None,
                           platform=platform, network_mode=network_mode)
        for kind, item in _lines(stream):
            if kind == "line":
                match = STEP_RE.match(item)
                if match:
                    steps.append(Step(int(match.group(1)), int(match.group(2)), match.group(3)))
                    tail.clear()
                    reporter.step(steps[-1])
                    continue
                if steps and "Using cache" in item:
                    steps[-1].cached = True
                if steps:
                    steps[-1].output.append(item)
                if item.strip() and not item.startswith((" ---> ", "Removing intermediate container")):
                    tail.append(item)
                done = re.match(r"^Successfully built ([0-9a-f]+)", item)
                if done:
                    image_id = image_id or done.group(1)
                reporter.line(item)
            elif "error" in item:
                detail = item.get("errorDetail") or {}
                raise _failure(steps, detail.get("message") or item["error"], tail)
            elif "aux" in item and isinstance(item["aux"], dict) and "ID" in item["aux"]:
                image_id = item["aux"]["ID"]
            elif "status" in item:
                key = item.get("id", "")
                if pull_status.get(key) != item["status"]:
                    pull_status[key] = item["status"]
                    reporter.status(f"{key + ': ' if key else ''}{item['status']}")
    except EngineAPIError as exc:
        raise _failure(steps, exc.explanation, tail) from None
    if image_id is None:
        raise _failure(steps, "the engine ended the build without an image id", tail)
    return image_id, steps


# ---- wheels images of other wheelhouses --------------------------------------------------------------

def _our_wheels_tags(image: dict[str, Any]) -> list[str]:
    return [t for t in image.get("RepoTags") or [] if t.startswith(WHEELS_IMAGE_REPO + ":")]


def stale_wheels_images(api: ImageAPI, plan: BuildPlan) -> list[dict[str, Any]]:
    """The wheels images wmctl made (its label, its repository, or no tag left at all) that this
    build does not use: each dependency change leaves one behind. A job image does not need them
    once built (COPY --from copied the wheels); a later build of another wheelhouse sends its own
    again."""
    keep = set(plan.wheels_images.values())
    try:
        found = api.list_images(WHEELS_LABEL)
    except EngineAPIError as exc:
        raise BuildError(f"the Docker engine could not list the wheels images: {exc.explanation}") from None
    stale = []
    for image in found:
        tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
        ours = _our_wheels_tags(image)
        if (ours or not tags) and not keep.intersection(tags):
            stale.append(image)
    return stale


def prune_wheels_images(api: ImageAPI, images: list[dict[str, Any]]) -> int:
    """Remove wmctl's tags of these wheels images (an image with no tag left goes with them; one
    someone else tagged too keeps that tag): the number of images handled."""
    done = 0
    for image in images:
        refs = _our_wheels_tags(image) or [str(image.get("Id", ""))]
        try:
            for ref in refs:
                api.remove_image(ref)
        except EngineAPIError as exc:
            raise BuildError(f"the Docker engine could not remove {refs[0]}: {exc.explanation}") from None
        done += 1
    return done


# ---- push ------------------------------------------------------------------------------------------------

def registry_of(repo: str) -> str | None:
    first = repo.split("/", 1)[0]
    if "/" in repo and (("." in first) or (":" in first) or first == "localhost"):
        return first
    return None


_AUTH_WORDS = ("unauthorized", "authentication required", "denied", "no basic auth credentials",
               "incorrect username or password", "forbidden")
# Only what says the registry itself could not be reached or spoken to. A bare "not found" is not
# here: "manifest unknown", "repository name not known" or a missing local tag also say it, and
# calling those "unreachable" sends the user to check the network for nothing.
_REACH_WORDS = ("no such host", "connection refused", "dial tcp", "i/o timeout", "server misbehaving",
                "http response to https client", "no route to host", "network is unreachable", "tls:",
                "x509", "404 page not found")
_NO_LOCAL_IMAGE = "does not exist locally"


def _push_error(registry: str, text: str) -> BuildError:
    low = text.lower()
    if any(w in low for w in _AUTH_WORDS):
        return BuildError(f"push to {registry} was refused: {text.strip()}",
                          hint=f"log in first (docker login {registry}) or check that you may push to this repository")
    if any(w in low for w in _REACH_WORDS):
        hint = f"check the registry address {registry!r} in the tag, and that it is reachable from the Docker engine"
        if "https" in low:
            hint += "; a plain-HTTP registry must be listed in the engine's insecure-registries"
        return BuildError(f"cannot reach registry {registry}: {text.strip()}", hint=hint)
    if _NO_LOCAL_IMAGE in low:
        return BuildError(f"push to {registry} failed: {text.strip()}",
                          hint="the engine has no image with that tag: build it first (wmctl build-image SPEC --push)")
    return BuildError(f"push to {registry} failed: {text.strip()}")


def push_image(ref: str, *, client=None, reporter: Reporter | None = None) -> str:
    """Push ``ref`` (repo:tag) and return the pushed manifest digest (``sha256:...``).
    The reporter is closed on every way out."""
    reporter = reporter or Reporter()
    try:
        return _push(ref, client, reporter)
    finally:
        reporter.close()


def _push(ref: str, client, reporter: Reporter) -> str:
    docker_errors = sdk.errors()[0]

    repo, tag = split_tag(ref)
    registry = registry_of(repo)
    if registry is None:
        raise BuildError(f"--push: {ref!r} names no registry, so it would go to Docker Hub's "
                         f"{repo.split('/')[0]!r} namespace",
                         hint="put the registry in the tag, e.g. --tag registry.example.com/team/name:v1")
    client = client or get_client()
    digest = None
    layer_status: dict[str, str] = {}
    try:
        for item in client.api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in item:
                detail = item.get("errorDetail") or {}
                raise _push_error(registry, detail.get("message") or item["error"])
            aux = item.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest = aux["Digest"]
            status = item.get("status")
            if status:
                found = re.search(r"digest: (sha256:[0-9a-f]{64})", status)
                if found:
                    digest = digest or found.group(1)
                key = item.get("id", "")
                if layer_status.get(key) != status:
                    layer_status[key] = status
                    reporter.line(f"{key + ': ' if key else ''}{status}")
    except docker_errors.APIError as exc:
        raise _push_error(registry, exc.explanation or str(exc)) from None
    except docker_errors.DockerException as exc:
        raise _push_error(registry, str(exc)) from None
    if not digest:
        raise BuildError(f"push of {ref} ended without a digest from {registry}")
    reporter.result(f"pushed {ref}: {repo}@{digest}")
    return digest
