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
import re
from typing import Any

# YAML 1.2 core schema (spec 10.3.2) plus JSON schema forms, and the go-yaml v2 extras (0b1010,
# 0o17 and underscores in numbers): any plain scalar one of them reads as a number, a boolean or
# null. Matching more than a reader needs only quotes a string that did not need it.
_NUMBER_LIKE = re.compile(
    r"""^(?:
        [-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?   # 1, 1.5, .5, 1e-4, 1_000
      | [-+]?0[xX][0-9a-fA-F_]+ | [-+]?0[oO][0-7_]+ | [-+]?0[bB][01_]+      # 0x1F, 0o17, 0b101
      | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)                           # .inf, .nan
      | ~ | null | Null | NULL | true | True | TRUE | false | False | FALSE
      | y | Y | n | N | yes | Yes | YES | no | No | NO | on | On | ON | off | Off | OFF   # go-yaml v2's bools
    )$""", re.VERBOSE)


def needs_quotes(text: str) -> bool:
    """True when a plain (unquoted) ``text`` would be read as a non-string by a YAML 1.2 reader."""
    return text == "" or bool(_NUMBER_LIKE.match(text))


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
