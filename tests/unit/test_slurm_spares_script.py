"""The spares sbatch script (restart.spares, templates/slurm/job-spares.sbatch.j2), run for real by
bash with the real keeper (runtime/keeper.py): no Slurm, no torch.

`srun` and `scontrol` are shims on PATH: srun runs its command in place of itself on the node
``--nodelist`` names (SLURMD_NODENAME, a step id); scontrol names three nodes. "This host's
interpreter" is a shim that runs the real one with a stand-in ``torch`` first on its path: its
``torch.distributed.run.main`` (what the keeper forks for a round) is a probe that records its
argv and environment, and exits as the test says; its ``TCPStore`` (the c10d store) holds
nothing. Hostile values go in through the command and env, and must come out as one word each.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import backends, layout
from orchestrator.plan import AttemptContext, HostFacts
from orchestrator.runtime import keeper as r
from orchestrator.specload import load_spec
from orchestrator.vendors import load_profile

from .test_slurm_script import HOSTILE_ARGS, HOSTILE_ENV, _shim

REPO = Path(__file__).resolve().parents[2]

SRUN = r'''
import itertools, json, os, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
path = os.path.join(os.environ["PROBE_OUT"], f"srun-{opts['nodelist']}.json")
with open(path + ".tmp", "w") as fh:          # whole or not at all, as the torchrun probe's
    json.dump(opts, fh)
os.replace(path + ".tmp", path)
env = dict(os.environ, SLURM_NODEID="0", SLURMD_NODENAME=opts["nodelist"], SLURM_STEP_ID=str(os.getpid()))
os.execvpe(args[0], args, env)
'''

SCONTROL = r'''
import sys
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    print("n1\nn2\nn3")
elif args[:3] == ["-o", "show", "node"]:
    print(f"NodeName={args[3]} NodeAddr=127.0.0.1 State=ALLOCATED")
else:
    sys.exit(f"scontrol shim: unexpected {args}")
'''

# the stand-in torch: what the keeper and the store import
TORCH_RUN = r'''
import json, os, sys
def main(args):
    slot = os.environ["WMCTL_LOCAL_TAG"].rsplit("/", 1)[1]
    keep = {k: v for k, v in os.environ.items() if k.startswith(("WMCTL_", "HOSTILE_"))}
    # whole or not at all: the test reads it as soon as it exists (seen: read empty under load)
    path = os.path.join(os.environ["PROBE_OUT"], f"torchrun-{slot}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"argv": list(args), "env": keep, "cwd": os.getcwd()}, fh)
    os.replace(path + ".tmp", path)
    print(f"probe in slot {slot}", flush=True)
    sys.exit(int(os.environ.get(f"PROBE_EXIT_{slot}", "0")))
'''
TORCH_DIST = "class TCPStore:\n    def __init__(self, *args, **kwargs):\n        pass\n"

PYTHON = r'''
import os, sys
env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["FAKE_TORCH"], os.environ["REPO"]]))
os.execve(os.environ["REAL_PYTHON"], [os.environ["REAL_PYTHON"], *sys.argv[1:]], env)
'''


@pytest.fixture
def cluster(tmp_path: Path) -> dict:
    shims = tmp_path / "shims"
    shims.mkdir()
    for name, source in (("srun", SRUN), ("scontrol", SCONTROL)):
        _shim(shims, name, source)
    python = _shim(shims, "py", PYTHON)
    fake = tmp_path / "faketorch" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text(TORCH_DIST)
    (fake / "run.py").write_text(TORCH_RUN)
    out = tmp_path / "probe"
    out.mkdir()
    spec_dir = tmp_path / "spec dir $(touch PWNED_DIR)"
    spec_dir.mkdir()
    return {"tmp": tmp_path, "shims": shims, "python": python, "out": out, "spec_dir": spec_dir,
            "fake": tmp_path / "faketorch", "home": tmp_path / "home 'q' $(touch PWNED_HOME)"}


_JOB_IDS = itertools.count()


def _start(c: dict, monkeypatch: pytest.MonkeyPatch, **extra_env: str) -> tuple[subprocess.Popen[str], Path]:
    path = c["spec_dir"] / "job.yaml"
    path.write_text(json.dumps({"name": "sp", "nodes": 2, "command": ["python", *HOSTILE_ARGS], "env": HOSTILE_ENV,
                                "restart": {"spares": 1}}))
    spec = load_spec(path)
    plan = backends.render_plan(spec, load_profile("cpu"), "slurm", AttemptContext(),
                                HostFacts(cpus=(0,), python=str(c["python"]), home=c["home"]))
    monkeypatch.setenv("WMCTL_HOME", str(c["home"]))
    attempt = layout.attempt_dir("sp", 0)
    rounds = layout.rounds_dir("sp", 0)
    rounds.mkdir(parents=True)
    r.write_round(rounds, 0, [0, 1], layout.round_rendezvous_id("sp", 0, 0), {})    # as the engine does
    script = c["tmp"] / "job.sbatch"
    script.write_text(plan.request.script)
    env = {"PATH": f"{c['shims']}{os.pathsep}{os.environ['PATH']}", "HOME": str(c["tmp"]), "PROBE_OUT": str(c["out"]),
           "FAKE_TORCH": str(c["fake"]), "REPO": str(REPO), "REAL_PYTHON": os.path.realpath(sys.executable),
           # a job id of this test's own: the keepers tag (and kill) their trees by it, and these
           # tests run side by side under xdist
           "SLURM_JOB_ID": f"{os.getpid()}0{next(_JOB_IDS)}", "SLURM_JOB_NODELIST": "n[1-3]",
           **extra_env}
    proc = subprocess.Popen(["bash", str(script)], cwd=c["tmp"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, attempt


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _round_of(exit_file: Path) -> int | None:
    try:            # the keeper removes its last record when a round starts it again
        return json.loads(exit_file.read_text()).get("round")
    except FileNotFoundError:
        return None


def test_slots_run_the_keeper_pinned_to_their_nodes_and_the_job_ends_by_itself(cluster, monkeypatch):
    c = cluster
    proc, attempt = _start(c, monkeypatch, PROBE_EXIT_0="0", PROBE_EXIT_1="0")
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, out
    assert not list(c["tmp"].rglob("PWNED*")), "a hostile value ran as a command"
    # slot s on node s + 1 of the allocation; the spare, slot 2, on the batch host n1
    assert (attempt / "slots.txt").read_text().split() == ["n2", "n3", "n1"]
    for node in ("n1", "n2", "n3"):
        opts = json.loads((c["out"] / f"srun-{node}.json").read_text())
        assert (opts["nodes"], opts["ntasks"]) == ("1", "1")
    for slot, node in ((0, "n2"), (1, "n3")):
        got = json.loads((c["out"] / f"torchrun-{slot}.json").read_text())
        py = str(c["python"])
        assert got["argv"] == [
            "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29500",
            "--rdzv-id=sp-a0", "--rdzv-conf=join_timeout=600,read_timeout=600,is_host=false", "--max-restarts=0",
            "--no-python", "--", py, "-m", "orchestrator.runtime.affinity", py, *HOSTILE_ARGS]
        env = got["env"]
        assert {k: env.get(k) for k in HOSTILE_ENV} == HOSTILE_ENV
        assert env["WMCTL_NODE_NAME"] == node and env["WMCTL_FENCE_EPOCH"] == "0"
        assert got["cwd"] == str(c["spec_dir"])
        end = json.loads((attempt / f"node-{slot}.exit.json").read_text())
        assert (end["exit_code"], end["round"]) == (0, 0)
        assert (attempt / f"node-{slot}.step").read_text().strip().isdigit()
    # the spare never ran; the script closed the rounds folder and it stopped; the job's record says 0
    assert not (c["out"] / "torchrun-2.json").exists()
    assert (layout.rounds_dir("sp", 0) / r.CLOSED).exists()
    assert json.loads((attempt / "job.exit.json").read_text())["exit_code"] == 0


def test_a_new_round_moves_the_spare_in_and_a_signal_ends_everything(cluster, monkeypatch):
    c = cluster
    proc, attempt = _start(c, monkeypatch, PROBE_EXIT_0="1", PROBE_EXIT_1="1")
    try:
        _wait(lambda: all((attempt / f"node-{s}.exit.json").exists() for s in (0, 1)), "round 0's failed slots")
        _wait(lambda: (attempt / "node-2.pid.json").exists(), "the spare's keeper")
        assert json.loads((attempt / "node-2.pid.json").read_text())["agent"] is None      # idle
        r.write_round(layout.rounds_dir("sp", 0), 1, [2, 1], "sp-a0-r1",
                      {"WMCTL_RESUME": "1", "WMCTL_FENCE_EPOCH": "1"})
        _wait(lambda: (c["out"] / "torchrun-2.json").exists(), "the spare's torchrun in round 1")
        got = json.loads((c["out"] / "torchrun-2.json").read_text())
        assert "--rdzv-id=sp-a0-r1" in got["argv"] and got["env"]["WMCTL_NODE_NAME"] == "n1"
        assert got["env"]["WMCTL_RESUME"] == "1" and got["env"]["WMCTL_FENCE_EPOCH"] == "1"
        _wait(lambda: _round_of(attempt / "node-1.exit.json") == 1, "slot 1's end in round 1")
        assert proc.poll() is None          # failed slots wait for the watcher's next round or teardown
        os.kill(proc.pid, 15)               # Slurm's termination of the job: the script's own SIGTERM
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 143, out
    assert json.loads((attempt / "job.exit.json").read_text())["exit_code"] == 143


def test_after_wmctls_teardown_kills_the_steps_the_shell_waits_for_its_scancel(cluster, monkeypatch):
    """As test_slurm_script's: wmctl's teardown marker, every slot's step SIGKILLed (the keepers,
    a spare's included); the shell waits for the scancel's SIGTERM rather than end on the steps'
    exit, so Slurm records the job CANCELLED, not FAILED."""
    from orchestrator.backends.slurm.render import TEARDOWN_FILE

    c = cluster
    proc, attempt = _start(c, monkeypatch, PROBE_EXIT_0="1", PROBE_EXIT_1="1")
    try:
        pid_files = [attempt / f"node-{s}.pid.json" for s in (0, 1, 2)]
        _wait(lambda: all(p.exists() for p in pid_files), "every slot's keeper")
        (attempt / TEARDOWN_FILE).write_text("1\n")
        for p in pid_files:
            try:
                os.kill(json.loads(p.read_text())["keeper"], 9)
            except ProcessLookupError:
                pass
        with pytest.raises(subprocess.TimeoutExpired):      # no step is left: it waits for the scancel
            proc.wait(timeout=3)
        assert not (attempt / "job.exit.json").exists()
        os.kill(proc.pid, 15)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 143, out
    assert json.loads((attempt / "job.exit.json").read_text())["exit_code"] == 143
