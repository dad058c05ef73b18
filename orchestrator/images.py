"""Build and push a job's image on a real Docker engine (the Docker SDK, honouring DOCKER_HOST).

``dockerfile.plan_build`` decides what to build; this module sends it: it writes the build
context tar (``Dockerfile``, ``wmctl/``, ``src/``), streams the engine's build output to a
reporter, turns a failed step into a BuildError with the step and its last output lines, tags
the result with the content tag, pushes, and records what was built and pushed in
``<spec folder>/.wmctl/images.json``; ``render`` and ``submit`` then run the pushed digest
instead of the tag (``pinned_ref``, called from ``commands._common.load``).

``docker`` is imported inside the functions: the CLI and ``--dry-run`` never load it.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable

from .dockerfile import REQUIREMENTS_DIR, WHEELHOUSE_DIR, WHEELHOUSE_TORCH_DIR, BuildPlan, split_tag
from .errors import BuildError, EngineUnavailable

TAIL_LINES = 25
RECORD_FILE = Path(".wmctl") / "images.json"


# ---- engine ------------------------------------------------------------------------------------

def get_client(timeout: int = 600):
    """A Docker client from the environment (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    try:
        import docker
        import docker.errors
    except ImportError:
        raise EngineUnavailable("the docker Python package is not installed",
                                hint="pip install docker (it is a wmctl dependency)") from None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST") or "the local socket (unix:///var/run/docker.sock)"
        raise EngineUnavailable(f"cannot reach the Docker engine at {where}: {exc}",
                                hint="start dockerd (e.g. .ci/start-dockerd.sh) or set DOCKER_HOST") from None
    return client


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


def write_context(plan: BuildPlan, wheel_path: Path, fileobj: IO[bytes]) -> int:
    """Write the build context tar for ``plan`` to ``fileobj``; return the number of entries."""
    count = 0
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "Dockerfile", plan.dockerfile.encode("utf-8"))
        _add_file(tar, f"wmctl/wheels/{plan.wheel_name}", wheel_path, 0o644)
        count += 2
        for rel, path in plan.requirements_files:
            _add_file(tar, f"{REQUIREMENTS_DIR}/{rel}", path, 0o644)
            count += 1
        if plan.wheelhouse is not None:
            for rel, _size in plan.wheelhouse_files:
                folder = WHEELHOUSE_TORCH_DIR if rel in plan.torch_wheels else WHEELHOUSE_DIR
                _add_file(tar, f"{folder}/{rel}", plan.wheelhouse / rel, 0o644)
                count += 1
        root = plan.context.root
        _add_bytes_dir(tar, "src")
        for entry in plan.context.entries:
            _add_file(tar, f"src/{entry.rel}", root / entry.rel)
            count += 1
    return count


def _add_bytes_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    tar.addfile(info)


# ---- progress ----------------------------------------------------------------------------------------

# The legacy builder colours a step's stderr red with raw escape codes.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
MISSING_WHEEL_RE = re.compile(r"No matching distribution found for ([^\s]+)")
NO_VERSION_RE = re.compile(r"Could not find a version that satisfies the requirement ([^\s]+)")


@dataclass
class Step:
    number: int
    total: int
    instruction: str
    cached: bool = False
    output: list[str] = field(default_factory=list)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 70] + " ... " + text[-65:]


class Reporter:
    """Plain lines (CI logs, pipes); ``quiet`` keeps only results and errors."""

    def __init__(self, stream: IO[str] | None = None, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.quiet = quiet

    def step(self, step: Step) -> None:
        if not self.quiet:
            self._print(f"Step {step.number}/{step.total} : {_short(step.instruction)}")

    def line(self, text: str) -> None:
        if not self.quiet:
            self._print(text)

    def status(self, text: str) -> None:
        if not self.quiet:
            self._print(text)

    def result(self, text: str) -> None:
        self._print(text)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class RichReporter(Reporter):
    """A live spinner with the current step, the step list scrolling above it."""

    def __init__(self) -> None:
        from rich.console import Console

        super().__init__()
        self.console = Console()
        self._status = self.console.status("starting build")
        self._status.start()
        self._running = True

    def step(self, step: Step) -> None:
        self.console.print(f"[bold]Step {step.number}/{step.total}[/bold] {_short(step.instruction, 110)}",
                           markup=True, highlight=False)
        self._status.update(f"step {step.number}/{step.total}")

    def line(self, text: str) -> None:
        if "Using cache" in text:
            self.console.print("  [green]cached[/green]", markup=True)
        elif text.startswith(" ---> ") or text.startswith("Removing intermediate"):
            return
        else:
            self.console.print(f"  [dim]{_escape(text)}[/dim]", markup=True, highlight=False)

    def status(self, text: str) -> None:
        self._status.update(text)

    def result(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        # Called by build_image, push_image and the command's `with`: stop the live display once.
        if self._running:
            self._running = False
            self._status.stop()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def make_reporter(quiet: bool) -> Reporter:
    if not quiet and sys.stdout.isatty():
        return RichReporter()
    return Reporter(quiet=quiet)


# ---- build ---------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    image_id: str
    tags: list[str]
    up_to_date: bool
    steps: list[Step] = field(default_factory=list)
    seconds: float = 0.0


def _failure(steps: list[Step], message: str, tail: Iterable[str]) -> BuildError:
    last = steps[-1] if steps else None
    where = f"step {last.number}/{last.total}: {_short(last.instruction, 300)}" if last else "before the first step"
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


def image_exists(client, ref: str) -> str | None:
    """The engine's image id for ``ref``, or None when the engine does not have it."""
    import docker.errors

    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def build_image(plan: BuildPlan, wheel_path: Path, *, client=None, reporter: Reporter | None = None,
                no_cache: bool = False, network_mode: str | None = None, pull: bool = False) -> BuildResult:
    """Build ``plan`` (or report it up to date). Raises BuildError with the failing step.
    The reporter is closed on every way out, so a live spinner never outlives the build."""
    reporter = reporter or Reporter()
    try:
        return _build(plan, wheel_path, client or get_client(), reporter, no_cache, network_mode, pull)
    finally:
        reporter.close()


def _build(plan: BuildPlan, wheel_path: Path, client, reporter: Reporter, no_cache: bool,
           network_mode: str | None, pull: bool) -> BuildResult:
    import docker.errors

    t0 = time.monotonic()
    if not no_cache:
        existing = image_exists(client, plan.content_tag)
        if existing:
            repo, tag = split_tag(plan.tag)
            client.api.tag(existing, repo, tag)
            reporter.result(f"up to date: {plan.content_tag} ({existing[7:19]}); tagged {plan.tag}")
            return BuildResult(existing, plan.tags, True, [], time.monotonic() - t0)

    steps: list[Step] = []
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    image_id = None
    pull_status: dict[str, str] = {}
    with tempfile.TemporaryFile(prefix="wmctl-context-") as ctx:
        write_context(plan, wheel_path, ctx)
        ctx.seek(0)
        reporter.status(f"sending build context to {os.environ.get('DOCKER_HOST') or 'the local engine'}")
        try:
            stream = client.api.build(
                fileobj=ctx, custom_context=True, dockerfile="Dockerfile", tag=plan.tag, rm=True,
                forcerm=True, nocache=no_cache, pull=pull, buildargs=plan.build_args or None,
                platform=plan.platform, network_mode=network_mode, decode=True,
            )
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
        except docker.errors.APIError as exc:
            raise _failure(steps, exc.explanation or str(exc), tail) from None
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"the Docker engine failed during the build: {exc}") from None
    if image_id is None:
        raise _failure(steps, "the engine ended the build without an image id", tail)
    repo, tag = split_tag(plan.content_tag)
    client.api.tag(image_id, repo, tag)
    image_id = client.images.get(image_id).id
    seconds = time.monotonic() - t0
    cached = sum(1 for s in steps if s.cached)
    reporter.result(f"built {image_id[7:19]} in {seconds:.1f}s ({cached}/{len(steps)} steps cached): "
                    + ", ".join(plan.tags))
    return BuildResult(image_id, plan.tags, False, steps, seconds)


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
    import docker.errors

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
    except docker.errors.APIError as exc:
        raise _push_error(registry, exc.explanation or str(exc)) from None
    except docker.errors.DockerException as exc:
        raise _push_error(registry, str(exc)) from None
    if not digest:
        raise BuildError(f"push of {ref} ended without a digest from {registry}")
    reporter.result(f"pushed {ref}: {repo}@{digest}")
    return digest


# ---- record -----------------------------------------------------------------------------------------------

# What a push adds to a record; it describes the pushed image, so it goes when the image does.
PUSH_FIELDS = ("repo_digest", "digest", "pushed_at")


def record_path(spec_path: Path) -> Path:
    return Path(spec_path).resolve().parent / RECORD_FILE


def load_records(spec_path: Path) -> dict[str, Any]:
    path = record_path(spec_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path} is not readable JSON ({exc}); delete it and build again") from None
    return data if isinstance(data, dict) else {}


def record_image(spec_path: Path, name: str, entry: dict[str, Any]) -> Path:
    """Merge ``entry`` into the record for job ``name`` (atomic write). A digest recorded by an
    earlier push survives only while the image id and the tag stay the same: after a rebuild
    without --push it would name other bytes than the tag now holds."""
    path = record_path(spec_path)
    data = load_records(spec_path)
    old = data.get(name)
    old = dict(old) if isinstance(old, dict) else {}
    if old.get("image_id") != entry.get("image_id") or old.get("tag") != entry.get("tag"):
        for key in PUSH_FIELDS:
            old.pop(key, None)
    data[name] = {**old, **entry}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def recorded_image(spec_path: Path, name: str) -> dict[str, Any] | None:
    """What build-image recorded for job ``name``: tag, content_tag, image_id, and after a push
    ``repo_digest`` (``registry/repo@sha256:...``), the reference ``submit`` should run."""
    entry = load_records(spec_path).get(name)
    return entry if isinstance(entry, dict) else None


def _with_tag(ref: str) -> str:
    return ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"


def pinned_ref(spec_path: Path, name: str, tag: str) -> str | None:
    """The pushed ``repo@sha256:...`` the build record holds for ``tag``, or None. Only a record
    made for this very tag (or its content tag) counts, and only a digest in the tag's own
    repository: a record for another tag or registry says nothing about what ``tag`` holds."""
    if "@" in tag:
        return None
    entry = recorded_image(spec_path, name) or {}
    ref = entry.get("repo_digest")
    if not isinstance(ref, str) or not re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", ref):
        return None
    wanted = _with_tag(tag)
    if wanted not in (entry.get("tag"), entry.get("content_tag")):
        return None
    if ref.split("@", 1)[0] != wanted.rsplit(":", 1)[0]:
        return None
    return ref


def image_ref_for_submit(spec_path: Path, name: str, tag: str) -> str:
    """The pushed digest reference for ``tag`` when one was recorded, else ``tag`` itself."""
    return pinned_ref(spec_path, name, tag) or tag


__all__ = [
    "BuildResult", "Reporter", "RichReporter", "Step", "build_image", "get_client", "image_exists",
    "image_ref_for_submit", "load_records", "make_reporter", "pinned_ref", "push_image", "record_image",
    "record_path", "recorded_image", "registry_of", "write_context",
]
