"""User strings that reach a Dockerfile: checked against fixed alphabets, or quoted so they stay
one word. Nothing from the spec or a profile can add an instruction."""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from ..errors import BuildError


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


def check_index_url(value: str, field_name: str) -> str:
    from ..validate import index_url_problem

    problem = index_url_problem(value)
    if problem:
        raise BuildError(f"{field_name}: {problem}")
    return value


def index_args(url: str | None) -> list[str]:
    """pip's options for an extra index: ``--extra-index-url URL``, plus ``--trusted-host`` for a
    plain-http one (pip ignores an http index on any host but localhost otherwise, with only a
    warning, and the package would quietly come from the default index instead)."""
    if not url:
        return []
    from urllib.parse import urlsplit

    args = ["--extra-index-url", url]
    if urlsplit(url).scheme == "http":
        args += ["--trusted-host", urlsplit(url).netloc]
    return args
