"""The one YAML loader for what a user writes (job specs, --set values): strict and bounded.

- A key given twice in one mapping is an error naming both lines. PyYAML keeps the last one
  silently, so ``nodes: 1`` ... ``nodes: 3`` ran on 3 nodes without a word.
- Aliases may not expand past ``MAX_VALUES`` values. PyYAML shares an aliased object instead of
  copying it, so a 1 KB "billion laughs" document loads at once, and then whatever walks it
  (validation, an error that quotes it, a render) walks every expansion: 60 s and a 34.7 MB
  error message before this bound.
- Nesting is bounded too (libyaml stops at 1000 levels; the pure-Python parser has no limit
  and would overflow the interpreter's stack).
"""

from __future__ import annotations

import functools
from typing import Any

MAX_VALUES = 100_000      # a real spec holds well under a thousand values; a bomb holds billions
MAX_DEPTH = 200           # a spec nests about 5 deep


class YamlProblem(Exception):
    """What is wrong, and where (``line L, column C``, or empty)."""

    def __init__(self, problem: str, where: str = ""):
        super().__init__(problem)
        self.problem = problem
        self.where = where


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


@functools.lru_cache(maxsize=1)
def _loader_class() -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's parser where PyYAML has it

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        def construct_document(self, node: Any) -> Any:
            _check_size(node)
            return super().construct_document(node)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue   # an unhashable key: SafeConstructor reports it itself
                    if first is not key_node:
                        raise YamlProblem(f"key {_excerpt(key)} is given twice (first at "
                                          f"{_where(first.start_mark)}); keep one", _where(key_node.start_mark))
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _check_size(root: Any) -> None:
    """Count the values ``root`` expands to (an alias counts its whole target again), without
    expanding anything: each node's count is computed once, iteratively."""
    counts: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in counts:
            continue
        if depth > MAX_DEPTH:
            raise YamlProblem(f"values nest more than {MAX_DEPTH} levels deep", _where(node.start_mark))
        children = _children(node)
        pending = [c for c in children if id(c) not in counts]
        if pending:
            stack.append((node, depth))
            stack.extend((c, depth + 1) for c in pending)
            continue
        total = 1 + sum(counts[id(c)] for c in children)
        if total > MAX_VALUES:
            raise YamlProblem(f"the document expands to more than {MAX_VALUES:,} values through aliases "
                              "(*name); a job spec needs far fewer: write the values out or drop the aliases",
                              _where(node.start_mark))
        counts[id(node)] = total


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(item if isinstance(item, tuple) else (item,))
        return out
    return []


def _excerpt(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def load(text: str) -> Any:
    """Parse one YAML document; raises YamlProblem for any error (syntax, duplicate key, bomb)."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader_class())
    except YamlProblem:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlProblem(problem, _where(mark)) from None
    except RecursionError:
        raise YamlProblem(f"values nest too deep (more than {MAX_DEPTH} levels)") from None
