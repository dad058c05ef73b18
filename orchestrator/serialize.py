"""Plans and records as YAML or JSON text, the same way everywhere they are printed.

A string stays a string for every YAML reader. PyYAML quotes what YAML 1.1 would read as
another type (``yes``, ``0777``, ``1_000``, ``12:30``) but not what only YAML 1.2 reads so
(``1e-4``, ``0o17``, ``.5e3``), and kubectl, Helm and go-yaml v3 read YAML 1.2: ``--lr 1e-4``
would reach the container as the number 0.0001. ``needs_quotes`` adds the YAML 1.2 core schema
(https://yaml.org/spec/1.2.2/#1032-tag-resolution) and the forms go-yaml v2 also resolves (its
resolve.go: y/Y/n/N and yes/on/no/off are booleans there, and sigs.k8s.io/yaml, which kubectl
reads manifests with, is built on it).

Lines are never folded (a folded `docker_run` line pasted into a shell runs as two commands).
"""

from __future__ import annotations

import json
from typing import Any

# YAML 1.2 core schema (spec 10.3.2) plus JSON schema forms, and the go-yaml v2 extras (0b1010,
# 0o17 and underscores in numbers): any plain scalar one of them reads as a number, a boolean or
# null. Matching more than a reader needs only quotes a string that did not need it. Written out,
# not as the regular expression tests/unit/test_serialize_quotes.py holds it to: compiling that
# pattern was 4 million instructions of every dry run.
_WORDS = frozenset("""~ null Null NULL true True TRUE false False FALSE y Y n N yes Yes YES no No NO on On ON
                      off Off OFF .nan .NaN .NAN""".split())          # go-yaml v2's bools among them
_DIGITS = frozenset("0123456789")
_DIGITS_ = _DIGITS | {"_"}
_RADIX = {"x": _DIGITS_ | frozenset("abcdefABCDEF"), "o": frozenset("01234567_"), "b": frozenset("01_")}


def _all_in(text: str, chars: frozenset[str]) -> bool:
    return all(c in chars for c in text)


def _number_like(text: str) -> bool:
    r"""1, 1.5, .5, 1e-4, 1_000 ([-+]?(\.[0-9_]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?),
    0x1F, 0o17, 0b101 (signed too), [-+].inf in its three spellings."""
    body = text[1:] if text[:1] in ("-", "+") else text
    if body in (".inf", ".Inf", ".INF"):
        return True
    if len(body) > 2 and body[0] == "0" and body[1].lower() in _RADIX:
        return _all_in(body[2:], _RADIX[body[1].lower()])
    mantissa, e, exponent = body, "", ""
    for i, c in enumerate(body):
        if c in "eE":
            mantissa, e, exponent = body[:i], c, body[i + 1:]
            break
    if e:
        digits = exponent[1:] if exponent[:1] in ("-", "+") else exponent
        if not digits or not _all_in(digits, _DIGITS):
            return False
    if mantissa.startswith("."):
        return len(mantissa) > 1 and _all_in(mantissa[1:], _DIGITS_)
    whole, _, fraction = mantissa.partition(".")
    return whole[:1] in _DIGITS and _all_in(whole, _DIGITS_) and _all_in(fraction, _DIGITS_)


def needs_quotes(text: str) -> bool:
    """True when a plain (unquoted) ``text`` would be read as a non-string by a YAML 1.2 reader."""
    if text == "":
        return True
    if text.endswith("\n"):       # the pattern's `$` matched before one final line break as well
        text = text[:-1]
    return text in _WORDS or _number_like(text)


def _no_alias_dumper() -> Any:
    import yaml

    # libyaml's emitter where PyYAML has it: the same text, written several times faster (a dry
    # run's manifests were a fifth of its own time in the pure-Python emitter).
    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

    class PlanDumper(base):  # type: ignore[valid-type,misc]
        """Plans are read by people and by kubectl: an object shared between two places must
        print twice, never as ``&id001`` / ``*id001``."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    def represent_str(dumper: yaml.SafeDumper, data: str) -> Any:
        if needs_quotes(data):
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="'")
        return dumper.represent_str(data)   # PyYAML's own 1.1 quoting, line breaks, unicode

    PlanDumper.add_representer(str, represent_str)
    return PlanDumper


def dump(data: Any, output: str, *, stream: bool = True) -> str:
    """``data`` as JSON or YAML; a list is a YAML stream of documents (manifests) unless
    ``stream`` is False (a list that is one value, like `wmctl list -o yaml`'s rows)."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    import yaml

    dumper = _no_alias_dumper()
    # No folding: libyaml reads a negative width as unlimited, PyYAML's own emitter an infinite one.
    width: Any = -1 if issubclass(dumper, getattr(yaml, "CSafeDumper", ())) else float("inf")
    if isinstance(data, list) and stream:
        return yaml.dump_all(data, Dumper=dumper, sort_keys=False, allow_unicode=False, width=width)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=False, width=width)
