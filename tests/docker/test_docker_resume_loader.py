"""Exact mid-epoch resume with a plain DataLoader on the Docker backend (issue 22 item 1), and a
container removed while nobody watches read as the cause however late anyone looks (item 2).

The job is tests/runtime/loader_job.py (the local test's job: an MLP with dropout under DDP, fed
by ``DataLoader(ds, shuffle=True, num_workers=2)`` with no generator, whose dataset adds noise
from the global RNG in the workers), run by the real `wmctl submit --backend docker` as two
containers (2 nodes x 1 rank, gloo) of an image `wmctl build-image` makes FROM the offline base
image. Its checkpoints (every 5 steps) and the sha256 of its final weights go to a host_path
bind. Attempt 0 waits before step 13, every rank in a collective, ten batches into the first
epoch (16 batches): checkpoint 10 is committed, and whichever node is taken away there, the
other dies of the lost peer. Two runs prove both items (each Docker run costs ~30 s):

- the reference: uninterrupted, no checkpointing;
- the loader registered (``register(loader=...)``), submitted without a watcher: node 1's
  container is removed (`docker rm -f`), node 0 exits 1 of the lost peer, and `status` looks
  only after that exit and the consequence window: node_lost, not the survivor's app_error. A
  later `watch --auto-resume` resumes it from step 10, exact, and its final weights are the
  reference's, bit for bit.

An unregistered loader's resume says ``not exact: unregistered DataLoader``: the runtime's words,
the same in a container, tested on local processes (tests/runtime/test_resume_exact_loader.py); the
record and what `status` and `describe` make of it are the same for every backend
(tests/unit/test_supervisor.py, test_timeline_resume.py; through a real watcher:
tests/integration/test_local_fsdp.py's resume on fewer ranks).

Run names start with ``dkr-`` and the image is its own, so this module shares nothing with the
others on one engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestrator import labels as L
from orchestrator.backends.docker.classify import parse_docker_time
from orchestrator.failures import CONSEQUENCE_WINDOW_S
from tests.integration import harness as h

from .conftest import run_wmctl
from .test_docker_faults import container, leftovers, run_root, write_spec

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(420),
              # its module fixtures run real Docker jobs by fixed names: one worker runs them, once
              pytest.mark.xdist_group("docker-resume-loader")]

JOB = Path(__file__).resolve().parents[1] / "runtime" / "loader_job.py"
TAG = "wmctl-test/loader:job"
PREFIX = "dkr-"
CKPT = "$WMCTL_CHECKPOINT_DIR"     # expanded by the job: a container's command is not run by a shell
DATA = ["--data", "augment", "--num-workers", "2"]


@pytest.fixture(scope="module")
def loader_image(docker_client, base_image, tmp_path_factory) -> str:
    ctx = tmp_path_factory.mktemp("loader-image")
    shutil.copy(JOB, ctx / "loader_job.py")
    spec = ctx / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "loader", "image": {"vendor": "cpu", "base": base_image, "tag": TAG},
                                    "command": ["python", "loader_job.py"]}))
    result = run_wmctl("build-image", str(spec), cwd=ctx)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return TAG


@pytest.fixture(scope="module", autouse=True)
def _no_stale_loader_runs(docker_client):
    """This module's runs (dkr-) left by an interrupted session would be refused as someone
    else's; only they are swept, at the start and the end."""
    def sweep():
        for c in docker_client.containers.list(all=True, filters={"label": [L.RUN]}, ignore_removed=True):
            if c.labels.get(L.RUN, "").startswith(PREFIX):
                c.remove(force=True)
        for net in docker_client.networks.list(filters={"label": [L.RUN]}):
            if (net.attrs.get("Labels") or {}).get(L.RUN, "").startswith(PREFIX):
                net.remove()
    sweep()
    yield
    sweep()


def loader_spec(home: Path, run: str, image: str, *job_args: str) -> Path:
    spec = write_spec(home, run, image)
    data = yaml.safe_load(spec.read_text())
    data["command"] = ["python", "loader_job.py", *DATA, *job_args, "--dump-hash", f"{CKPT}/hash"]
    spec.write_text(yaml.safe_dump(data))
    return spec


def killed_at_13(home: Path, run: str, image: str, *job_args: str) -> Path:
    return loader_spec(home, run, image, *job_args, "--checkpoint-dir", CKPT, "--pause-at", "13",
                       "--pause-file", f"{CKPT}/paused")


def final_hash(home: Path, run: str) -> str:
    return (run_root(home, run) / "hash").read_text()


def wmctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_wmctl(*args, cwd=home, env={"WMCTL_HOME": str(home)}, timeout=300)


def wait_paused_at_13(home: Path, run: str) -> None:
    """Attempt 0 waits before step 13, checkpoint 10 committed."""
    h.wait_until((run_root(home, run) / "paused").exists, 240, f"{run} to reach step 13")
    assert (run_root(home, run) / "step-00000010" / "COMMITTED").exists()


@pytest.fixture(scope="module")
def reference(docker_client, loader_image, home) -> str:
    run = "dkr-reference"
    w = h.Watch(loader_spec(home, run, loader_image), home, "--backend", "docker")
    assert w.wait(300) == 0, w.output
    assert not leftovers(docker_client, run)
    assert not (run_root(home, run) / "step-00000010").exists()      # uninterrupted, and never checkpointed
    return final_hash(home, run)


def test_docker_registered_loader_removed_unwatched_is_node_lost_late_and_resumes_bit_exactly(
        docker_client, loader_image, home, reference):
    run = "dkr-registered"
    spec = killed_at_13(home, run, loader_image, "--register")
    sub = wmctl(home, "submit", str(spec), "--backend", "docker")
    assert sub.returncode == 0 and f"nothing will resume {run}" in sub.stdout, sub.stdout + sub.stderr
    wait_paused_at_13(home, run)
    container(docker_client, run, 0, 1).remove(force=True)       # gone, and its exit status with it
    survivor = container(docker_client, run, 0, 0)

    def exited() -> bool:
        survivor.reload()
        return survivor.status == "exited"
    h.wait_until(exited, 120, "node 0 to die of the lost peer", every=0.5)
    state = survivor.attrs["State"]
    assert state["ExitCode"] not in (0, 137), state          # its own error, not a kill
    finished = parse_docker_time(state["FinishedAt"])
    assert finished is not None
    h.wait_until(lambda: time.time() > finished + CONSEQUENCE_WINDOW_S + 1, 60, "a late look")
    data = json.loads(wmctl(home, "status", run, "-o", "json").stdout)
    assert data["status"] == "failed", data
    first = data["attempts"][0]
    assert (first["outcome"], first["failed_node"]) == ("node_lost", 1), data["final_report"]

    w = h.Watch(spec, home, run, "--auto-resume", command="watch")
    assert w.wait(300) == 0, w.output
    assert "failed while nobody watched it (node_lost); resuming it" in w.output
    rec = h.record(home, run)
    assert [a["attempt"] for a in rec["attempts"]] == [0, 1] and rec["status"] == "succeeded", rec["final_report"]
    resumed = rec["attempts"][1]
    assert (resumed["resumed_from_step"], resumed["resume_not_exact"]) == (10, None), rec["final_report"]
    describe = wmctl(home, "describe", run)
    assert "resumed from step 10 (" in describe.stdout and "not exact" not in describe.stdout, describe.stdout
    assert final_hash(home, run) == reference          # the proof: mid-epoch, bit for bit
    assert not leftovers(docker_client, run)


