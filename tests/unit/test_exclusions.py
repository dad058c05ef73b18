"""Exclusions that outlive a run (orchestrator/exclusions.py, restart.remember_exclusions): what is
remembered and what is not, expiry, per-cluster keys, never excluding so many that the job cannot
be placed, the local file under a lock, the plan's note, Slurm's --exclude from a remembered node,
and `wmctl nodes` / `wmctl nodes forgive`."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from orchestrator import exclusions as X
from orchestrator import failures as F
from orchestrator.backends.docker.engine import DockerBackend
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.backends.local.engine import LocalBackend
from orchestrator.backends.slurm.engine import SlurmBackend
from orchestrator.backends.slurm.tools import parse_cluster_name
from orchestrator.cli import main

NOW = 1_000_000.0
DAY = 24 * 3600.0


def entry(node: str, cluster: str = "https://a:6443", at: float = NOW, ttl: float = DAY, kind: str = "node_lost"):
    return X.Exclusion(node=node, cluster=cluster, kind=kind, evidence=f"{node} went NotReady", run="r",
                       attempt=0, at=at, expires=at + ttl)


def run_main(args, capsys):
    code: str | int | None
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WMCTL_RUN_STORE", raising=False)
    return tmp_path / "home"


# ---- what is remembered ---------------------------------------------------------------------------

def test_only_a_node_failure_is_remembered():
    assert X.REMEMBERED_KINDS == {F.NODE_LOST, F.DEVICE_FAULT, F.HANG}
    # pressure (an eviction is a preemption), a graceful shutdown, a slow pull, the job's own error
    for kind in (F.PREEMPTED, F.CANCELLED, F.IMAGE_PULL, F.APP_ERROR, F.OOM, F.STORAGE_FULL, F.RENDEZVOUS,
                 F.UNSCHEDULABLE):
        assert not X.remembered(kind), kind
    # and every remembered class is one the supervisor moves away from
    assert all(F.DEFAULT_DECISIONS[k] == F.RETRY_ELSEWHERE for k in X.REMEMBERED_KINDS)


@pytest.mark.parametrize("kind", [F.PREEMPTED, F.APP_ERROR, F.IMAGE_PULL, F.OOM])
def test_remember_keeps_nothing_for_other_kinds_or_a_zero_ttl(home, kind):
    store = X.LocalExclusionStore()
    assert X.remember(node="n1", cluster="c", kind=kind, evidence="e", run="r", attempt=0, ttl_s=DAY,
                      store=store) is None
    assert X.remember(node="n1", cluster="c", kind=F.NODE_LOST, evidence="e", run="r", attempt=0, ttl_s=0,
                      store=store) is None
    assert store.load() == [] and not store.path.exists()


def test_an_eviction_for_pressure_is_a_preemption_so_never_remembered():
    from orchestrator.backends import base as b

    ev = b.Event(b.EVICTED, NOW, 0, "node-a", reason="Evicted", message="The node was low on resource: memory.")
    failure = F.classify_event(ev)
    assert failure is not None and not X.remembered(failure.kind)


def test_only_backends_whose_nodes_are_machines_remember():
    assert KubernetesBackend.remembers_exclusions and SlurmBackend.remembers_exclusions
    assert not LocalBackend.remembers_exclusions and not DockerBackend.remembers_exclusions
    applied = X.for_attempt(["n9"], remembers=False, cluster=lambda: pytest.fail("not asked"), ttl_s=DAY)
    assert applied.nodes == ("n9",) and not applied.notes


# ---- expiry and clusters --------------------------------------------------------------------------

def test_expired_entries_are_neither_listed_nor_applied(home):
    store = X.LocalExclusionStore()
    X.remember(node="old", cluster="c", kind=F.HANG, evidence="frozen", run="r", attempt=1, ttl_s=60,
               now=NOW, store=store)
    X.remember(node="new", cluster="c", kind=F.DEVICE_FAULT, evidence="Xid 79", run="r", attempt=2, ttl_s=DAY,
               now=NOW, store=store)
    assert [e.node for e in X.active(store.load(), "c", NOW + 59)] == ["old", "new"]
    assert [e.node for e in X.active(store.load(), "c", NOW + 61)] == ["new"]
    applied = X.for_attempt([], remembers=True, cluster=lambda: "c", ttl_s=DAY, store=store, now=NOW + 61)
    assert applied.nodes == ("new",)
    # a later write drops what expired
    X.remember(node="x", cluster="c", kind=F.NODE_LOST, evidence="e", run="r", attempt=0, ttl_s=DAY,
               now=NOW + 61, store=store)
    assert sorted(e.node for e in store.load()) == ["new", "x"]


def test_clusters_never_mix(home):
    store = X.LocalExclusionStore()
    for cluster in ("https://a:6443", "slurm:alpha"):
        X.remember(node="n1", cluster=cluster, kind=F.NODE_LOST, evidence="e", run="r", attempt=0, ttl_s=DAY,
                   now=NOW, store=store)
    X.remember(node="n2", cluster="slurm:alpha", kind=F.NODE_LOST, evidence="e", run="r", attempt=0, ttl_s=DAY,
               now=NOW, store=store)
    on_a = X.for_attempt([], remembers=True, cluster=lambda: "https://a:6443", ttl_s=DAY, store=store, now=NOW)
    on_b = X.for_attempt([], remembers=True, cluster=lambda: "https://b:6443", ttl_s=DAY, store=store, now=NOW)
    unknown = X.for_attempt([], remembers=True, cluster=lambda: None, ttl_s=DAY, store=store, now=NOW)
    assert (on_a.nodes, on_b.nodes, unknown.nodes) == (("n1",), (), ())
    left, gone = X.forgive(store.load(), "n1", "slurm:alpha")
    assert [(e.node, e.cluster) for e in gone] == [("n1", "slurm:alpha")]
    assert sorted((e.node, e.cluster) for e in left) == [("n1", "https://a:6443"), ("n2", "slurm:alpha")]


def test_the_same_node_again_keeps_the_newest_evidence(home):
    store = X.LocalExclusionStore()
    X.remember(node="n1", cluster="c", kind=F.HANG, evidence="first", run="r", attempt=0, ttl_s=DAY, now=NOW,
               store=store)
    X.remember(node="n1", cluster="c", kind=F.NODE_LOST, evidence="second", run="q", attempt=3, ttl_s=DAY,
               now=NOW + 5, store=store)
    [e] = store.load()
    assert (e.kind, e.evidence, e.run, e.attempt, e.expires) == (F.NODE_LOST, "second", "q", 3, NOW + 5 + DAY)


# ---- never so many that the job cannot be placed ---------------------------------------------------

def test_remembered_ones_go_oldest_first_before_the_runs_own():
    memory = [entry("m-old", at=NOW - 30), entry("m-mid", at=NOW - 20), entry("m-new", at=NOW - 10)]
    kept = X.apply(["own1"], memory, room=3)
    assert kept.nodes == ("own1", "m-mid", "m-new")
    assert [e.node for e in kept.dropped] == ["m-old"]
    assert any(n.startswith("warning:") and "m-old" in n for n in kept.notes)
    assert any("remembered exclusions applied" in n and "m-mid" in n and "m-new" in n for n in kept.notes)
    # no room at all: every remembered one goes, then the run's own, oldest first, each named
    none = X.apply(["own1", "own2"], memory, room=1)
    assert none.nodes == ("own2",)
    assert any("own1" in n and "too few nodes" in n for n in none.notes)
    assert any("m-old, m-mid, m-new" in n for n in none.notes)
    # room unknown: nothing is cut; a node both remembered and the run's own is excluded once
    assert X.apply(["m-mid"], memory, room=None).nodes == ("m-mid", "m-old", "m-new")


def test_a_damaged_file_never_stops_a_submission(home):
    home.mkdir(parents=True)
    (home / X.FILE).write_text("{not json", encoding="utf-8")
    applied = X.for_attempt(["n1"], remembers=True, cluster=lambda: "c", ttl_s=DAY)
    assert applied.nodes == ("n1",)
    assert any("damaged" in n and "none applied" in n for n in applied.notes)


def _add_many(home: str, who: str, count: int) -> None:
    os.environ["WMCTL_HOME"] = home
    store = X.LocalExclusionStore(Path(home))
    for i in range(count):
        X.remember(node=f"{who}-{i}", cluster="c", kind=F.NODE_LOST, evidence="e", run=who, attempt=i,
                   ttl_s=DAY, store=store)


def test_writers_in_several_processes_lose_nothing(home):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(str(home), f"w{k}", 15)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    nodes = {e.node for e in X.LocalExclusionStore(home).load()}
    assert nodes == {f"w{k}-{i}" for k in range(3) for i in range(15)}


# ---- Slurm: the rendered --exclude from a remembered node -----------------------------------------

def test_parse_cluster_name():
    text = "Configuration data as of 2026-12-07T07:00:00\nAccountingStorageType = (null)\nClusterName = alpha\n"
    assert parse_cluster_name(text) == "alpha"
    assert parse_cluster_name("ClusterName = (null)\n") is None
    assert parse_cluster_name("") is None


def _slurm_spec(tmp_path: Path, extra: str = "") -> str:
    (tmp_path / "ctx").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text("name: sj\nnodes: 2\ncommand: [python, t.py]\nimage: {context: ctx}\n"
                    "slurm: {container: none}\n" + extra, encoding="utf-8")
    return str(path)


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A real `scontrol` on PATH that answers `show config` for cluster alpha."""
    shims = tmp_path / "shims"
    shims.mkdir()
    tool = shims / "scontrol"
    tool.write_text('#!/bin/sh\nif [ "$1 $2" = "show config" ]; then echo "ClusterName = alpha"; exit 0; fi\n'
                    "exit 1\n", encoding="utf-8")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return tool


def test_slurm_renders_a_remembered_node_into_exclude_and_says_so(home, tmp_path, scontrol, capsys):
    X.remember(node="cn07", cluster="slurm:alpha", kind=F.DEVICE_FAULT, evidence="Xid 79", run="earlier",
               attempt=1, ttl_s=DAY)
    X.remember(node="cn09", cluster="slurm:beta", kind=F.NODE_LOST, evidence="e", run="other", attempt=0, ttl_s=DAY)
    code, out, err = run_main(["render", _slurm_spec(tmp_path), "-b", "slurm", "-o", "json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert "#SBATCH --exclude=cn07\n" in plan["extra"]["script"], plan["extra"]["script"]
    assert "cn09" not in json.dumps(plan)                     # another cluster's
    assert any("remembered exclusions applied" in n and "cn07 (device_fault in run earlier attempt 1)" in n
               for n in plan["notes"]), plan["notes"]
    assert not any("failed earlier attempts" in n for n in plan["notes"])     # none of this run's own
    # turned off: nothing remembered is applied
    code, out, _ = run_main(["render", _slurm_spec(tmp_path, "restart: {remember_exclusions: 0}\n"), "-b", "slurm",
                             "-o", "json"], capsys)
    assert code == 0 and "cn07" not in out


def test_remember_exclusions_must_be_a_duration(home, tmp_path, capsys):
    code, _, err = run_main(["render", _slurm_spec(tmp_path, "restart: {remember_exclusions: soon}\n"), "-b",
                             "slurm"], capsys)
    assert code == 2 and "restart.remember_exclusions" in err and "Traceback" not in err


# ---- wmctl nodes ------------------------------------------------------------------------------------

def test_nodes_lists_and_forgive_clears(home, capsys):
    X.remember(node="node-b", cluster="https://a:6443", kind=F.NODE_LOST, evidence="node-b went NotReady",
               run="wm", attempt=0, ttl_s=DAY)
    X.remember(node="cn07", cluster="slurm:alpha", kind=F.HANG, evidence="no beat for 15 s", run="sj",
               attempt=2, ttl_s=DAY)
    code, out, _ = run_main(["nodes"], capsys)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NODE", "CLUSTER", "KIND", "RUN", "ATTEMPT", "EXPIRES", "EVIDENCE"]
    assert rows[0].split()[:5] == ["node-b", "https://a:6443", "node_lost", "wm", "0"] and "NotReady" in rows[0]
    code, out, _ = run_main(["nodes", "-o", "json", "--cluster", "slurm:alpha"], capsys)
    [row] = json.loads(out)
    assert set(row) == {"node", "cluster", "kind", "evidence", "run", "attempt", "since", "expires"}
    assert (row["node"], row["kind"], row["run"], row["attempt"]) == ("cn07", "hang", "sj", 2)
    assert row["expires"].endswith("Z")
    code, out, _ = run_main(["nodes", "-o", "yaml"], capsys)
    assert code == 0 and "node: node-b" in out and "node: cn07" in out
    # forgive: gone from the list and from what the next attempt excludes
    code, out, _ = run_main(["nodes", "forgive", "node-b"], capsys)
    assert code == 0 and "forgave node-b on https://a:6443" in out
    assert [e.node for e in X.active(X.LocalExclusionStore().load())] == ["cn07"]
    assert X.for_attempt([], remembers=True, cluster=lambda: "https://a:6443", ttl_s=DAY).nodes == ()
    # unknown: exit 6, naming what is remembered
    code, _, err = run_main(["nodes", "forgive", "node-b"], capsys)
    assert code == 6 and "node-b" in err and "cn07" in err and "Traceback" not in err
    code, _, err = run_main(["nodes", "forgive", "cn07", "--cluster", "https://a:6443"], capsys)
    assert code == 6
    code, out, _ = run_main(["nodes", "forgive", "cn07", "--cluster", "slurm:alpha"], capsys)
    assert code == 0
    code, out, _ = run_main(["nodes"], capsys)
    assert code == 0 and out.strip() == "no remembered exclusions"
    code, out, _ = run_main(["nodes", "-o", "json"], capsys)
    assert json.loads(out) == []


def test_the_kubernetes_key_is_the_contexts_api_server_read_as_kubectl_merges(tmp_path, monkeypatch):
    from orchestrator.adaptors.kubernetes import kubeconfig_server

    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(json.dumps({"current-context": "one", "contexts": [{"name": "one", "context": {"cluster": "c1"}}],
                                 "clusters": [{"name": "c1", "cluster": {"server": "https://one:6443"}}]}))
    second.write_text(json.dumps({"current-context": "two",
                                  "contexts": [{"name": "one", "context": {"cluster": "c2"}},
                                               {"name": "two", "context": {"cluster": "c2"}}],
                                  "clusters": [{"name": "c2", "cluster": {"server": "https://two:6443"}}]}))
    both = f"{first}{os.pathsep}{second}"
    assert kubeconfig_server(None, both) == "https://one:6443"     # the first current-context and definition
    assert kubeconfig_server("two", both) == "https://two:6443"
    assert kubeconfig_server("nope", both) is None
    assert kubeconfig_server(None, str(tmp_path / "missing")) is None
    monkeypatch.setenv("KUBECONFIG", str(second))
    assert KubernetesBackend(context=None).cluster_key() == "https://two:6443"


def test_over_the_nodes_that_could_take_the_job_only_those_excluded_in_their_way_go():
    memory = [entry("down", at=NOW - 40), entry("m-old", at=NOW - 30), entry("m-new", at=NOW - 10)]
    usable = frozenset({"a", "b", "m-old", "m-new", "own1"})     # "down" could take nothing anyway
    kept = X.apply(["own1"], memory, usable=usable, needed=3)
    # free without exclusions: 5; own1 + m-old + m-new excluded leaves 2 < 3: m-old goes (oldest in the way)
    assert kept.nodes == ("own1", "down", "m-new") and [e.node for e in kept.dropped] == ["m-old"]
    assert X.apply(["own1"], memory, usable=usable, needed=2).dropped == ()
    # the job needs every usable node: all in the way go, the remembered first, then the run's own
    every = X.apply(["own1"], memory, usable=usable, needed=5)
    assert every.nodes == ("down",) and any("own1" in n and "too few nodes" in n for n in every.notes)
    # asked only when something is excluded at all
    asked: list[int] = []

    def ask() -> frozenset[str]:
        asked.append(1)
        return frozenset()

    X.for_attempt([], remembers=False, cluster=lambda: None, ttl_s=DAY, usable=ask, needed=2)
    assert asked == []


def test_parse_slurm_partition_nodes():
    from orchestrator.backends.slurm.tools import parse_partition_nodes

    text = "cn01|idle\ncn02|mixed\ncn03|down*\ncn04|drained\ncn05|allocated\ncn01|idle\ncn06|idle*\n\nbad\n"
    assert parse_partition_nodes(text) == {"cn01", "cn02", "cn03", "cn04", "cn05", "cn06"}


def test_slurm_counts_down_and_drained_nodes_as_places_for_the_cap():
    """sbatch refuses ("Requested node configuration is not available") a job that the partition
    less the excluded nodes can never hold, even when the excluded nodes are down: so for the cap
    every node of the partition is a place (CI: a 3-node partition, 2 nodes + 1 spare, two nodes
    lost -> excluding the down one made attempt 1 fail at sbatch instead of waiting)."""
    from orchestrator.backends.slurm.tools import parse_partition_nodes

    text = "n1|idle\nn2|down*\nn3|drained\nn1|idle\n"
    assert parse_partition_nodes(text) == {"n1", "n2", "n3"}
    from orchestrator.exclusions import apply

    got = apply(["n3", "n2"], [], room=None, usable=parse_partition_nodes(text), needed=3)
    assert got.nodes == ()                       # nothing excluded: the job waits for n2 and n3
