""".dockerignore, with moby's patternmatcher semantics."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence



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
