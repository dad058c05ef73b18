"""The one YAML loader for what a user writes (job specs, --set values): strict and bounded.

- A key given twice in one mapping is an error naming both lines. PyYAML keeps the last one
  silently, so ``nodes: 1`` ... ``nodes: 3`` ran on 3 nodes without a word. Checked on the
  composed node graph, before anything is built: an aliased key (``{&k a: 1, *k : 2}``) and the
  mappings a merge key (``<<``) points at are checked too, and a merge's own override of a
  merged key is not a duplicate.
- Aliases may not expand past ``MAX_VALUES`` values or ``MAX_BYTES`` of scalar text. PyYAML shares
  an aliased object instead of copying it, so a 1 KB "billion laughs" document loads at once, and
  then whatever walks it (validation, an error that quotes it, a render) walks every expansion:
  60 s and a 34.7 MB error message before this bound; a 1 MB string aliased 300 times printed a
  602 MB plan.
- Nesting is bounded too (libyaml stops at 1000 levels; the pure-Python parser has no limit
  and would overflow the interpreter's stack).
"""

from __future__ import annotations

import functools
from typing import Any

MAX_VALUES = 100_000      # a real spec holds well under a thousand values; a bomb holds billions
MAX_BYTES = 8 * 2**20     # of scalar text once every alias is expanded; a real spec is a few KB
MAX_DEPTH = 200           # a spec nests about 5 deep
MERGE_TAG = "tag:yaml.org,2002:merge"


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
            _check_graph(node)
            data = super().construct_document(node)
            self.plain_text = _plain_text(node, data)
            return data

    return StrictLoader


def _plain_text(node: Any, data: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], str]:
    """Where an unquoted scalar became a number or a boolean, what the user wrote: ``FOO: 010`` is
    the int 8 to YAML 1.1, ``yes`` is True and ``1.50`` is 1.5, but as an env value the user meant
    the text. Keyed by the path of keys and list indexes to the value."""
    import yaml

    out: dict[tuple[Any, ...], str] = {}
    if isinstance(node, yaml.ScalarNode):
        if not node.style and isinstance(data, (bool, int, float)):   # plain: None, or "" from libyaml
            out[path] = node.value
    elif isinstance(node, yaml.MappingNode) and isinstance(data, dict):
        for key_node, value_node in node.value:
            # string keys only: every key whose value can want its text (env names) is one
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":str") and key_node.value in data:
                out.update(_plain_text(value_node, data[key_node.value], path + (key_node.value,)))
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
        for i, (item_node, item) in enumerate(zip(node.value, data, strict=False)):
            out.update(_plain_text(item_node, item, path + (i,)))
    return out


def _check_graph(root: Any) -> None:
    """One pass over the composed document: the values and bytes it expands to (an alias counts
    its whole target again; each node's totals are computed once), its depth, and duplicate keys
    in every mapping."""
    import yaml

    totals: dict[int, tuple[int, int]] = {}      # id(node) -> (values, scalar bytes) expanded
    aliased = False
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in totals:
            aliased = True                        # reached again: an alias
            continue
        if depth > MAX_DEPTH:
            raise YamlProblem(f"values nest more than {MAX_DEPTH} levels deep", _where(node.start_mark))
        children = _children(node)
        pending = [c for c in children if id(c) not in totals]
        if pending:
            stack.append((node, depth))
            stack.extend((c, depth + 1) for c in pending)
            continue
        aliased = aliased or len({id(c) for c in children}) < len(children)
        if isinstance(node, yaml.MappingNode):
            _check_duplicate_keys(node)
        own = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
        values = 1 + sum(totals[id(c)][0] for c in children)
        nbytes = own + sum(totals[id(c)][1] for c in children)
        if values > MAX_VALUES or nbytes > MAX_BYTES:
            how = " through aliases (*name)" if aliased else ""
            raise YamlProblem(f"the document expands to more than {MAX_VALUES:,} values or {MAX_BYTES // 2**20} MiB "
                              f"of text{how}; a job spec needs far less"
                              + (": write the values out or drop the aliases" if aliased else ""),
                              _where(node.start_mark))
        totals[id(node)] = (values, nbytes)


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(item if isinstance(item, tuple) else (item,))
        return out
    return []


def _check_duplicate_keys(node: Any) -> None:
    import yaml

    seen: dict[tuple[str, str], Any] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = (key_node.tag, key_node.value)
        first = seen.setdefault(key, key_node)
        if first is not key_node or sum(1 for k, _ in node.value if k is key_node) > 1:
            raise YamlProblem(f"key {_excerpt(key_node.value)} is given twice (first at "
                              f"{_where(first.start_mark)}); keep one", _where(key_node.start_mark))


def _excerpt(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def load(text: str) -> Any:
    """Parse one YAML document; raises YamlProblem for any error (syntax, duplicate key, bomb)."""
    return load_with_text(text)[0]


def load_with_text(text: str) -> tuple[Any, dict[tuple[Any, ...], str]]:
    """``load``, and what the user wrote wherever an unquoted scalar became a number or boolean."""
    import yaml

    loader = _loader_class()(text)
    try:
        data = loader.get_single_data()
        return data, getattr(loader, "plain_text", {})
    except YamlProblem:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlProblem(problem, _where(mark)) from None
    except RecursionError:
        raise YamlProblem(f"values nest too deep (more than {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()
