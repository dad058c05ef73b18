"""The real Slurm cluster the Slurm tests run on (.ci/start-slurm.sh): a hand-written sbatch job runs
torchrun across two nodes, and a node's death ends a job the way Slurm reports it.

What Slurm 22.05.8 (Debian 12) says here, measured on this cluster (SlurmdTimeout=10, MinJobAge
300 s, no slurmdbd); the engine parses these. ``scontrol show job -o ID`` gives one line of
``Key=value``; ``squeue -h -t all -o '%i|%T|%r|%N' -j ID`` (without ``-t all`` a finished job prints
nothing, exit 0):

    state        scontrol JobState / Reason / ExitCode      squeue %T|%r|%N
    pending      PENDING    Resources         0:0           PENDING|Resources|
    pending -N4  PENDING    PartitionNodeLimit 0:0          (3-node partition: accepted, never runs)
    held         PENDING    JobHeldUser       0:0
    running      RUNNING    None              0:0           RUNNING|None|n[1-2]
    done         COMPLETED  None              0:0           COMPLETED|None|n[1-2]
    srun exit 3  FAILED     NonZeroExitCode   3:0           FAILED|NonZeroExitCode|n[1-2]
    batch exit 7 FAILED     NonZeroExitCode   7:0
    scancel      CANCELLED  None              0:15          CANCELLED|None|n[1-2]  (who: not said)
    scancel pend CANCELLED  Resources         0:0           (the pending reason stays)
    --time=1     TIMEOUT    TimeLimit         143:0         TIMEOUT|TimeLimit|n1  (ended at RunTime 1:27)
    node killed  COMPLETING NodeDown, then NODE_FAIL NodeDown 0:15   NODE_FAIL|NodeDown|n[1-2]

ExitCode is ``exit:signal`` of the batch script. After MinJobAge a job is gone: ``scontrol show job
ID`` and ``squeue -j ID`` print ``slurm_load_jobs error: Invalid job id specified`` on stderr, exit 1.
``sacct`` (any arguments) without slurmdbd prints ``Slurm accounting storage is disabled`` on
stderr, nothing on stdout, exit 1. sbatch refuses at once (exit 1): ``-p nosuch`` "invalid partition
specified: nosuch", ``--gres=gpu:1`` "Invalid generic resource (gres) specification", ``--mem=999999``
"Memory specification can not be satisfied".

A node's death (test_node_kill_...): ``sinfo -h -N -o '%N %T %E'`` for n2 goes ``mixed none`` ->
``mixed* none`` (about 14 s: missed pings) -> ``down* Not responding`` (about 27 s, when the job
ends NODE_FAIL; an idle node: ``idle`` -> ``idle*`` -> ``down*``); ``scontrol show node -o`` says
``State=DOWN+NOT_RESPONDING Reason=Not responding [root@TIME]``. Slurm took about 2.7 x
SlurmdTimeout here (measured at 10 s only; at the default 300 s, at least 300 s). The batch log
says ``srun: error: Node failure on n2`` and ``slurmstepd-n1: error: *** JOB ID ON n1 CANCELLED AT
TIME DUE TO NODE FAILURE ...``; ``--no-requeue`` keeps Restarts=0. A restarted slurmd brings the
node back ``idle none`` in under a second (ReturnToService=2). A task's failure in the batch log:
``srun: error: n1: task 0: Exited with exit code 3``.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import SlurmCluster, alive, proc_argv

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("slurm")]

JOBS = Path(__file__).resolve().parent / "jobs"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_script(path: Path, sbatch: list[str], body: str) -> Path:
    path.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {opt}\n" for opt in sbatch) + "set -eu\n" + body + "\n")
    return path


def test_torchrun_allreduce_across_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path):
    """One srun step starts torchrun on two nodes (c10d rendezvous at 127.0.0.1, the nodes'
    NodeAddr); their gloo all-reduce sums 1 + 2 on both, each node writes its own log, and the
    job ends COMPLETED with exit code 0."""
    port = free_port()
    q = shlex.quote
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", '--rdzv-id="$SLURM_JOB_ID"',
                "--", str(JOBS / "allreduce.py")]
    script = write_script(
        tmp_path / "allreduce.sbatch",
        ["--nodes=2", "--ntasks-per-node=1", "--no-requeue", "--job-name=wmctl-test-allreduce",
         f"--output={tmp_path}/batch.log"],
        f"srun --output={q(str(tmp_path))}/node-%n.log " + " ".join(a if a.startswith("--rdzv-id") else q(a)
                                                                     for a in torchrun))
    jobid = slurm_cluster.sbatch(str(script), cwd=tmp_path)
    fields = slurm_cluster.wait_job_state(jobid, {"COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT"}, 240)
    logs = {p.name: p.read_text() for p in sorted(tmp_path.glob("node-*.log"))}
    batch = (tmp_path / "batch.log").read_text() if (tmp_path / "batch.log").exists() else "<no batch.log>"
    assert fields["JobState"] == "COMPLETED", f"{fields}\nbatch.log:\n{batch}\nnode logs:\n{logs}"
    assert fields["ExitCode"] == "0:0" and fields["NumNodes"] == "2", fields
    assert sorted(logs) == ["node-0.log", "node-1.log"], logs
    nodes = set()
    for name, text in logs.items():
        line = next((ln for ln in text.splitlines() if ln.startswith("rank ")), "")
        assert line.endswith("sum 3"), f"{name}: {text}"
        assert f"(SLURM_NODEID {name[5]})" in line, f"{name}: {line}"
        nodes.add(line.split(" on ")[1].split()[0])
    assert len(nodes) == 2, f"both ranks ran on one node: {logs}"
    assert slurm_cluster.squeue(jobid) == f"{jobid}|COMPLETED|None|{fields['NodeList']}"


def test_node_kill_ends_the_job_and_the_node_returns(slurm_cluster: SlurmCluster, tmp_path: Path):
    """A 2-node job's tasks run; n2 dies (slurmd, slurmstepd, tasks SIGKILLed): Slurm marks n2
    ``down*`` "Not responding" after SlurmdTimeout and ends the job NODE_FAIL (--no-requeue: not
    requeued); n2's slurmd, started again, brings it back idle (ReturnToService=2)."""
    script = write_script(
        tmp_path / "loop.sbatch",
        ["--nodes=2", "--ntasks-per-node=1", "--no-requeue", "--nodelist=n1,n2", "--job-name=wmctl-test-kill",
         f"--output={tmp_path}/batch.log"],
        f"srun --output={shlex.quote(str(tmp_path))}/node-%n.log "
        "bash -c 'echo \"up on $SLURMD_NODENAME\"; while true; do sleep 0.2; done'")
    jobid = slurm_cluster.sbatch(str(script), cwd=tmp_path)
    slurm_cluster.wait_job_state(jobid, {"RUNNING"}, 60)
    deadline = time.monotonic() + 60
    while {ln for p in tmp_path.glob("node-*.log") for ln in p.read_text().splitlines()} != {"up on n1", "up on n2"}:
        assert time.monotonic() < deadline, f"the tasks never started: {list(tmp_path.iterdir())}"
        time.sleep(0.1)

    on_n1, on_n2 = slurm_cluster.node_processes("n1"), slurm_cluster.node_processes("n2")
    assert not on_n1 & on_n2, (on_n1, on_n2)
    named = {pid: " ".join(proc_argv(pid)) for pid in on_n2}
    # The node's slurmd, its step daemon and the task (the loop's sleeps come and go).
    lasting = {pid: Path(argv.split()[0]).name for pid, argv in named.items() if argv and not argv.startswith("sleep")}
    assert sorted(lasting.values()) == ["bash", "slurmd", "slurmstepd:"], named
    t0 = time.monotonic()
    killed = slurm_cluster.node_kill("n2")
    assert set(lasting) <= killed and not any(alive(pid) for pid in on_n2), (named, killed)
    assert not slurm_cluster.node_processes("n2"), "n2 still has processes after its death"
    assert slurm_cluster.node_processes("n1"), "n1's tasks died with n2's"

    timeout = float(slurm_cluster.settings.get("SlurmdTimeout", "300"))
    seen: list[tuple[float, str, str, str]] = []
    while True:
        fields = slurm_cluster.job(jobid)
        state, reason = slurm_cluster.node_states()["n2"]
        now = (round(time.monotonic() - t0, 1), fields.get("JobState", ""), state, reason)
        if not seen or seen[-1][1:] != now[1:]:
            seen.append(now)
        if fields.get("JobState") not in ("RUNNING", "COMPLETING") or time.monotonic() - t0 > 3 * timeout + 60:
            break
        time.sleep(0.2)
    print(f"\nn2 killed; (seconds, JobState, n2 state, n2 reason): {seen}")
    assert fields["JobState"] == "NODE_FAIL" and fields["Reason"] == "NodeDown", (fields, seen)
    assert fields["Restarts"] == "0" and fields["Requeue"] == "0", fields
    assert any(s[2] == "down*" and s[3] == "Not responding" for s in seen), seen
    batch = (tmp_path / "batch.log").read_text()
    assert "srun: error: Node failure on n2" in batch, batch
    assert slurm_cluster.squeue(jobid) == f"{jobid}|NODE_FAIL|NodeDown|n[1-2]"

    t1 = time.monotonic()
    assert slurm_cluster.node_revive("n2") == ("idle", "none")
    print(f"n2 back idle {time.monotonic() - t1:.1f}s after its slurmd restarted")


def test_start_script_finds_the_cluster_up(slurm_cluster: SlurmCluster):
    """.ci/start-slurm.sh run again, with the settings that wrote this cluster's slurm.conf, finds
    every daemon up and restarts none: it prints the conf's path and the nodes keep their slurmd."""
    first_line = slurm_cluster.conf.read_text().splitlines()[0]
    if "Written by .ci/start-slurm.sh" not in first_line:
        pytest.skip(f"{slurm_cluster.conf} was not written by .ci/start-slurm.sh")
    settings = slurm_cluster.settings
    before = {n: slurm_cluster.slurmd_pids(n) for n in slurm_cluster.nodes}
    env = {**slurm_cluster.env, "WMCTL_SLURM_CONF": str(slurm_cluster.conf),
           "WMCTL_SLURM_DIR": str(Path(settings["StateSaveLocation"]).parent),
           "WMCTL_SLURM_PORT_BASE": settings["SlurmctldPort"], "WMCTL_SLURMD_TIMEOUT": settings["SlurmdTimeout"]}
    out = subprocess.run(["bash", str(REPO / ".ci" / "start-slurm.sh")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{slurm_cluster.conf}\n", out
    assert "all daemons already running" in out.stderr and "cluster up in" in out.stderr, out.stderr
    assert {n: slurm_cluster.slurmd_pids(n) for n in slurm_cluster.nodes} == before
