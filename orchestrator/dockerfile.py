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
    wmctl/req/<path in image.context>               image.requirements and the files it names
                                                    with -r/-c, at their context-relative paths
    wmctl/wheelhouse-torch/...                      offline builds: the wheels the torch step needs
    wmctl/wheelhouse/...                            offline builds: the rest of image.wheelhouse
    src/...                                         image.context minus .dockerignore
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import posixpath
import re
import shlex
import stat
import subprocess
import zipfile
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

# Never sent: wmctl's own state next to the spec. The spec may sit in a subfolder of the
# context, so a .wmctl folder is dropped at any depth: images.json changes after every build and
# would change the content digest (never "up to date") and bust the code layer.
ALWAYS_EXCLUDED = (".wmctl",)

# Context-tar folders (see the module docstring); images.py writes them, the template copies them.
REQUIREMENTS_DIR = "wmctl/req"
WHEELHOUSE_DIR = "wmctl/wheelhouse"
WHEELHOUSE_TORCH_DIR = "wmctl/wheelhouse-torch"


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
    forced = list(extra_excluded)
    has_exclusions = any(p.exclusion for p in patterns)
    entries: list[ContextEntry] = []
    excluded: list[str] = []

    def forced_out(rel: str) -> bool:
        return (any(part in ALWAYS_EXCLUDED for part in rel.split("/"))
                or any(rel == f or rel.startswith(f + "/") for f in forced))

    def dropped(rel: str) -> bool:
        return forced_out(rel) or is_ignored(rel, patterns)

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
                if not has_exclusions or forced_out(rel):
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


# ---- requirements files ------------------------------------------------------------------------

# pip's requirement-file syntax (pip/_internal/req/req_file.py): a trailing backslash joins lines,
# "#" after whitespace starts a comment, options are shlex-split, optparse accepts any unambiguous
# prefix of a long option, and every short option takes a value ("-rbase.txt" works).
_REQ_COMMENT = re.compile(r"(^|\s+)#.*$")
_REQ_SHORT = {"-i": "--index-url", "-c": "--constraint", "-r": "--requirement", "-e": "--editable",
              "-f": "--find-links", "-C": "--config-settings"}
_REQ_LONG = ("--index-url", "--pypi-url", "--extra-index-url", "--no-index", "--constraint", "--requirement",
             "--editable", "--find-links", "--no-binary", "--only-binary", "--prefer-binary",
             "--require-hashes", "--no-require-hashes", "--pre", "--all-releases", "--only-final",
             "--trusted-host", "--use-feature", "--hash", "--config-settings")
_REQ_FLAGS = {"--no-index", "--prefer-binary", "--require-hashes", "--no-require-hashes", "--pre"}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_ARCHIVE_EXT = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar")


def _requirement_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, logical line) the way pip joins continuations and drops comments."""
    pending: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), 1):
        comment = bool(re.match(r"^\s*#", line))
        if line.endswith("\\") and not comment:
            if not pending:
                first = number
            pending.append(line[:-1])
            continue
        if pending:
            joined, start = "".join(pending) + (" " + line if comment else line), first
            pending = []
        else:
            joined, start = line, number
        joined = _REQ_COMMENT.sub("", joined).strip()
        if joined:
            yield start, joined
    if pending:
        joined = _REQ_COMMENT.sub("", "".join(pending)).strip()
        if joined:
            yield first, joined


def _requirement_options(options: str) -> list[tuple[str, str]]:
    """(long option, value) for the options on one requirements line that take a value."""
    try:
        tokens = shlex.split(options)
    except ValueError:
        return []  # pip reports its own "Could not split options" inside the build
    found = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            matches = [o for o in _REQ_LONG if o == name] or [o for o in _REQ_LONG if o.startswith(name)]
            if len(matches) != 1 or matches[0] in _REQ_FLAGS:
                continue
            option = "--index-url" if matches[0] == "--pypi-url" else matches[0]
        elif token[:2] in _REQ_SHORT:
            option, eq, value = _REQ_SHORT[token[:2]], "", token[2:]
            eq = "=" if value else ""
        else:
            continue
        if not eq:
            if i >= len(tokens):
                continue
            value = tokens[i]
            i += 1
        found.append((option, value))
    return found


def _is_local_requirement(text: str) -> bool:
    """Does this requirement (or -e value) install from a path on this machine? pip resolves such
    paths against its working directory, which inside the build is not the user's project."""
    sep = "; " if _URL.match(text) else ";"
    name = text.split(sep, 1)[0].strip()
    low = name.lower()
    if low.startswith("file:") or re.search(r"@\s*file:", low):
        return True
    if _URL.match(name) or re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*\+", name) or "@" in name:
        return False  # an index URL, a VCS URL or a PEP 508 direct reference to one
    bare = re.sub(r"\[[^\]]*\]$", "", name)
    return "/" in bare or "\\" in bare or bare.startswith(".") or low.endswith(_ARCHIVE_EXT)


def requirements_closure(main: Path, root: Path) -> list[tuple[str, Path]]:
    """``image.requirements`` and every file it names with -r/-c (recursively, relative to the
    naming file, as pip reads them): ``(path relative to the context, file)`` in the order found.

    They travel at the same relative paths under ``wmctl/req/``, so the nested references resolve
    inside the build exactly as here. Refused with the file, line and fix: a reference that leaves
    image.context or is absolute (neither exists in the build), and local-path requirements,
    ``-e PATH`` and ``--find-links PATH`` (pip would look for them in the build's working
    directory, where the project is not)."""
    root_resolved = Path(root).resolve()
    if not _inside(main, root_resolved):
        raise BuildError(f"image.requirements: {main} is outside image.context ({root_resolved})",
                         hint="give a path relative to image.context, e.g. requirements.txt")
    main_rel = Path(main).resolve().relative_to(root_resolved).as_posix()
    found: dict[str, Path] = {}

    def problem(rel: str, number: int, line: str, what: str, hint: str) -> BuildError:
        return BuildError(f"image.requirements: {rel} line {number} ({line!r}) {what}", hint=hint)

    def visit(rel: str, stack: tuple[str, ...]) -> None:
        path = root_resolved / rel
        if rel in found:
            return
        found[rel] = path.resolve()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BuildError(f"image.requirements: cannot read {path}: {exc}") from None
        for number, line in _requirement_lines(text):
            args, options = _split_requirement_line(line)
            if args and _is_local_requirement(args):
                raise problem(rel, number, line, "installs from a local path; pip resolves it against its working "
                              "directory, which inside the image build is not this project",
                              "install it by name from the index, or build its wheel (pip wheel PATH -w wheels/) "
                              "and use image.wheelhouse")
            for option, value in _requirement_options(options):
                if option == "--editable" and _is_local_requirement(value):
                    raise problem(rel, number, line, "is an editable install of a local path, which does not "
                                  "exist inside the image build",
                                  "install it by name, or keep the package in image.context: the code is "
                                  "copied to the WORKDIR and importable from there")
                if option == "--find-links" and not _URL.match(value):
                    raise problem(rel, number, line, "points pip at a local folder, which does not exist "
                                  "inside the image build",
                                  "use image.wheelhouse (wmctl build-image --wheelhouse DIR) for local wheels")
                if option not in ("--requirement", "--constraint") or _URL.match(value):
                    continue
                if "${" in value:
                    raise problem(rel, number, line, "names a file through an environment variable, which "
                                  "pip would expand inside the build, not here",
                                  "write the path out, relative to this file")
                if value.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", value):
                    raise problem(rel, number, line, f"names the absolute path {value}, which does not exist "
                                  "inside the image build", "give the path relative to this file")
                nested = posixpath.normpath(posixpath.join(posixpath.dirname(rel), value.replace("\\", "/")))
                target = root_resolved / nested
                if nested == ".." or nested.startswith("../") or not _inside(target, root_resolved):
                    raise problem(rel, number, line, f"names {target.resolve()}, outside image.context "
                                  f"({root_resolved}); only files in the build context reach the image",
                                  "move the file into image.context, or set image.context to a folder "
                                  "that holds both")
                if not target.is_file():
                    raise problem(rel, number, line, f"names {target}, which does not exist",
                                  "fix the path (it is relative to the file that names it)")
                if nested in stack:
                    raise problem(rel, number, line, f"includes {nested}, which includes this file again",
                                  "remove the circular -r/-c reference")
                visit(nested, stack + (nested,))

    visit(main_rel, (main_rel,))
    return list(found.items())


def _split_requirement_line(line: str) -> tuple[str, str]:
    """pip's break_args_options: the words before the first one starting with "-" are the requirement."""
    tokens = line.split(" ")
    for i, token in enumerate(tokens):
        if token.startswith("-"):
            return " ".join(tokens[:i]).strip(), " ".join(tokens[i:])
    return line.strip(), ""


# ---- wheelhouse -----------------------------------------------------------------------------------

def _dist_name(text: str) -> str | None:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._\-]*)", text)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def _wheel_requires(path: Path) -> list[str] | None:
    """Every Requires-Dist name of a wheel, markers and extras ignored (over-including is safe:
    it only moves a wheel into the torch layer). None when the file is not a readable wheel."""
    try:
        with zipfile.ZipFile(path) as zf:
            meta = next((n for n in zf.namelist()
                         if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            if meta is None:
                return None
            text = zf.read(meta).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile):
        return None
    names = []
    for line in text.split("\n\n", 1)[0].splitlines():
        if line.lower().startswith("requires-dist:"):
            name = _dist_name(line.split(":", 1)[1])
            if name:
                names.append(name)
    return names


def torch_wheel_set(wheelhouse: Path, files: list[tuple[str, int]], torch_packages: Sequence[str]) -> set[str]:
    """The wheelhouse files the torch step needs: the torch packages and what they require,
    transitively (from each wheel's METADATA). Files that are not readable wheels are counted in
    too, since the closure cannot be checked through them. The rest is copied only before the
    requirements step, so adding a requirement's wheel leaves the torch layer cached."""
    by_name: dict[str, list[str]] = {}
    unknown: set[str] = set()
    requires: dict[str, list[str]] = {}
    for rel, _size in files:
        base = rel.rsplit("/", 1)[-1]
        deps = _wheel_requires(wheelhouse / rel) if base.endswith(".whl") else None
        name = _dist_name(base.split("-", 1)[0]) if base.endswith(".whl") else None
        if deps is None or name is None:
            unknown.add(rel)
            continue
        by_name.setdefault(name, []).append(rel)
        requires.setdefault(name, []).extend(deps)
    wanted = [n for n in (_dist_name(p) for p in torch_packages) if n]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        wanted.extend(requires.get(name, []))
    return unknown | {rel for name in seen for rel in by_name.get(name, [])}


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
    requirements_rel: str = "requirements.txt"  # image.requirements, relative to the context
    # Offline builds: whether the context has wheels for the torch step / for the rest (a COPY of
    # a folder the context lacks fails the build, so an empty group is not copied).
    has_torch_wheels: bool = True
    has_dep_wheels: bool = True
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
    # image.requirements and the files it names: (path relative to the context, file)
    requirements_files: list[tuple[str, Path]] = field(default_factory=list)
    torch_wheels: set[str] = field(default_factory=set)   # wheelhouse files copied before the torch step
    base: str = ""
    base_image_id: str | None = None   # the engine's id for base, part of the digest when known

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


def content_digest(dockerfile_canonical: str, scan: ContextScan, requirements_files: list[tuple[str, Path]],
                   wheelhouse: Path | None, wheelhouse_files: list[tuple[str, int]], wheel_fingerprint: str,
                   build_args: dict[str, str], platform: str | None, base_image_id: str | None = None) -> str:
    """sha256 of everything that decides the image's content (not its build time or git rev).
    The Dockerfile names the base image; ``base_image_id`` (the engine's id for it) adds what the
    name means today, so a re-pulled or re-pointed base tag is a different image."""
    h = hashlib.sha256()

    def put(*parts: str) -> None:
        for part in parts:
            h.update(part.encode("utf-8", "surrogateescape"))
            h.update(b"\0")

    put("dockerfile", dockerfile_canonical)
    put("base-id", base_image_id or "")
    for e in scan.entries:
        if e.kind == "file":
            put("file", e.rel, oct(e.mode & 0o111), _file_sha256(scan.root / e.rel))
        elif e.kind == "symlink":
            put("link", e.rel, os.readlink(scan.root / e.rel))
        else:
            put("dir", e.rel)
    for rel, path in requirements_files:
        put("requirements", rel, _file_sha256(path))
    # Wheel contents, not name and size: a rebuilt local wheel keeps both. Hashing runs at about
    # 1.7 GB/s here, so a few seconds for a multi-GB CUDA wheelhouse; the build sends the same
    # bytes to the engine anyway, and being wrong means an image with the old wheel in it.
    for name, _size in wheelhouse_files:
        put("wheelhouse", name, _file_sha256(wheelhouse / name) if wheelhouse is not None else "")
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
        if not _inside(requirements, root):
            raise BuildError(f"image.requirements: {image.requirements!r} is outside image.context ({root})")
        if not requirements.is_file():
            raise BuildError(f"image.requirements: {requirements} does not exist",
                             hint="give a path relative to image.context, e.g. requirements.txt")
        requirements_files = requirements_closure(requirements, root)

    wh = Path(wheelhouse) if wheelhouse is not None else spec.wheelhouse_dir
    wh_files = _wheelhouse_files(wh) if wh is not None else []
    extra_excluded = []
    if wh is not None and _inside(wh, root) and wh.resolve() != root.resolve():
        # The wheelhouse travels as wmctl/wheelhouse; a second copy under src/ would double the
        # image and bust the code layer whenever a wheel is added.
        extra_excluded.append(wh.resolve().relative_to(root.resolve()).as_posix())
    scan = scan_context(root, extra_excluded)
    torch_packages = tuple(profile.torch_packages) if profile.pip_install_torch else ()
    torch_wheels = torch_wheel_set(wh, wh_files, torch_packages) if wh is not None and torch_packages else set()
    dep_wheels = {rel for rel, _ in wh_files} - torch_wheels

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
        requirements_rel=requirements_files[0][0] if requirements_files else "requirements.txt",
        has_torch_wheels=bool(torch_wheels), has_dep_wheels=bool(dep_wheels),
        torch_packages=torch_packages,
        optional_packages=tuple(profile.system_packages), required_packages=tuple(image.system_packages),
        image_env=tuple(sorted(profile.image_env.items())), build_arg_names=tuple(sorted(args)),
        labels=tuple(stable.items()),
    )
    canonical = render_dockerfile(inputs)
    digest = content_digest(canonical, scan, requirements_files, wh, wh_files, wheel_fingerprint, args, platform,
                            base_image_id)
    labels = {**stable, "io.wmctl.content-digest": digest[:12], **volatile}
    dockerfile = render_dockerfile(DockerfileInputs(**{**inputs.__dict__, "labels": tuple(labels.items())}))
    return BuildPlan(
        dockerfile=dockerfile, context=scan, requirements=requirements, wheelhouse=wh,
        wheelhouse_files=wh_files, wheel_name=wheel_name, wheel_fingerprint=wheel_fingerprint,
        build_args=args, platform=platform, tag=user_tag, content_tag=f"{repo}:wmctl-{digest[:12]}",
        digest=digest, labels=labels, requirements_files=requirements_files, torch_wheels=torch_wheels,
        base=base, base_image_id=base_image_id,
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
        lines.append(f"  requirements: {plan.requirements} -> {REQUIREMENTS_DIR}/{plan.requirements_files[0][0]}")
        for rel, _path in plan.requirements_files[1:]:
            lines.append(f"    named with -r/-c: {rel} -> {REQUIREMENTS_DIR}/{rel}")
    if plan.wheelhouse is not None:
        size = sum(s for _, s in plan.wheelhouse_files)
        lines.append(f"  wheelhouse (offline build, pip --no-index): {plan.wheelhouse} "
                     f"({len(plan.wheelhouse_files)} files, {_human(size)}; stays in the image's layers)")
        if plan.torch_wheels:
            torch_size = sum(s for rel, s in plan.wheelhouse_files if rel in plan.torch_wheels)
            lines.append(f"    for the torch step: {len(plan.torch_wheels)} files ({_human(torch_size)}); "
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
    "render_dockerfile", "requirements_closure", "scan_context", "split_tag", "torch_wheel_set",
]
