"""``--dist loadgroup`` with the pytest this suite runs on.

pytest-xdist (3.8) puts a test of an ``xdist_group`` on its group's worker by renaming it on the
worker: it sets ``item._nodeid`` to ``<nodeid>@<group>``. pytest 9.2 keeps a node's id in
``item._id`` and no longer reads ``_nodeid``, so the rename is lost and every group is spread over
the workers like ungrouped tests (seen: a module fixture's real runs started on all 4 workers).
This plugin makes the same rename where pytest reads it, after xdist's own hook; with a pytest
that did take xdist's rename it finds the suffix there and does nothing.
"""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):   # set on xdist workers only
        return
    from _pytest.nodeid import NodeId

    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        item._id = NodeId.parse(f"{item.nodeid}@{group}")
