"""The build context: which files of image.context go in (after .dockerignore), where wmctl's own
files sit in it, and the source metadata labels."""

from __future__ import annotations

import datetime as _dt
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import BuildError
from ..speccheck import folder_problem
from .ignore import IgnorePattern, is_ignored, parse_dockerignore


# Never sent: wmctl's own state next to the spec. The spec may sit in a subfolder of the
# context, so a .wmctl folder is dropped at any depth: images.json changes after every build and
# would change the content digest (never "up to date") and bust the code layer.
ALWAYS_EXCLUDED = (".wmctl",)

# Context-tar folders (see the module docstring); build.engine writes them, the template copies them.
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
    from ..resources import templates_dir

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
    why = folder_problem(root)
    if why is not None:
        raise BuildError(f"image.context: {why}; set image.context to the folder with your training code "
                         "(relative to the spec file)")
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

def _in_git_work_tree(root: Path) -> bool:
    """Could git find a repository for ``root``? (A .git folder or file there or above, or the
    environment naming one.) Without one, no git process is started: each costs a fork and an
    exec on every build."""
    if os.environ.get("GIT_DIR") or os.environ.get("GIT_WORK_TREE"):
        return True
    here = Path(root).resolve()
    return any((folder / ".git").exists() for folder in (here, *here.parents))


def _git_start(root: Path, *args: str) -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(["git", "-C", str(root), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _git_output(proc: subprocess.Popen[str] | None) -> str | None:
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    return out if proc.returncode == 0 else None


def strip_userinfo(url: str) -> str:
    """https://user:token@host/x -> https://host/x: credentials never go into a label."""
    # Any scheme case (HTTPS://), and the last '@' before the path: a password may hold an '@'.
    return re.sub(r"^([a-z][a-z0-9+.\-]*://)[^/]*@", r"\1", url, flags=re.IGNORECASE)


def source_metadata(root: Path) -> dict[str, str]:
    """The source label (the origin remote without credentials, else the folder's file:// URI)
    and the revision (HEAD, ``-dirty`` with uncommitted changes to tracked files). The two git
    calls run side by side; none runs outside a git work tree."""
    meta = {"source": Path(root).resolve().as_uri()}
    if not _in_git_work_tree(root):
        return meta
    remote_proc = _git_start(root, "config", "--get", "remote.origin.url")
    # One call for both: the v2 header names HEAD's commit, and any entry line is a change.
    status_proc = _git_start(root, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    remote = (_git_output(remote_proc) or "").strip()
    status = _git_output(status_proc)
    if remote:
        meta["source"] = strip_userinfo(remote)
    if status is not None:
        lines = status.splitlines()
        rev = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ") and len(ln.split()) == 3), "")
        if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", rev):
            dirty = any(ln and not ln.startswith("#") for ln in lines)
            meta["revision"] = rev + ("-dirty" if dirty else "")
    return meta


def source_date() -> str | None:
    """SOURCE_DATE_EPOCH as an RFC 3339 time (reproducible builds pin the image's created label
    with it), or None when it is unset or not a number of seconds."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not (epoch and epoch.isdigit()):
        return None
    when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
    return when.isoformat().replace("+00:00", "Z")
