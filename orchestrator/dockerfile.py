"""The Dockerfile and the build context for a job's image: pure rendering, no engine.

``plan_build(spec, profile, ...)`` gathers everything a build needs (the Dockerfile text, the
files of the context after ``.dockerignore``, the tags, the content digest) without importing
docker; ``images.py`` turns a ``BuildPlan`` into a real build and ``--dry-run`` prints it.

Safety: nothing from the spec or a profile can add a Dockerfile instruction. References and
paths are checked against a fixed alphabet before rendering; every other value is emitted as a
JSON string inside an exec-form array (no shell, no Docker variable expansion for RUN) or as a
double-quoted word with ``\\ " $`` escaped; control and line-separator characters are refused.

Build context layout (the tar sent to the engine)::

    Dockerfile
    wmctl/wheels/wmctl-<version>-py3-none-any.whl   the runtime, same version as this CLI
    wmctl/requirements.txt                          a copy of image.requirements (if set)
    wmctl/wheelhouse/...                            image.wheelhouse (offline builds only)
    src/...                                         image.context minus .dockerignore
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import BuildError

# ---- value checks and filters --------------------------------------------------------------

IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_PATH = re.compile(r"^/[A-Za-z0-9._\-/]*$")
DEB_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(=[A-Za-z0-9.+~:\-]+)?$")
# Characters a Dockerfile line may not carry: C0/C1 controls (newline, CR, tab, ...), DEL and
# the Unicode line/paragraph separators (some parsers split lines on them).
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_single_line(value: str, field_name: str) -> str:
    if not isinstance(value, str):
        raise BuildError(f"{field_name}: expected a string, got {type(value).__name__}")
    bad = _BAD_CHARS.search(value)
    if bad:
        raise BuildError(f"{field_name}: {value!r} contains the control character {bad.group()!r}; "
                         "values baked into an image must be a single line without control characters")
    return value


def check_ref(value: str, field_name: str) -> str:
    check_single_line(value, field_name)
    if not IMAGE_REF.match(value) or len(value) > 255:
        raise BuildError(f"{field_name}: {value!r} is not a valid image reference "
                         "(letters, digits, . _ - / : @), e.g. registry.example.com/team/worldmodel:v3")
    return value


def check_ident(value: str, field_name: str) -> str:
    check_single_line(value, field_name)
    if not IDENT.match(value):
        raise BuildError(f"{field_name}: {value!r} is not a valid variable name (letters, digits and _, "
                         "not starting with a digit)")
    return value


def check_image_path(value: str, field_name: str) -> str:
    check_single_line(value, field_name)
    if not IMAGE_PATH.match(value) or "/../" in value + "/" or value.endswith("/.."):
        raise BuildError(f"{field_name}: {value!r} must be an absolute path of letters, digits and . _ - /, "
                         "e.g. /workspace")
    return value


def dq(value: Any) -> str:
    """A double-quoted Dockerfile word that reads back as exactly ``value``."""
    text = check_single_line(str(value), "value")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def execform(items: Sequence[Any]) -> str:
    """A JSON array for exec-form RUN/COPY: no shell parses it. ASCII-only JSON: newlines, quotes,
    line separators and every non-ASCII character become escapes, so the array stays one line."""
    return json.dumps([str(x) for x in items], ensure_ascii=True)


# ---- .dockerignore (moby patternmatcher semantics) -------------------------------------------

@dataclass(frozen=True)
class IgnorePattern:
    text: str
    exclusion: bool  # a "!" line: re-include what earlier lines excluded
    regex: re.Pattern


def _compile_pattern(pattern: str) -> re.Pattern:
    out = ["^"]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern[i + 1:i + 2] == "*":
                i += 1
                if pattern[i + 1:i + 2] == "/":
                    i += 1
                    out.append("(.*/)?")
                else:
                    out.append(".*")
            else:
                out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1:end]
                if body.startswith("^"):
                    body = "^" + body[1:].replace("\\", "\\\\")
                else:
                    body = body.replace("\\", "\\\\")
                out.append("[" + body + "]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    out.append("$")
    return re.compile("".join(out))


def parse_dockerignore(text: str) -> list[IgnorePattern]:
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        if exclusion:
            line = line[1:].strip()
        cleaned = os.path.normpath(line).replace(os.sep, "/")
        cleaned = cleaned.lstrip("/") or "."
        patterns.append(IgnorePattern(raw.strip(), exclusion, _compile_pattern(cleaned)))
    return patterns


def is_ignored(rel: str, patterns: Sequence[IgnorePattern]) -> bool:
    """Docker's rule: a path is excluded when it or one of its parents matches; the last match wins."""
    parts = rel.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for pat in patterns:
        if any(pat.regex.match(c) for c in candidates):
            excluded = not pat.exclusion
    return excluded


# ---- the context -----------------------------------------------------------------------------

# Never sent: wmctl's own state next to the spec (images.json changes after every build and
# would bust the code layer).
ALWAYS_EXCLUDED = (".wmctl",)


@dataclass(frozen=True)
class ContextEntry:
    rel: str           # posix path relative to the context
    kind: str          # "file", "dir" or "symlink"
    size: int
    mode: int


@dataclass
class ContextScan:
    root: Path
    entries: list[ContextEntry]
    excluded: list[str]                # top-most excluded paths (a dir stands for its contents)
    ignore_source: str                 # ".dockerignore", "default" or "none"

    @property
    def files(self) -> list[ContextEntry]:
        return [e for e in self.entries if e.kind != "dir"]

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")


def default_dockerignore() -> str:
    from .resources import templates_dir

    path = templates_dir() / "dockerignore.default"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def load_ignore(root: Path) -> tuple[list[IgnorePattern], str]:
    own = root / ".dockerignore"
    if own.is_file():
        return parse_dockerignore(own.read_text(encoding="utf-8", errors="replace")), ".dockerignore"
    text = default_dockerignore()
    return parse_dockerignore(text), ("default" if text.strip() else "none")


def scan_context(root: Path, extra_excluded: Iterable[str] = ()) -> ContextScan:
    """Walk ``root`` the way ``docker build`` would send it: .dockerignore applied, no links followed."""
    root = Path(root)
    if not root.is_dir():
        raise BuildError(f"image.context: {root} is not a directory; set image.context to the folder "
                         "with your training code (relative to the spec file)")
    patterns, source = load_ignore(root)
    forced = [*ALWAYS_EXCLUDED, *extra_excluded]
    has_exclusions = any(p.exclusion for p in patterns)
    entries: list[ContextEntry] = []
    excluded: list[str] = []

    def dropped(rel: str) -> bool:
        return any(rel == f or rel.startswith(f + "/") for f in forced) or is_ignored(rel, patterns)

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        keep_dirs = []
        for d in dirnames:
            rel = prefix + d
            full = Path(dirpath) / d
            if full.is_symlink():
                filenames.append(d)  # a link to a directory travels as a link
                continue
            if dropped(rel):
                excluded.append(rel + "/")
                # With "!" lines something below may come back, so look inside.
                if not has_exclusions or any(rel == f or rel.startswith(f + "/") for f in forced):
                    continue
            keep_dirs.append(d)
            if not dropped(rel):
                st = full.lstat()
                entries.append(ContextEntry(rel, "dir", 0, stat.S_IMODE(st.st_mode)))
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            rel = prefix + name
            full = Path(dirpath) / name
            if dropped(rel):
                if not any(rel.startswith(e) for e in excluded if e.endswith("/")):
                    excluded.append(rel)
                continue
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append(ContextEntry(rel, "symlink", 0, 0o777))
            elif stat.S_ISREG(st.st_mode):
                entries.append(ContextEntry(rel, "file", st.st_size, stat.S_IMODE(st.st_mode)))
            # sockets, fifos, devices: docker refuses them too; leave them out
    entries.sort(key=lambda e: e.rel)
    return ContextScan(root, entries, sorted(excluded), source)


# ---- metadata --------------------------------------------------------------------------------

def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def strip_userinfo(url: str) -> str:
    """https://user:token@host/x -> https://host/x: credentials never go into a label."""
    return re.sub(r"^([a-z][a-z0-9+.\-]*://)[^/@]*@", r"\1", url)


def source_metadata(root: Path) -> dict[str, str]:
    remote = _git(root, "config", "--get", "remote.origin.url")
    rev = _git(root, "rev-parse", "HEAD")
    meta = {"source": strip_userinfo(remote) if remote else Path(root).resolve().as_uri()}
    if rev:
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
        meta["revision"] = rev + ("-dirty" if dirty else "")
    return meta


def created_timestamp() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch and epoch.isdigit()
            else _dt.datetime.now(_dt.timezone.utc))
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


# ---- the Dockerfile ----------------------------------------------------------------------------

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
    torch_packages: tuple[str, ...] = ()
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
        from .resources import templates_dir

        template_text = (templates_dir() / "Dockerfile.j2").read_text(encoding="utf-8")
    env = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters.update(dq=dq, execform=execform, ident=_ident_filter, ref=_ref_filter, path=_path_filter)
    pip_source = ["--no-index", "--find-links", "/tmp/wmctl/wheelhouse/"] if inputs.offline else []
    packages = list(inputs.optional_packages) + list(inputs.required_packages)
    text = env.from_string(template_text).render(
        job_name=inputs.job_name, vendor=inputs.vendor, base=inputs.base, python=inputs.python,
        workdir=inputs.workdir.rstrip("/") or "/", wheel_name=inputs.wheel_name,
        wmctl_version=inputs.wmctl_version, offline=inputs.offline, requirements=inputs.requirements,
        torch_packages=list(inputs.torch_packages), pip_source=pip_source,
        system_packages=packages, optional_count=str(len(inputs.optional_packages)),
        offline_flag="1" if inputs.offline else "0", apt_script=APT_SCRIPT, check_script=CHECK_SCRIPT,
        image_env=list(inputs.image_env), build_arg_names=list(inputs.build_arg_names),
        labels=list(inputs.labels),
    )
    return text if text.endswith("\n") else text + "\n"


# ---- the whole build plan ------------------------------------------------------------------------

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
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> list[str]:
        return [self.tag, self.content_tag]


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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_digest(dockerfile_canonical: str, scan: ContextScan, requirements: Path | None,
                   wheelhouse_files: list[tuple[str, int]], wheel_fingerprint: str,
                   build_args: dict[str, str], platform: str | None) -> str:
    """sha256 of everything that decides the image's content (not its build time or git rev)."""
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape"))
            h.update(b"\0")

    put("dockerfile", dockerfile_canonical)
    for e in scan.entries:
        if e.kind == "file":
            put("file", e.rel, oct(e.mode & 0o111), _file_sha256(scan.root / e.rel))
        elif e.kind == "symlink":
            put("link", e.rel, os.readlink(scan.root / e.rel))
        else:
            put("dir", e.rel)
    if requirements is not None:
        put("requirements", _file_sha256(requirements))
    for name, size in wheelhouse_files:  # wheels are immutable by file name; size guards a swap
        put("wheelhouse", name, str(size))
    put("wheel", wheel_fingerprint)
    for key in sorted(build_args):
        put("arg", key, build_args[key])
    put("platform", platform or "")
    return h.hexdigest()


def _wheelhouse_files(path: Path) -> list[tuple[str, int]]:
    if not path.is_dir():
        raise BuildError(f"image.wheelhouse / --wheelhouse: {path} is not a directory",
                         hint="fill it with `wmctl wheelhouse SPEC --dir DIR` on a machine with a package index")
    files = sorted((p.relative_to(path).as_posix(), p.stat().st_size) for p in path.rglob("*") if p.is_file())
    if not files:
        raise BuildError(f"image.wheelhouse / --wheelhouse: {path} is empty",
                         hint="fill it with `wmctl wheelhouse SPEC --dir DIR` on a machine with a package index")
    return files


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def plan_build(spec: Any, profile: Any, *, wheel_name: str, wheel_fingerprint: str, wmctl_version: str,
               tag: str | None = None, wheelhouse: Path | None = None,
               build_args: dict[str, str] | None = None, platform: str | None = None,
               created: str | None = None, source: dict[str, str] | None = None) -> BuildPlan:
    """Everything ``docker build`` will get, from a loaded JobSpec and its VendorProfile."""
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
    if image.requirements:
        check_single_line(image.requirements, "image.requirements")
        requirements = (root / image.requirements)
        if not _inside(requirements, root):
            raise BuildError(f"image.requirements: {image.requirements!r} is outside image.context ({root})")
        if not requirements.is_file():
            raise BuildError(f"image.requirements: {requirements} does not exist",
                             hint="give a path relative to image.context, e.g. requirements.txt")

    wh = Path(wheelhouse) if wheelhouse is not None else spec.wheelhouse_dir
    wh_files = _wheelhouse_files(wh) if wh is not None else []
    extra_excluded = []
    if wh is not None and _inside(wh, root) and wh.resolve() != root.resolve():
        # The wheelhouse travels as wmctl/wheelhouse; a second copy under src/ would double the
        # image and bust the code layer whenever a wheel is added.
        extra_excluded.append(wh.resolve().relative_to(root.resolve()).as_posix())
    scan = scan_context(root, extra_excluded)

    meta = source if source is not None else source_metadata(root)
    volatile = {"org.opencontainers.image.created": created or created_timestamp(),
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
        torch_packages=tuple(profile.torch_packages) if profile.pip_install_torch else (),
        optional_packages=tuple(profile.system_packages), required_packages=tuple(image.system_packages),
        image_env=tuple(sorted(profile.image_env.items())), build_arg_names=tuple(sorted(args)),
        labels=tuple(stable.items()),
    )
    canonical = render_dockerfile(inputs)
    digest = content_digest(canonical, scan, requirements, wh_files, wheel_fingerprint, args, platform)
    labels = {**stable, "io.wmctl.content-digest": digest[:12], **volatile}
    dockerfile = render_dockerfile(DockerfileInputs(**{**inputs.__dict__, "labels": tuple(labels.items())}))
    return BuildPlan(
        dockerfile=dockerfile, context=scan, requirements=requirements, wheelhouse=wh,
        wheelhouse_files=wh_files, wheel_name=wheel_name, wheel_fingerprint=wheel_fingerprint,
        build_args=args, platform=platform, tag=user_tag, content_tag=f"{repo}:wmctl-{digest[:12]}",
        digest=digest, labels=labels,
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def context_summary(plan: BuildPlan, max_excluded: int = 20) -> str:
    scan = plan.context
    lines = [
        f"context: {scan.root}",
        f"  files: {len(scan.files)} ({_human(scan.total_size)}), sent as src/ -> image WORKDIR",
        f"  .dockerignore: {scan.ignore_source}; excluded: {len(scan.excluded)}",
    ]
    for rel in scan.excluded[:max_excluded]:
        lines.append(f"    - {rel}")
    if len(scan.excluded) > max_excluded:
        lines.append(f"    ... and {len(scan.excluded) - max_excluded} more")
    lines.append(f"  runtime wheel: wmctl/wheels/{plan.wheel_name}")
    if plan.requirements is not None:
        lines.append(f"  requirements: {plan.requirements} -> wmctl/requirements.txt")
    if plan.wheelhouse is not None:
        size = sum(s for _, s in plan.wheelhouse_files)
        lines.append(f"  wheelhouse (offline build, pip --no-index): {plan.wheelhouse} "
                     f"({len(plan.wheelhouse_files)} files, {_human(size)})")
    if plan.build_args:
        lines.append("  build args: " + ", ".join(sorted(plan.build_args)))
    if plan.platform:
        lines.append(f"  platform: {plan.platform}")
    lines.append("tags:")
    lines.append(f"  {plan.tag}")
    lines.append(f"  {plan.content_tag}   (content tag: unchanged context -> up to date, no rebuild)")
    return "\n".join(lines)


def parse_dockerfile_instructions(text: str) -> list[str]:
    """The instruction keyword of every logical line (tests and dry-run sanity checks use it)."""
    out = []
    continued = False
    for line in text.split("\n"):
        stripped = line.strip()
        if not continued and (not stripped or stripped.startswith("#")):
            continue
        if not continued:
            out.append(stripped.split(None, 1)[0].upper())
        continued = line.endswith("\\")
    return out


__all__ = [
    "BuildPlan", "ContextScan", "DockerfileInputs", "IgnorePattern", "check_ref", "content_digest",
    "context_summary", "dq", "execform", "is_ignored", "parse_dockerignore", "plan_build",
    "render_dockerfile", "scan_context", "split_tag",
]
