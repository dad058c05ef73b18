"""Small building blocks for validating the job spec (durationpy, Go's duration syntax, is their
one dependency, loaded only for a duration of more than one term such as 1m30s).

Plain dataclasses plus these helpers instead of pydantic: the spec stays readable, every
error names its field path and the fix, and the CLI avoids ~150 ms of import time (the
dry-run budget is 250 ms for the whole process).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

Problems = list[tuple[str, str]]

# Patterns as text: re compiles (and keeps) each one when it is first used.
_QUANTITY = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE]i?|k|m)?\s*$"
_FACTORS = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_DURATION = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$"
_DURATION_FACTORS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Go's (and so Kubernetes') duration units. durationpy also reads d, w, mm and y, which Go does not:
# a spec value should mean the same to wmctl as to kubectl, so those are refused.
_GO_UNITS = ("h", "m", "s", "ms", "us", "µs", "μs", "ns")
_GO_TERM = r"([0-9.]+)([^0-9.]*)"
_DURATION_FORMS = "write it like 30s, 1m30s, 250ms or 1h"
_INTEGER = r"^\s*-?[0-9]+\s*$"   # ASCII digits only: int() refuses '²' that isdigit() accepts

INT32_MAX = 2**31 - 1
# Kubernetes stores quantities as int64; Docker's shm_size and memory limits are int64 bytes too.
MAX_QUANTITY = 2**63 - 1
# Durations become Kubernetes int32/int64 seconds (tolerationSeconds, grace periods) and Docker
# stop timeouts; int32 seconds (68 years) keeps every one of them in range.
MAX_DURATION_S = INT32_MAX


class Invalid(Exception):
    """Raised by converters; carries the message that follows the field path."""


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def parse_quantity(value: Any) -> int:
    """A Kubernetes-style quantity ('16Gi', '512Mi', '64G', 1073741824) -> bytes."""
    if isinstance(value, bool):
        raise Invalid("expected a size such as 16Gi or 512Mi, got a boolean")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(f"{value} is not a size; write it like 16Gi, 512Mi or 64G")
        if value < 0:
            raise Invalid("a size cannot be negative")
        return _bounded_quantity(int(value), value)
    if not isinstance(value, str):
        raise Invalid(f"expected a size such as 16Gi or 512Mi, got {type(value).__name__}")
    m = re.match(_QUANTITY, value)
    if not m or m.group(2) == "m":
        raise Invalid(f"{value!r} is not a size; write it like 16Gi, 512Mi or 64G")
    digits, factor = m.group(1), _FACTORS[m.group(2)]
    if "." not in digits:       # a whole number: exact in int, however many digits
        return _bounded_quantity(int(digits) * factor, value)
    # Decimal, not float: exact for '1.000000000000000001Ei'. Loaded here, for a fraction only.
    from decimal import Decimal

    return _bounded_quantity(int(Decimal(digits) * factor), value)


def _bounded_quantity(n: int, given: Any) -> int:
    if n > MAX_QUANTITY:
        raise Invalid(f"{given!r} is too large; sizes must be below 8Ei")
    return n


def parse_duration(value: Any) -> float:
    """'30s', '5m', '1h', '250ms' or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise Invalid("expected a duration such as 30s or 5m, got a boolean")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(f"{value} is not a duration; write it like 30s, 5m or 1h")
        if value < 0:
            raise Invalid("a duration cannot be negative")
        # Compared before float(): a huge int would overflow the conversion itself.
        seconds = float(value) if value <= MAX_DURATION_S else math.inf
    elif isinstance(value, str):
        m = re.match(_DURATION, value)      # a number of seconds, or one term (30s, 1.5 m, 250ms)
        seconds = float(m.group(1)) * _DURATION_FACTORS[m.group(2)] if m else _go_duration(value)
    else:
        raise Invalid(f"expected a duration such as 30s or 5m, got {type(value).__name__}")
    if not seconds <= MAX_DURATION_S:   # also catches a float overflowed to inf
        raise Invalid(f"{value!r} is too long; durations go up to {MAX_DURATION_S}s (68 years)")
    return seconds


def _go_duration(value: str) -> float:
    """A Go/Kubernetes duration ('1h2m3.5s', '1m30s', '+90s') in seconds, parsed by durationpy
    (the kubernetes client's own parser), with Go's units only and no negative values."""
    text = value.strip()
    if text.startswith("-"):
        raise Invalid(f"{value!r}: a duration cannot be negative")
    for _, unit in re.findall(_GO_TERM, text.lstrip("+")):
        if unit not in _GO_UNITS:
            what = f"unknown unit {unit!r}" if unit else "a number without its unit"
            raise Invalid(f"{value!r} is not a duration ({what}); use h, m, s, ms, us or ns: {_DURATION_FORMS}")
    import durationpy   # the one form that needs it: a single term such as 30s is read above

    try:
        return durationpy.from_str(text).total_seconds()
    except (OverflowError, ValueError) as exc:     # DurationError is a ValueError; older ones leak both
        if isinstance(exc, OverflowError) or "range" in str(exc):
            raise Invalid(f"{value!r} is too long; durations go up to {MAX_DURATION_S}s (68 years)") from None
        raise Invalid(f"{value!r} is not a duration; {_DURATION_FORMS}") from None


def format_quantity(n: int) -> str:
    """Bytes -> the shortest exact binary quantity (17179869184 -> '16Gi')."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        f = _FACTORS[suffix]
        if n and n % f == 0:
            return f"{n // f}{suffix}"
    return str(n)


def did_you_mean(key: str, choices: typing.Iterable[str]) -> str:
    import difflib   # only a spec with a mistake asks; a dry run of a good one does not load it

    choices = list(choices)
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    if not close:  # shm_size -> shm, max_attempt -> max_attempts
        close = [c for c in choices if len(c) >= 3 and (key.startswith(c) or c.startswith(key))][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(tp, str(tp))


def convert(tp: Any, value: Any, path: str, problems: Problems) -> Any:  # noqa: C901 (one branch per type form)
    """Convert ``value`` to type ``tp``; record problems (field path, message) instead of raising."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            if type(None) in get_args(tp):
                return None
        if len(args) == 1:
            return convert(args[0], value, path, problems)
        for arg in args:  # first alternative that converts without problems wins
            trial: Problems = []
            result = convert(arg, value, path, trial)
            if not trial:
                return result
        # A mapping or list that only one alternative could hold failed inside: that
        # alternative's own problems name the key at fault ("affinity.x"), the union's cannot.
        shaped = [a for a in args if _shape(a) == _shape(type(value))]
        if len(shaped) == 1 and _shape(type(value)) != "scalar":
            return convert(shaped[0], value, path, problems)
        problems.append((path, f"expected {_type_name(tp)}, got {_describe(value)}"))
        return None
    if value is None:
        problems.append((path, f"must not be empty; expected {_type_name(tp)}"))
        return None
    if origin is Literal:
        if value in get_args(tp):
            return value
        choices = [str(a) for a in get_args(tp)]
        hint = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        problems.append((path, f"{value!r} is not one of {', '.join(choices)}{hint}"))
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path, problems)
    if origin is list:
        if not isinstance(value, list):
            problems.append((path, f"expected {_type_name(tp)}, got {_describe(value)}"))
            return []
        (item_tp,) = get_args(tp)
        return [convert(item_tp, v, join(path, i), problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            problems.append((path, f"expected a mapping, got {_describe(value)}"))
            return {}
        key_tp, val_tp = get_args(tp)
        out = {}
        for k, v in value.items():
            if key_tp is str:
                kk = _scalar_str(k, join(path, str(k)), problems)
            else:
                key_problems: Problems = []
                kk = convert(key_tp, k, join(path, str(k)), key_problems)
                if key_problems:
                    problems.append((join(path, str(k)), f"the key {k!r} is not {_type_name(key_tp)}"))
                    continue   # a None key would trip the cross-field checks that follow
            if val_tp is str:  # env, labels, build args: YAML scalars written as the user wrote them
                out[kk] = _scalar_str(v, join(path, str(k)), problems)
            else:
                out[kk] = convert(val_tp, v, join(path, str(k)), problems)
        return out
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append((path, f"expected true or false, got {_describe(value)}"))
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.match(_INTEGER, value):
            return int(value)
        problems.append((path, f"expected an integer, got {_describe(value)}"))
        return None
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:   # an int beyond any float
                number = math.inf
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            problems.append((path, f"expected a number, got {_describe(value)}"))
            return None
        # inf and nan pass float() but no backend can express them (int(inf) raises).
        if not math.isfinite(number):
            problems.append((path, f"expected a finite number, got {_describe(value)}"))
            return None
        return number
    if tp is str:
        return _scalar_str(value, path, problems, strict=True)
    raise TypeError(f"unsupported spec field type {tp!r}")  # a bug in the spec types, not user input


def _shape(tp: Any) -> str:
    origin = get_origin(tp) or tp
    if origin is dict or dataclasses.is_dataclass(tp):
        return "mapping"
    if origin is list:
        return "list"
    return "scalar"


def _scalar_str(value: Any, path: str, problems: Problems, strict: bool = False) -> str | None:
    if isinstance(value, str):
        return value
    # YAML turns `port: 8080` or `DEBUG: true` into non-strings; env values and keys are
    # strings on every backend, so accept scalars and write them the way the user did.
    if not strict and isinstance(value, (int, float, bool)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if strict and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    problems.append((path, f"expected a string, got {_describe(value)}"))
    return None


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of dataclass ``cls``, worked out once per class (a spec of
    ten volumes resolved Volume's ten times). An annotation written as text is compiled to be
    resolved: spec.py and vendors.py write theirs as objects."""
    return typing.get_type_hints(cls)


def build(cls: type, data: Any, path: str, problems: Problems) -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys and bad values become problems."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append((path or "(top level)", f"expected a mapping, got {_describe(data)}"))
        return cls() if _all_defaults(cls) else None
    hints = field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in fields:
            hint = did_you_mean(str(key), fields) or "; allowed: " + ", ".join(sorted(fields))
            problems.append((join(path, str(key)), f"unknown field{hint}"))
            continue
        kwargs[key] = convert(hints[key], value, join(path, key), problems)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append((join(path, name), f"is required ({_type_name(hints[name])})"))
            kwargs[name] = None
    try:
        return cls(**kwargs)
    except Invalid as exc:  # a dataclass's __post_init__ may refine values
        problems.append((path, str(exc)))
        return None


def _all_defaults(cls: type) -> bool:
    return all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(cls) if f.init
    )


def index_url_problem(value: object) -> str | None:
    """What is wrong with a package index URL (a vendor profile's ``torch_index_url``), or None.

    It reaches pip as one exec-form argument, so quoting is not the concern: the value must be an
    http(s) URL with a host, one line, no spaces, and no credentials (the Dockerfile and its RUN
    lines are kept in the image's history, and the dry run prints them)."""
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        return f"expected a URL string such as https://download.pytorch.org/whl/cpu, got {type(value).__name__}"
    bad = re.search(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029]", value)
    if bad:
        return f"{value!r} contains {bad.group()!r}; write one URL without spaces, e.g. https://download.pytorch.org/whl/cpu"
    try:
        parts = urlsplit(value)
        _port = parts.port    # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        return f"{value!r} is not a URL ({exc}); e.g. https://download.pytorch.org/whl/cpu"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (f"{value!r} is not an http(s) URL with a host; give the PEP 503 index pip should use, "
                "e.g. https://download.pytorch.org/whl/cpu")
    if parts.username is not None or parts.password is not None:
        return ("the URL carries credentials (user:password@), which would be kept in the image's history; "
                "use an index that needs none, or give pip its credentials through a netrc in the base image")
    return None

