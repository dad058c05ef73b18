"""Container image references, checked with the grammar the engines and registries use.

The grammar is distribution/reference's (reference.go and regexp.go, vendored by moby and
kubernetes): a lowercase path, an optional registry host, a tag of at most 128 characters, a
digest of at least 128 bits, the whole name at most 255 characters. A reference that breaks it
is refused when the spec loads, not by the engine or the kubelet after submit.
"""

from __future__ import annotations

import re

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[_.]|__|[-]+)"
PATH_COMPONENT = re.compile(rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?")
TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
# go-digest (algorithm.go): the registered algorithms, each with a fixed length of lowercase hex.
DIGEST_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}
NAME_TOTAL_LENGTH_MAX = 255
EXAMPLE = "registry.example.com/team/worldmodel:v3"


def problem(ref: str) -> str | None:
    """Why ``ref`` is not a valid image reference (naming the part and the fix), or None."""
    if not ref or any(c.isspace() or ord(c) < 0x20 for c in ref):
        return f"{ref!r} is not an image reference (empty, or contains spaces or control characters); e.g. {EXAMPLE}"
    name, at, digest = ref.partition("@")
    if at:
        if not DIGEST.fullmatch(digest):
            return (f"digest {digest!r} is not ALGORITHM:HEX (at least 32 hex digits), "
                    "e.g. @sha256:<64 hex digits> as `docker images --digests` prints")
        algorithm, _, hex_part = digest.partition(":")
        want = DIGEST_HEX_LENGTH.get(algorithm)
        if want is None:
            return (f"digest algorithm {algorithm!r} is not one registries use "
                    f"({', '.join(DIGEST_HEX_LENGTH)}); e.g. @sha256:<64 hex digits>")
        if len(hex_part) != want or hex_part != hex_part.lower():
            return (f"a {algorithm} digest is {want} lowercase hex digits, this one is "
                    f"{hex_part[:16]!r}... ({len(hex_part)})")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    if tag is not None and not TAG.fullmatch(tag):
        return (f"tag {tag[:40]!r}{'...' if len(tag) > 40 else ''} is not a valid tag "
                f"(1-128 letters, digits, _ . -, not starting with . or -; this one has {len(tag)} characters)")
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        return f"the repository name has {len(name)} characters; registries accept at most {NAME_TOTAL_LENGTH_MAX}"
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not DOMAIN.fullmatch(first):
            return f"registry host {first!r} is not a host name or address with an optional :port"
        parts = parts[1:]
    for part in parts:
        if not PATH_COMPONENT.fullmatch(part):
            hint = " (repository names are lowercase)" if part.lower() != part else ""
            return (f"repository path component {part!r} is not valid{hint}: lowercase letters and digits "
                    f"separated by . _ __ or -, e.g. {EXAMPLE}")
    return None
