"""Label and field selectors with the Kubernetes syntax and semantics.

Label selector requirements: ``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, comma-separated (commas inside parentheses belong to the set).
Field selectors: ``path=v``, ``path==v``, ``path!=v`` on a per-resource whitelist, as the real
server rejects unsupported field labels with 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

Obj = dict[str, Any]
Matcher = Callable[[Obj], bool]


class SelectorError(ValueError):
    """The selector string is malformed or names an unsupported field (HTTP 400)."""


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str          # exists, !exists, =, !=, in, notin
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        raise AssertionError(self.op)


def _split_top_level(text: str) -> list[str]:
    parts, depth = [], 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
    parts.append("".join(cur))
    return parts


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text or not text.strip():
        return []
    reqs = []
    for part in _split_top_level(text):
        if not part.strip():
            raise SelectorError(f"empty requirement in label selector {text!r}")
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(f"{part.strip()!r}: a set needs at least one value")
            reqs.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ_RE.match(part):
            reqs.append(Requirement(m["key"], "!=" if m["op"] == "!=" else "=", (m["value"],)))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m["key"], "!exists" if m["neg"] else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement {part.strip()!r}")
    return reqs


def label_matcher(text: str | None) -> Matcher:
    reqs = parse_label_selector(text)

    def match(obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in reqs)

    return match


# Field labels the real API server accepts per resource (a subset; others are 400).
SUPPORTED_FIELDS: dict[str, set[str]] = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase",
             "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
             "status.podIP", "status.nominatedNodeName"},
    # pkg/registry/core/node/strategy.go NodeToSelectableFields: metadata.name and
    # spec.unschedulable only. The watch cache indexes metadata.name for Nodes
    # (pkg/registry/core/node/storage/storage.go TriggerFunc, node.NameTriggerFunc; used by
    # staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go to send a change only to the
    # watchers of that name): a kubelet watches its own Node this way, and so does wmctl.
    "nodes": {"metadata.name", "spec.unschedulable"},
    "jobs": {"metadata.name", "metadata.namespace", "status.successful"},
    "services": {"metadata.name", "metadata.namespace"},
    "events": {"metadata.name", "metadata.namespace", "involvedObject.name",
               "involvedObject.kind", "involvedObject.uid", "reason", "type"},
}
_FIELD_RE = re.compile(r"^\s*(?P<path>[A-Za-z0-9_.]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^,]*?)\s*$")


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return ""
        cur = cur[part]
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return "" if cur is None else str(cur)


def field_matcher(resource: str, text: str | None) -> Matcher:
    if not text or not text.strip():
        return lambda obj: True
    allowed = SUPPORTED_FIELDS.get(resource, {"metadata.name", "metadata.namespace"})
    reqs: list[tuple[str, bool, str]] = []
    for part in text.split(","):
        m = _FIELD_RE.match(part)
        if not m:
            raise SelectorError(f"invalid field selector {part.strip()!r}")
        if m["path"] not in allowed:
            raise SelectorError(f'field label not supported: {m["path"]}')
        reqs.append((m["path"], m["op"] != "!=", m["value"]))

    def match(obj: Obj) -> bool:
        return all((_field_value(obj, p) == v) == eq for p, eq, v in reqs)

    return match
