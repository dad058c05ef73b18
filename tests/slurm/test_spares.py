"""Spare nodes on the real Slurm cluster (.ci/start-slurm.sh, three nodes): `restart.spares: 1`
makes the allocation three nodes, two that train and a spare. One lean run covers the claims
(docs/spares.md): a training node killed after a checkpoint is replaced in place (no new sbatch,
the store on the batch host survives), then a second one killed with no spare left resubmits, and
the run ends bit-identical to an uninterrupted one (test_engine.expected)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration import harness as h

from .conftest import SlurmCluster
from .test_engine import expected, home, job_state, spec, watch  # noqa: F401 - home is a fixture

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(360), pytest.mark.xdist_group("slurm")]


def _slot_hosts(root: Path, run: str) -> list[str]:
    folder = h.run_folder(root, run) / "attempt-0"
    h.wait_until(lambda: (folder / "slots.txt").exists(), 60, "the batch script's slots.txt")
    return (folder / "slots.txt").read_text().split()


def _recoveries(root: Path, run: str) -> list[dict]:
    return [r for a in h.record(root, run)["attempts"] for r in a.get("recoveries", [])]


def test_a_spare_replaces_a_killed_node_in_place_then_a_second_loss_resubmits_exactly(
        slurm_cluster: SlurmCluster, home: Path):  # noqa: F811 - the fixture
    run = "sl-spare"
    path = spec(home, run, steps=50, every=5, sleep=0.2, job_args=["--beat"],
                restart={"spares": 1, "node_silence_timeout": "3s", "heartbeat_timeout": "120s"})
    w = watch(path, home)
    h.wait_checkpoint(home, run, 0, 10)
    hosts = _slot_hosts(home, run)
    job = json.loads((h.run_folder(home, run) / "attempt-0" / "job.json").read_text())["job_id"]
    batch_host = slurm_cluster.run("scontrol", "show", "hostnames",
                                   slurm_cluster.job(job)["NodeList"]).stdout.split()[0]
    # slots 0 and 1 train on the allocation's other nodes; slot 2, the spare, on the batch host
    assert len(hosts) == 3 and hosts[2] == batch_host and batch_host not in hosts[:2], hosts
    # 1. slot 0's node dies: the spare takes its place inside the same Slurm job
    slurm_cluster.node_kill(hosts[0])
    h.wait_until(lambda: _recoveries(home, run), 90, "the in-place recovery")
    recovery = _recoveries(home, run)[0]
    assert (recovery["lost_node"], recovery["spare_node"], recovery["round"]) == (0, 2, 1), recovery
    assert recovery["checkpoint_step"] >= 10
    after = recovery["checkpoint_step"] + 5
    h.wait_checkpoint(home, run, 0, after, timeout=120)       # the new round trains and commits
    assert not (h.run_folder(home, run) / "attempt-1").exists(), w.output    # no new sbatch
    assert slurm_cluster.job(job).get("JobState") == "RUNNING"
    # 2. slot 1's node dies: no spare is left, a new job replaces this one
    slurm_cluster.node_kill(hosts[1])
    h.wait_until(lambda: (h.run_folder(home, run) / "attempt-1" / "job.json").exists(), 90, "attempt 1's sbatch")
    for node in (hosts[0], hosts[1]):       # the new job needs three nodes again
        slurm_cluster.node_revive(node)
    assert w.wait(timeout=240) == 0, w.output
    rec = h.record(home, run)
    first, second = rec["attempts"]
    assert [first["outcome"], second["outcome"]] == ["node_lost", "succeeded"], rec["final_report"]
    assert len(first["recoveries"]) == 1 and first["failed_host"] == hosts[1], first
    assert "spare node 2 takes its place in round 1" in w.output
    assert "no spare node is left" in w.output
    assert second["resumed_from_step"] >= after
    assert h.final_state(path) == expected(50)
    # the batch script ends the job by itself once the round's slots succeeded: its idle spare stops
    h.wait_until(lambda: job_state(slurm_cluster, home, run, 1) == "COMPLETED", 60, "attempt 1's job COMPLETED")
    ended = json.loads((h.run_folder(home, run) / "attempt-1" / "job.exit.json").read_text())
    assert ended["exit_code"] == 0, ended
    print(f"recovery {recovery}; attempt 1 resumed from {second['resumed_from_step']}, excluded "
          f"{second['excluded_nodes']}\n{w.output}")
