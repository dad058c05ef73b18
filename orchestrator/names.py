"""The names Kubernetes, DNS and Docker accept, checked by their character classes.

Each function is exactly the regular expression in its docstring (tests/unit/test_names.py holds
them to it on generated strings). They are written out because compiling those patterns was
about 8 million instructions of every dry run: CPython's ``re`` parses and compiles a pattern in
Python code the first time it is used in a process, and a dry run is one short process.
"""

from __future__ import annotations

_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_DIGITS = frozenset("0123456789")
_LOWER_ALNUM = _LOWER | _DIGITS
_ALNUM = _LOWER_ALNUM | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_HEX_ADDRESS = _DIGITS | frozenset("abcdefABCDEF:.")


def _word(text: str, ends: frozenset[str], inner: frozenset[str]) -> bool:
    """``[ends]([inner]*[ends])?`` in full."""
    return bool(text) and text[0] in ends and text[-1] in ends and all(c in inner for c in text)


def is_rfc1035_label(text: str) -> bool:
    """``^[a-z]([-a-z0-9]*[a-z0-9])?$``: a run name, a volume name (any length)."""
    return bool(text) and text[0] in _LOWER and _word(text, _LOWER_ALNUM, _LOWER_ALNUM | {"-"})


def is_rfc1123_label(text: str) -> bool:
    """``[a-z0-9]([-a-z0-9]*[a-z0-9])?`` (any length)."""
    return _word(text, _LOWER_ALNUM, _LOWER_ALNUM | {"-"})


def is_dns_subdomain_form(text: str) -> bool:
    """``^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`` (any length)."""
    return all(is_rfc1123_label(label) for label in text.split("."))


def is_dns_subdomain(text: str) -> bool:
    """A DNS subdomain as Kubernetes names objects: the form above in at most 253 characters."""
    return len(text) <= 253 and is_dns_subdomain_form(text)


def is_object_name(text: str) -> bool:
    """``[a-z0-9]([-a-z0-9.]*[a-z0-9])?``: a queue, scheduler, service account or class name."""
    return _word(text, _LOWER_ALNUM, _LOWER_ALNUM | {"-", "."})


def is_label_value(text: str) -> bool:
    """``^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$``: empty, or 1-63 characters."""
    return text == "" or (len(text) <= 63 and _word(text, _ALNUM, _ALNUM | {"-", "_", "."}))


def is_label_key(text: str) -> bool:
    """``^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$``:
    an optional DNS-subdomain prefix and '/', then a name of 1-63 characters."""
    prefix, slash, name = text.rpartition("/")
    return name != "" and is_label_value(name) and (not slash or is_dns_subdomain_form(prefix))


def is_env_name(text: str) -> bool:
    """``^[A-Za-z_][A-Za-z0-9_]*$``."""
    return bool(text) and text[0] not in _DIGITS and all(c in _ALNUM or c == "_" for c in text)


def is_host_or_address(text: str) -> bool:
    """An NFS server: a host name (labels of 1-63 letters, digits and '-', with an optional final
    dot), or an address of hex digits, ':' and '.', bare or in brackets. As
    ``^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\\.?|[0-9A-Fa-f:.]+|\\[[0-9A-Fa-f:.]+\\])$``
    with fullmatch."""
    if text and all(c in _HEX_ADDRESS for c in text):
        return True
    if len(text) > 2 and text[0] == "[" and text[-1] == "]" and all(c in _HEX_ADDRESS for c in text[1:-1]):
        return True
    host = text[:-1] if text.endswith(".") else text
    return all(len(label) <= 63 and _word(label, _ALNUM, _ALNUM | {"-"}) for label in host.split("."))


_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL",
                 "CREDENTIALS")


def looks_like_secret(name: str) -> bool:
    """An env name that usually holds a credential, for names of ASCII letters, digits and '_' (an
    env name). As ``re.search`` of ``(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|
    PRIVATE_KEY|CREDENTIALS?)($|_)|_KEY$``: a whole '_'-separated word, or a name ending in _KEY."""
    if name.endswith("\n"):      # `$` also matches before a final newline
        name = name[:-1]
    upper = name.upper()
    padded = f"_{upper}_"
    return upper.endswith("_KEY") or any(f"_{word}_" in padded for word in _SECRET_WORDS)
