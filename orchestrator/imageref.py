"""Container image references, checked with the grammar the engines and registries use.

The grammar is distribution/reference's (reference.go and regexp.go, vendored by moby and
kubernetes): a lowercase path, an optional registry host, a tag of at most 128 characters, a
digest of at least 128 bits, the whole name at most 255 characters. A reference that breaks it
is refused when the spec loads, not by the engine or the kubelet after submit.
"""

from __future__ import annotations

# The grammar's patterns (regexp.go), each written out below as a function: compiling them cost
# every dry run ~4 million instructions. tests/unit/test_imageref.py holds each to its pattern.
#   path component  [a-z0-9]+(?:(?:[_.]|__|[-]+)[a-z0-9]+)*
#   domain          (?:C(?:\.C)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?
#                   with C = [a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
#   tag             [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
#   digest          [A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}
_DIGITS = frozenset("0123456789")
_LOWER_ALNUM = _DIGITS | frozenset("abcdefghijklmnopqrstuvwxyz")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ALNUM = _LETTERS | _DIGITS
_WORD = _ALNUM | {"_"}
_HEX = _DIGITS | frozenset("abcdefABCDEF")


def is_path_component(text: str) -> bool:
    """Lowercase letters and digits, runs of them separated by '.', '_', '__' or any '-'s."""
    if not text or text[0] not in _LOWER_ALNUM:
        return False
    separator = ""
    for c in text:
        if c in _LOWER_ALNUM:
            if separator not in ("", ".", "_", "__") and separator.strip("-"):
                return False
            separator = ""
        elif c in "._-":
            separator += c
        else:
            return False
    return separator == ""


def is_domain(text: str) -> bool:
    """A host name (labels of letters, digits and inner '-') or a bracketed address, then :port."""
    if text.startswith("["):
        close = text.find("]")
        host, rest = text[1:close], text[close + 1:]
        if close < 2 or not all(c in _HEX or c in ":." for c in host):
            return False
    else:
        host, colon, port = text.partition(":")
        rest = colon + port
        if not all(label and label[0] in _ALNUM and label[-1] in _ALNUM and all(c in _ALNUM or c == "-" for c in label)
                   for label in host.split(".")):
            return False
    return rest == "" or (rest[0] == ":" and len(rest) > 1 and all(c in _DIGITS for c in rest[1:]))


def is_tag(text: str) -> bool:
    return 0 < len(text) <= 128 and text[0] in _WORD and all(c in _WORD or c in ".-" for c in text)


def is_digest(text: str) -> bool:
    algorithm, colon, hex_part = text.partition(":")
    if not colon or len(hex_part) < 32 or not all(c in _HEX for c in hex_part):
        return False
    component = ""
    for c in algorithm + "+":      # a separator after the last component closes it
        if c in "-_+.":
            if not component or component[0] not in _LETTERS:
                return False
            component = ""
        elif c in _ALNUM:
            component += c
        else:
            return False
    return True


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
        if not is_digest(digest):
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
    if tag is not None and not is_tag(tag):
        return (f"tag {tag[:40]!r}{'...' if len(tag) > 40 else ''} is not a valid tag "
                f"(1-128 letters, digits, _ . -, not starting with . or -; this one has {len(tag)} characters)")
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        return f"the repository name has {len(name)} characters; registries accept at most {NAME_TOTAL_LENGTH_MAX}"
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not is_domain(first):
            return f"registry host {first!r} is not a host name or address with an optional :port"
        parts = parts[1:]
    for part in parts:
        if not is_path_component(part):
            hint = " (repository names are lowercase)" if part.lower() != part else ""
            return (f"repository path component {part!r} is not valid{hint}: lowercase letters and digits "
                    f"separated by . _ __ or -, e.g. {EXAMPLE}")
    return None
