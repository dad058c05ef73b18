"""Spare nodes on the local backend (restart.spares, docs/spares.md): a node SIGKILLed (its whole
process group, as a machine dies) or frozen (SIGSTOP) after a checkpoint is replaced in place by the warm spare, with
no new attempt, and the run ends bit-identical (float.hex) to an uninterrupted one; a used spare
is replenished and answers the next loss, node 0's (the c10d store runs apart). A death with no
spare left falls back to a new attempt: the same backend-agnostic path (inplace.py, unit-tested in
tests/unit/test_inplace.py) that tests/docker/test_docker_spares.py and tests/slurm/test_spares.py
drive end to end, so it is not run a third time here (CI's 20 minutes).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from . import harness as h

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("local-spares")]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-spares")


@pytest.fixture(scope="module")
def reference() -> str:
    """An uninterrupted run's final state, computed (harness.counter_state, 40 steps on 2 ranks)."""
    return h.counter_state(40)


def _recoveries(home, run) -> list[dict]:
    return [r for a in h.record(home, run)["attempts"] for r in a.get("recoveries", [])]


def test_a_spare_replaces_a_killed_node_in_place_is_replenished_and_answers_a_frozen_one(home):
    """One attempt, two losses. Node 1 is SIGKILLed after a checkpoint: the spare (node 2) takes
    its place in round 1, every worker resuming from the newest complete checkpoint, exactly.
    restart.replenish_spares (the default): once round 1 has resumed, a new spare keeper (slot 3,
    with the lost slot's CPUs) starts in the background. After round 1 committed a checkpoint of
    its own, node 0 is frozen (SIGSTOP: cut off rather than dead; the spare's path kills it and
    fences it off). The c10d store runs apart, so node 0 goes like any node: the replenished spare
    answers in place, still one attempt, and the run ends bit-identical to an uninterrupted one."""
    run = "spare-replenish"
    # Each fault lands while the run stands still after a checkpoint (the job's --hold): seen in
    # CI, a run that went on finished before the replenished spare was warm, and the freeze came
    # after the job's end.
    at10, at30 = home / f"{run}-hold-10", home / f"{run}-hold-30"
    at10.touch()
    at30.touch()
    spec = h.write_spec(home, run, restart={"spares": 1}, steps=60,
                        job_args=["--hold", f"10:{at10}", "--hold", f"30:{at30}"])
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 10)
    assert h.kill_node(run, 0, 1) > 0
    at10.unlink()                            # round 1 resumes from step 10: it never holds there
    h.wait_until(lambda: [r for r in _recoveries(home, run) if r.get("replenished") == 3], 120,
                 "the replenished spare (slot 3)")
    h.wait_checkpoint(home, run, 0, 30)      # the new round committed one of its own, and holds
    # the keeper writes its pid file once torchrun is imported (warm), with round -1 while it waits
    pid_file = h.run_folder(home, run) / "attempt-0" / "node-3.pid.json"
    h.wait_until(lambda: pid_file.exists() and json.loads(pid_file.read_text())["round"] == -1, 120,
                 "slot 3's keeper waiting, warm")
    assert h.kill_node(run, 0, 0, signal.SIGSTOP) > 0
    h.wait_until(lambda: len(_recoveries(home, run)) == 2, 120, "the second in-place recovery")
    at30.unlink()
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["succeeded"], w.output
    recoveries = _recoveries(home, run)
    assert [(r["lost_node"], r["spare_node"], r["round"]) for r in recoveries] == [(1, 2, 1), (0, 3, 2)]
    assert [r["checkpoint_step"] for r in recoveries] == [10, 30], recoveries
    took = [ln for ln in w.output.splitlines() if "takes its place" in ln]
    assert len(took) == 2 and "spare node 2 takes its place in round 1" in took[0], took
    assert "lost" in took[0].split("takes its place")[0] and "frozen" in took[1].split("takes its place")[0], took
    # the final report (what `wmctl status` prints) names the recoveries inside the attempt
    assert "in place: node 1 replaced at step" in w.output and "in place: node 0 replaced at step" in w.output
    assert "spare node 3 started in the background for the one round 1 used" in w.output
    assert "attempt 0 submitted on local (2 node(s) + 1 spare(s))" in w.output
    metrics = (h.run_folder(home, run) / "metrics.jsonl").read_text()
    assert '"event":"spare_replenished"' in metrics and metrics.count('"event":"recovery"') == 2
    # every worker of each new round loaded the newest complete checkpoint, exactly
    resumes = [p for p in h.progress(home, run, 0) if p["event"] == "resume"]
    assert [p["step"] >= 30 and p.get("exact") is not False for p in resumes[-1:]] == [True], resumes
    assert all(p.get("exact") is not False for p in resumes), resumes
    assert h.final_state(spec) == h.counter_state(60)
    assert not h.leftover_processes(run)
    described = subprocess.run([sys.executable, "-m", "orchestrator.cli", "describe", run], env=w.env,
                               capture_output=True, text=True, timeout=60)
    assert "in_place    node 1 replaced by spare node 2 (round 1" in described.stdout, described.stdout
    assert "in_place    node 0 replaced by spare node 3 (round 2" in described.stdout, described.stdout


def test_a_straggler_is_named_and_swapped_for_the_spare_at_the_next_checkpoint(home, reference):
    """Node 1's machine made slow (50 ms more per step before the step's first collective, an env
    var the job reads): the watcher names it from the ranks' pace with its figures, and with
    restart.stragglers=replace the spare takes its place once a checkpoint has committed; the run
    ends bit-identical to the uninterrupted reference."""
    import yaml

    run = "spare-straggler"
    spec = h.write_spec(home, run, job_args=["--timer"],
                        restart={"spares": 1, "stragglers": "replace", "straggler_window": 10})
    data = yaml.safe_load(spec.read_text())
    data["env"] = {"COUNTER_SLOW_HOST": "localhost-1", "COUNTER_SLOW_S": "0.05"}
    spec.write_text(yaml.safe_dump(data))
    w = h.Watch(spec, home)
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["succeeded"], w.output
    slow = rec["attempts"][0]["stragglers"]
    assert [(s["group_rank"] is not None, s["host"]) for s in slow] == [(True, "localhost-1")], slow
    assert slow[0]["ms_per_step"] >= 40 and slow[0]["median_ms"] < 0.5 * slow[0]["ms_per_step"], slow
    assert "localhost-1 is a straggler:" in w.output and "a spare takes its place at the next checkpoint" in w.output
    recoveries = _recoveries(home, run)
    assert [(r["lost_node"], r["spare_node"]) for r in recoveries] == [(1, 2)], w.output
    # replaced only after a checkpoint committed since it was named: every worker resumed from it
    assert recoveries[0]["checkpoint_step"] >= slow[0]["step"] - 5
    # its figure as measured: 50 ms of sleep plus what the loaded machine adds (seen: 51.3)
    named = re.search(r"node 1 is a straggler \((\d+\.\d) ms/step", w.output)
    assert named and float(named.group(1)) >= 40 and "spare node 2 takes its place" in w.output, w.output
    assert h.final_state(spec) == reference
    assert not h.leftover_processes(run)
    described = subprocess.run([sys.executable, "-m", "orchestrator.cli", "describe", run], env=w.env,
                               capture_output=True, text=True, timeout=60)
    assert "straggler   node localhost-1:" in described.stdout, described.stdout
    assert "(replaced by spare node 2, every worker resumed from checkpoint" in described.stdout, described.stdout
    status = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", run], env=w.env,
                            capture_output=True, text=True, timeout=60)
    assert "straggler node localhost-1:" in status.stdout and "ms/step to reach the collective" in status.stdout, \
        status.stdout
