"""`wmctl nodes`: the nodes remembered as excluded (restart.remember_exclusions), and `wmctl nodes
forgive NODE` to clear one.

``-o json`` and ``-o yaml`` print a list of rows with a fixed schema: node, cluster, kind,
evidence, run, attempt, since and expires (ISO 8601, UTC). Expired entries are not listed."""

from __future__ import annotations

from typing import Any

import click

from .. import backends  # noqa: F401  (the registry answers which module keeps state: storehook)
from .. import exclusions as X
from ..errors import NodeNotRemembered
from ._output import emit, iso, output_option

COLUMNS = ("node", "cluster", "kind", "run", "attempt", "expires", "evidence")


def row(e: X.Exclusion) -> dict[str, Any]:
    """One remembered exclusion in `nodes`' schema."""
    return {"node": e.node, "cluster": e.cluster, "kind": e.kind, "evidence": e.evidence, "run": e.run,
            "attempt": e.attempt, "since": iso(e.at), "expires": iso(e.expires)}


@click.group("nodes", invoke_without_command=True,
             help="List the nodes remembered as excluded (a lost node, a device fault, a hang), per cluster.")
@output_option
@click.option("--cluster", default=None, help="Only this cluster's (its key, as listed).")
@click.pass_context
def command(ctx, output, cluster):
    if ctx.invoked_subcommand is not None:
        return
    rows = [row(e) for e in X.active(X.open_exclusions().load(), cluster)]
    if output == "table" and not rows:
        click.echo("no remembered exclusions" + (f" on {cluster}" if cluster else ""))
        return
    emit(rows, output, columns=COLUMNS)


@command.command("forgive", help="Clear a remembered exclusion: the next runs may use NODE again.")
@click.argument("node")
@click.option("--cluster", default=None, help="Only on this cluster (default: on every cluster).")
def forgive(node, cluster):
    store = X.open_exclusions()
    gone: list[X.Exclusion] = []

    def change(entries: list[X.Exclusion]) -> list[X.Exclusion]:
        left, forgiven = X.forgive(X.active(entries), node, cluster)
        gone[:] = forgiven
        return left

    known = X.active(store.load(), cluster)
    if not any(e.node == node for e in known):
        names = ", ".join(sorted({e.node for e in known})) or "none"
        where = f" on {cluster}" if cluster else ""
        raise NodeNotRemembered(f"no remembered exclusion of node {node!r}{where} (remembered: {names})",
                                hint="`wmctl nodes` lists them")
    store.update(change)
    for e in gone:
        click.echo(f"forgave {e.node} on {e.cluster} ({e.kind} in run {e.run}); the next runs may use it")
