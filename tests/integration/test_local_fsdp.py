"""FSDP2 through the product's own path: `wmctl submit --auto-resume` on the local backend runs
tests/integration/jobs/fsdp.py (fully_shard over gloo, sharded checkpoints through
torch.distributed.checkpoint) on real torchrun agents, and faults are real SIGKILLs of a whole
node (keeper, agent and worker at once), as in test_local_faults.py for DDP.

- a node killed while a sharded save is on disk but not committed, then another killed mid-run,
  in one run: each attempt resumes by itself and the run ends with weights, optimizer state and
  per-rank sample sequence equal to an uninterrupted run's, bit for bit; the torn save never
  counts;
- a shard torn on disk after its commit: the next run resumes from the older checkpoint and
  still ends bit-exact;
- 2 nodes x 2 ranks, one node lost for good, resubmitted on 1 node (4 -> 2 ranks): DCP
  reshards, the watch output says the resume is not exact and why, and the interrupted epoch
  goes on without repeating a sample.

Kept tiny (an 8-16-1 MLP, 16 steps): the cost is torchrun and torch start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.runtime.checkpoint import COMMIT_MARKER, latest_complete

from . import harness as h

# Under xdist the whole module runs on one worker (--dist loadgroup): its module fixtures run
# real jobs, which every worker given one of its tests would otherwise run again.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("local-fsdp")]

STEPS, EVERY = 16, 4


def fsdp_spec(home: Path, run: str, *, nproc: int = 1, job_args: list[str] | None = None,
              restart: dict | None = None) -> Path:
    spec = h.write_spec(home, run, nodes=2, steps=STEPS, every=EVERY, sleep=0.15, job="fsdp.py",
                        job_args=job_args, restart=restart)
    data = yaml.safe_load(spec.read_text())
    data["nproc_per_node"] = nproc
    spec.write_text(yaml.safe_dump(data))
    return spec


def final(spec: Path) -> dict:
    return json.loads((h.run_checkpoints(spec) / "final.json").read_text())["state"]


def samples(spec: Path, world: int) -> dict[int, dict[int, tuple[int, list[int]]]]:
    """Per rank, step -> (epoch, indices) as last consumed (a later attempt replaces a step)."""
    out: dict[int, dict[int, tuple[int, list[int]]]] = {}
    for r in range(world):
        lines = (h.run_checkpoints(spec) / f"samples.rank-{r}.jsonl").read_text().splitlines()
        out[r] = {}
        for rec in map(json.loads, filter(None, lines)):
            out[r][rec["step"]] = (rec["epoch"], rec["indices"])
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-home-fsdp")


@pytest.fixture(scope="module")
def reference(home):
    spec = fsdp_spec(home, "fsdp-ref")
    w = h.Watch(spec, home)
    assert w.wait() == 0, w.output
    got: dict[str, Any] = {"final": final(spec), "samples": samples(spec, 2), "spec": spec}
    # Sanity of the comparison: training moved the weights, the ranks saw different samples.
    assert got["samples"][0][1] != got["samples"][1][1]
    return got


def test_fsdp2_nodes_killed_during_an_async_save_then_mid_run_resume_bit_exact(home, reference):
    """One run, a fault per attempt, async sharded checkpoints:

      attempt 0  rank 0 holds step 8's commit (attempt 0 only) while the loop trains on: every
                 rank's shards and files are on disk, no marker. Node 0 is SIGKILLed then: step 8
                 never counts, and attempt 1 resumes from step 4
      attempt 1  writes step 8 again over the torn folder and commits it; node 1 is SIGKILLed two
                 steps later, mid-run
      attempt 2  resumes from the newest complete checkpoint and runs to the end: weights,
                 optimizer state and every rank's samples equal the uninterrupted run's."""
    run = "fsdp-kills"
    spec = fsdp_spec(home, run, job_args=["--async-checkpoint", "--hold-commit", f"{2 * EVERY}:120"])
    w = h.Watch(spec, home)
    root = h.run_checkpoints(spec)
    torn = root / f"step-{2 * EVERY:08d}"
    h.wait_until(lambda: all((torn / f"rank-{r:05d}.done").exists() for r in range(2)), 120, "step 8 written")
    assert (torn / "dcp" / ".metadata").exists() and not (torn / COMMIT_MARKER).exists()
    assert (info := latest_complete(root)) is not None and info.step == EVERY
    assert h.kill_node(run, 0, 0) > 0
    h.wait_checkpoint(home, run, 1, 2 * EVERY)
    h.wait_step(home, run, 1, 2 * EVERY + 2)
    assert h.kill_node(run, 1, 1) > 0
    assert w.wait() == 0, w.output
    rec = h.record(home, run)
    assert [a["outcome"] for a in rec["attempts"]] == ["node_lost", "node_lost", "succeeded"], rec["final_report"]
    assert rec["attempts"][1]["resumed_from_step"] == EVERY
    assert rec["attempts"][2]["resumed_from_step"] >= 2 * EVERY
    # attempt 1 wrote step 8 again over the torn folder, and committed it
    assert 2 * EVERY in [e["step"] for e in h.progress(home, run, 1) if e["event"] == "checkpoint"]
    marker = json.loads((root / f"step-{STEPS:08d}" / COMMIT_MARKER).read_text())
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(marker["digests"])
    assert final(spec) == reference["final"]
    assert samples(spec, 2) == reference["samples"]
    assert not h.leftover_processes(run)


def test_fsdp2_a_torn_shard_never_counts_and_the_resume_is_still_exact(home, reference):
    """The reference run's newest two checkpoints resubmitted with rank 1's shard of the last one
    (step STEPS) cut in half: the new run resumes from the one before, computes the last EVERY
    steps again and ends bit-exact."""
    root = h.run_checkpoints(reference["spec"])
    shard = root / f"step-{STEPS:08d}" / "dcp" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert (info := latest_complete(root)) is not None and info.step == STEPS - EVERY
    w = h.Watch(reference["spec"], home, "--replace")
    assert w.wait() == 0, w.output
    rec = h.record(home, "fsdp-ref")
    assert rec["attempts"][0]["resumed_from_step"] == STEPS - EVERY, rec
    assert final(reference["spec"]) == reference["final"]


def test_fsdp2_four_ranks_resume_on_two_not_exact_and_no_sample_repeated(home):
    run = "fsdp-shrink"
    spec = fsdp_spec(home, run, nproc=2, restart={"max_attempts": 1})
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, EVERY)
    h.wait_step(home, run, 0, EVERY + 1)
    assert h.kill_node(run, 0, 1) > 0          # lost for good: the run stops (no retries left)
    assert w.wait() != 0, w.output
    assert (info := latest_complete(h.run_checkpoints(spec))) is not None and info.step == EVERY
    four = samples(spec, 4)

    w = h.Watch(spec, home, "--set", "nodes=1", "--replace")   # what is left: one node of 2 ranks
    assert w.wait() == 0, w.output
    assert f"resumed from step {EVERY} (not exact: world size changed from 4 to 2)" in w.output
    rec = h.record(home, run)
    assert rec["status"] == "succeeded" and rec["attempts"][0]["resumed_from_step"] == EVERY
    two = samples(spec, 2)
    # 48 samples: 4 ranks x 12 per epoch, 2 per step, so at step 4 epoch 0 had 16 samples left.
    # The 2 ranks finish it (8 each, steps 5..8) with exactly the ones not yet seen.
    seen = sorted(i for r in range(4) for s in range(1, EVERY + 1) for i in four[r][s][1])
    rest = sorted(i for r in range(2) for s in range(EVERY + 1, EVERY + 7) for i in two[r][s][1]
                  if two[r][s][0] == 0)
    assert len(seen) == 32 and len(rest) == 16 and not set(seen) & set(rest)
    assert sorted(seen + rest) == list(range(48))
