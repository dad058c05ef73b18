"""Loading a job spec: YAML text, then ``--set`` overrides, then the dataclasses, then the checks.

``load_spec`` either returns a complete, checked ``JobSpec`` or raises ``SpecError`` listing every
problem (field path, what is wrong, how to fix it). Loading never touches an engine.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import SpecError
from .spec import JobSpec
from .speccheck import check
from .validate import Problems, build, field_types


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None,
              profile_names: list[str] | None = None) -> JobSpec:
    """Read, override, validate. Raises SpecError with every problem found."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([("(file)", f"{path} does not exist; pass the path of a job spec YAML file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("(file)", f"cannot read {path}: {exc}")]) from None
    spec = parse_spec(text, overrides, source_dir=path.resolve().parent, profile_names=profile_names,
                      origin=str(path))
    return spec


def parse_spec(text: str, overrides: dict[str, Any] | None = None, *, source_dir: Path = Path("."),
               profile_names: list[str] | None = None, origin: str = "<spec>") -> JobSpec:
    from .yamlsafe import YamlProblem, load_with_text

    try:
        data, written = load_with_text(text)
    except YamlProblem as exc:
        where = f" at {exc.where}" if exc.where else ""
        raise SpecError([("(file)", f"{origin} is not a valid job spec{where}: {exc.problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([("(top level)", "a job spec is a mapping (name: ..., command: [...]); got "
                          f"{type(data).__name__}")])
    _keep_written_text(data, written)
    data = apply_overrides(data, overrides or {})
    return from_dict(data, source_dir=source_dir, profile_names=profile_names)


@lru_cache(maxsize=None)
def _text_maps(cls: type, prefix: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    """Paths of the spec's string-to-string maps (env, labels, build args, ...)."""
    hints = field_types(cls)
    out: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) is dict and typing.get_args(tp) == (str, str):
            out.append(prefix + (f.name,))
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += _text_maps(tp, prefix + (f.name,))
    return tuple(out)


def _keep_written_text(data: dict[str, Any], written: dict[tuple[Any, ...], str]) -> None:
    """A map of strings gets an unquoted value as the user wrote it: YAML 1.1 reads ``010`` as 8,
    ``yes`` as true and ``1.50`` as 1.5, and an env value the program reads as 8 or "True" is
    not the one in the spec."""
    for path in _text_maps(JobSpec):
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            for key, value in node.items():
                text = written.get(path + (key,))
                if text is not None and not isinstance(value, str):
                    node[key] = text


def from_dict(data: dict[str, Any], *, source_dir: Path = Path("."),
              profile_names: list[str] | None = None) -> JobSpec:
    problems: Problems = []
    spec = build(JobSpec, data, "", problems)
    if spec is None:
        raise SpecError(problems or [("(top level)", "invalid spec")])
    spec.source_dir = source_dir
    structural = bool(problems)
    try:
        check(spec, problems, profile_names)
    except (TypeError, AttributeError, ValueError):
        # A field that already failed conversion is None; report the problems found so far
        # rather than cross-field checks computed from values the user did not give.
        if not structural:
            raise
    if problems:
        raise SpecError(problems)
    return spec


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"nodes": 4, "image.tag": "x"}`` -> a deep copy of ``data`` with those paths set."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = data
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise SpecError([(dotted, f"cannot set {dotted}: {part} is not a mapping")])
            node = nxt
        node[parts[-1]] = value
    return data


def parse_set_flags(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--set key.path=value`` flags -> overrides; values are YAML scalars/lists (``--set nodes=4``)."""
    from .yamlsafe import YamlProblem, load

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
            raise SpecError([("--set", f"{item!r} is not KEY=VALUE with a dotted key, e.g. --set resources.shm=32Gi")])
        if tuple(key.split(".")[:-1]) in _text_maps(JobSpec):
            out[key] = raw      # an env value, a label: the text as given (`--set env.MODE=010`)
            continue
        try:
            out[key] = load(raw) if raw.strip() else ""
        except YamlProblem:
            out[key] = raw
    return out
