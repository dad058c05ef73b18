"""The requirements closure: image.requirements and every file it names with -r/-c, as pip reads
them, so each one is copied into the context at its own path."""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path
from typing import Iterable

from ..errors import BuildError


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



def inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False

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


def requirements_closure(main: Path, root: Path) -> list[tuple[str, Path]]:  # noqa: C901 (one branch per pip option)
    """``image.requirements`` and every file it names with -r/-c (recursively, relative to the
    naming file, as pip reads them): ``(path relative to the context, file)`` in the order found.

    They travel at the same relative paths under ``wmctl/req/``, so the nested references resolve
    inside the build exactly as here. Refused with the file, line and fix: a reference that leaves
    image.context or is absolute (neither exists in the build), and local-path requirements,
    ``-e PATH`` and ``--find-links PATH`` (pip would look for them in the build's working
    directory, where the project is not)."""
    root_resolved = Path(root).resolve()
    if not inside(main, root_resolved):
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
                if nested == ".." or nested.startswith("../") or not inside(target, root_resolved):
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
