"""Spare nodes on the Docker backend (restart.spares, docs/spares.md), on the real engine with the
real `wmctl submit --backend docker --auto-resume`: one run covers the claims, to keep CI short.

- node 0's container is `docker kill`ed after a checkpoint: the spare container takes its place in
  round 1 of the same attempt (no container created or removed, the store apart survives node 0);
- once round 1 resumed, a new spare container (slot 3) is started in the background; node 1's
  container killed after the next checkpoint: slot 3 takes its place in round 2;
- round 2's own new spare (slot 4) killed while idle (no news), then slot 2: no spare is left, a
  new attempt replaces the first;
- the run ends bit-identical (float.hex) to the uninterrupted computation, and leaves nothing
  behind (the store and the idle containers included).

And the backend alone (seconds): a frozen (paused) node fenced off by `docker kill`.
"""

from __future__ import annotations

from pathlib import Path

import docker.errors
import pytest

from orchestrator import backends, layout
from orchestrator import labels as L
from orchestrator.backends.docker.engine import DockerBackend
from orchestrator.plan import AttemptContext, HostFacts
from orchestrator.runtime import keeper
from orchestrator.runtime.protocol import parse_progress
from orchestrator.vendors import load_profile
from tests.integration import harness as h
from tests.unit.helpers import spec_from

from .conftest import SWEPT_RUNS, pause
from .test_docker_faults import final_state, leftovers, watch, write_spec

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420),
              pytest.mark.xdist_group(f"{SWEPT_RUNS}-docker-spares"),
              pytest.mark.usefixtures("_no_stale_runs")]
RUN_PREFIX = "dks-"     # this module's runs: the only ones its _no_stale_runs sweeps
STEPS = 60


def progress(client, run: str, attempt: int, slots: int = 4) -> list[dict]:
    """Progress lines of every slot container (global rank 0 is on whichever slot c10d ranks first)."""
    out: list[dict] = []
    for slot in range(slots):
        try:
            text = client.containers.get(f"{run}-a{attempt}-{slot}").logs().decode(errors="replace")
        except docker.errors.NotFound:
            continue
        out += [p for p in map(parse_progress, text.splitlines()) if p]
    return out


def checkpointed(client, run: str, step: int) -> bool:
    return any(p["event"] == "checkpoint" and p.get("step", 0) >= step for p in progress(client, run, 0))


def leftovers_of(client, run: str) -> list:
    return client.containers.list(all=True, filters={"label": [f"{L.RUN}={run}"]}, ignore_removed=True)


def running(client, name: str) -> bool:
    try:
        return client.containers.get(name).status == "running"
    except docker.errors.NotFound:
        return False


def test_docker_spares_replace_node0_in_place_are_replenished_then_run_out(docker_client, image, home: Path):
    run = "dks-spares"
    w = watch(write_spec(home, run, image, steps=STEPS, restart={"spares": 1}), home)
    h.wait_until(lambda: checkpointed(docker_client, run, 10), 240, "checkpoint 10", every=0.5)
    assert running(docker_client, f"{run}-a0-2"), "the spare's container waits, running"
    docker_client.containers.get(f"{run}-a0-0").kill()

    def recoveries() -> list[dict]:
        return h.record(home, run)["attempts"][0].get("recoveries", [])

    h.wait_until(recoveries, 120, "the first in-place recovery")
    first = recoveries()[0]
    assert (first["lost_node"], first["spare_node"], first["round"]) == (0, 2, 1), first
    assert first["checkpoint_step"] >= 10
    # no container created or removed on that path; the store (apart from node 0) serves round 1
    assert running(docker_client, f"{run}-a0-store") and running(docker_client, f"{run}-a0-1")
    # once round 1 resumed, a new spare container (slot 3) replaces the one used, in the background
    h.wait_until(lambda: running(docker_client, f"{run}-a0-3"), 120, "the replenished spare's container", every=0.5)
    again = first["checkpoint_step"] + 5
    h.wait_until(lambda: checkpointed(docker_client, run, again), 180, f"round 1's checkpoint {again}", every=0.5)
    docker_client.containers.get(f"{run}-a0-1").kill()
    h.wait_until(lambda: len(recoveries()) == 2, 120, "the second in-place recovery")
    second = recoveries()[1]
    assert (second["lost_node"], second["spare_node"], second["round"]) == (1, 3, 2), second
    # round 2 resumes, commits, and gets its own new spare (slot 4), which dies idle: no news
    h.wait_until(lambda: running(docker_client, f"{run}-a0-4"), 120, "the second replenished spare", every=0.5)
    third = second["checkpoint_step"] + 5
    h.wait_until(lambda: checkpointed(docker_client, run, third), 180, f"round 2's checkpoint {third}", every=0.5)
    docker_client.containers.get(f"{run}-a0-4").kill()
    h.wait_until(lambda: not running(docker_client, f"{run}-a0-4"), 60, "the idle spare's end", every=0.5)
    docker_client.containers.get(f"{run}-a0-2").kill()       # and no spare is left for slot 2
    assert w.wait(360) == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["node_lost", "succeeded"], w.output
    assert [r.get("replenished") for r in rec["attempts"][0]["recoveries"]] == [3, 4], rec["attempts"][0]
    assert rec["attempts"][1]["resumed_from_step"] >= third
    assert "spare node 2 takes its place in round 1" in w.output
    assert "spare node 3 takes its place in round 2" in w.output
    assert "no spare node is left" in w.output
    assert final_state(home, run) == h.counter_state(STEPS)
    assert not leftovers(docker_client, run)


def test_a_frozen_node_is_fenced_off_by_docker_kill_and_the_spare_named_with_no_container_made(
        docker_client, image, tmp_path, monkeypatch):
    """The backend alone, on the real engine (no training: the keepers wait for torchrun's
    rendezvous): node 1's container paused (a frozen node), recover_in_place kills it (a paused
    container too) and writes round 1 with the spare; no container is created or removed; poll
    reports round 1's slots only; cancel removes every container, the store's included."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    run = "dks-frozen"
    spec = spec_from({"name": run, "nodes": 2, "command": ["python", "counter.py"], "affinity": "none",
                      "image": {"vendor": "cpu", "tag": image}, "restart": {"spares": 1}})
    plan = backends.render_plan(spec, load_profile("cpu"), "docker", AttemptContext(), HostFacts.of_this_machine())
    be = DockerBackend(docker_client, log_follow=False)
    ref = be.submit(plan)
    try:
        names = {r["node"]: r["create"]["name"] for r in plan.resources if r["kind"] == "container"}
        h.wait_until(lambda: all(running(docker_client, n) for n in [*names.values(), f"{run}-a0-store"]), 60,
                     "every container running")
        before = sorted(c.id for c in leftovers_of(docker_client, run))
        pause(docker_client.containers.get(names[1]))
        got = be.recover_in_place(ref, 1)
        assert got is not None and (got.round, got.lost, got.spare, got.spares_left) == (1, 1, 2, 0)
        assert docker_client.containers.get(names[1]).attrs["State"]["Status"] == "exited"   # fenced off
        assert sorted(c.id for c in leftovers_of(docker_client, run)) == before
        rounds = keeper.all_rounds(layout.rounds_dir(run, 0))
        assert [(r["round"], r["active"]) for r in rounds] == [(0, [0, 1]), (1, [0, 2])]
        assert rounds[1]["env"]["WMCTL_RESUME"] == "1"
        assert sorted(s.node for s in be.poll(ref).nodes) == [0, 2]
        assert be.recover_in_place(ref, 0) is None          # no spare left
    finally:
        be.cancel(ref)
        be.close()
    assert not leftovers(docker_client, run)
