"""The sbatch script, run for real by bash: every value a user writes arrives as one literal word.

No Slurm here: `srun`, `scontrol` (and `apptainer`) are replaced by shims on PATH that do what the
script relies on (srun starts the command once per node with SLURM_NODEID and SLURMD_NODENAME set;
scontrol names the nodes and node 0's NodeAddr). The program torchrun would start is a probe that
writes down the argv, environment and folder it got. Hostile values (spaces, quotes, $(...),
backticks, globs, newlines, a word that looks like one of torchrun's own options) go in through
the command, env, paths and folder names; each must come out unchanged, and nothing they spell
may run. What can never be quoted (values of #SBATCH lines) is refused before rendering.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator import backends
from orchestrator.backends.slurm import classify
from orchestrator.errors import OptionError, SpecError
from orchestrator.plan import AttemptContext, HostFacts, Plan
from orchestrator.specload import load_spec
from orchestrator.vendors import load_profile

HOSTILE_ARGS = ["a b", "it's", 'say "hi"', "$(touch PWNED_ARG)", "`touch PWNED_TICK`", "*", "~", "$HOME",
                "line\nbreak", "'", "\\", "${IFS}x", "!!", ";touch PWNED_SEMI;", "",
                "--rdzv-conf=mine", "--rdzv-endpoint=NODE0", "--", "-m"]
DATA = "data $(touch PWNED_VOL) 'x'"          # a host_path volume, relative to the spec's folder
CKPT = "ck pt $(touch PWNED_CKPT)"           # the checkpoint folder, in that volume
HOSTILE_ENV = {"HOSTILE_SUBST": "$(touch PWNED_ENV)", "HOSTILE_MIXED": "a b\nc 'd' \"e\" `touch PWNED_ENV2` *",
               "HOSTILE_EMPTY": "", "HOSTILE_DOLLAR": "$PATH ${HOME}"}

PROBE = r'''
import json, os, signal, sys
node = os.environ.get("SLURM_NODEID", "?")
if os.environ.get(f"PROBE_TERM_{node}"):        # Slurm's signal reaches the step: the node's shell too
    os.kill(os.getppid(), signal.SIGTERM)
keep = {k: v for k, v in os.environ.items() if k.startswith(("WMCTL_", "HOSTILE_", "PET_", "PYTHONUNBUFFERED"))}
name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
out = os.path.join(os.environ["PROBE_OUT"], f"{name}-{node}.json")
with open(out, "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": keep, "cwd": os.getcwd()}, fh)
print(f"probe on node {node}", flush=True)
sys.exit(int(os.environ.get(f"PROBE_EXIT_{node}", "0")))
'''

# srun: its own options (all --name=value), then the command, started once per node, each with
# the node's ids; exits with the highest exit status, as srun does.
SRUN = r'''
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["PROBE_OUT"], "srun.json"), "w") as fh:
    json.dump(args, fh)
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
codes = []
for node in range(int(opts["nodes"])):
    env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(node), SLURMD_NODENAME=f"n{node + 1}")
    codes.append(subprocess.run(args, env=env).returncode)
sys.exit(max(codes))
'''

SCONTROL = r'''
import sys
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    print("n1\nn2")
elif args[:3] == ["-o", "show", "node"]:
    print(f"NodeName={args[3]} Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=host-{args[3]} State=ALLOCATED")
else:
    sys.exit(f"scontrol shim: unexpected {args}")
'''

# apptainer exec [flags] [--bind SRC:DST]... --pwd DIR IMAGE COMMAND...: records its argv, runs COMMAND.
APPTAINER = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["PROBE_OUT"], f"apptainer-{os.environ['SLURM_NODEID']}.json"), "w") as fh:
    json.dump(args, fh)
assert args.pop(0) == "exec"
while args[0].startswith("-"):
    flag = args.pop(0)
    if flag in ("--bind", "--pwd"):
        args.pop(0)
args.pop(0)           # the image
os.execvp(args[0], args)
'''


def _shim(folder: Path, name: str, source: str) -> Path:
    code = folder / f"{name}.py"
    code.write_text(source, encoding="utf-8")
    path = folder / name
    path.write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} {shlex.quote(str(code))} \"$@\"\n",
                    encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.fixture
def cluster(tmp_path):
    """A folder tree with hostile names, shims on PATH, and where the probes write."""
    shims = tmp_path / "shims"
    shims.mkdir()
    for name, source in (("srun", SRUN), ("scontrol", SCONTROL), ("apptainer", APPTAINER),
                         ("torchrun", PROBE)):
        _shim(shims, name, source)
    python = _shim(shims, "py", PROBE)         # "this host's interpreter": the probe
    out = tmp_path / "probe"
    out.mkdir()
    spec_dir = tmp_path / "spec dir $(touch PWNED_DIR) `touch PWNED_DIR2` * 'q'"
    spec_dir.mkdir()
    home = tmp_path / "home \"dq\" $(touch PWNED_HOME) %j"
    return {"tmp": tmp_path, "shims": shims, "python": python, "out": out, "spec_dir": spec_dir, "home": home}


def _spec(c: dict, **slurm: object) -> object:
    text = {"name": "hostile", "nodes": 2, "command": ["python", *HOSTILE_ARGS], "env": HOSTILE_ENV,
            "checkpoint": {"dir": f"/workspace/data/{CKPT}"}, "slurm": slurm,
            "image": {"tag": "registry.example.com/team/job:v1"},
            "volumes": [{"name": "data", "mount": "/workspace/data", "host_path": DATA}]}
    path = c["spec_dir"] / "job.yaml"
    path.write_text(json.dumps(text), encoding="utf-8")     # JSON is YAML: every string exactly as above
    return load_spec(path)


def _run(c: dict, spec: object, **extra_env: str) -> tuple[subprocess.CompletedProcess, Plan[Any]]:
    host = HostFacts(cpus=(0,), python=str(c["python"]), home=c["home"])
    plan = backends.render_plan(spec, load_profile("cpu"), "slurm", AttemptContext(), host)
    script = c["tmp"] / "job.sbatch"
    script.write_text(plan.request.script, encoding="utf-8")
    env = {"PATH": f"{c['shims']}{os.pathsep}{os.environ['PATH']}", "HOME": str(c["tmp"]),
           "PROBE_OUT": str(c["out"]), "PROBE_EXIT_1": "3",
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", **extra_env}
    ran = subprocess.run(["bash", str(script)], cwd=c["tmp"], env=env, capture_output=True, text=True, timeout=120)
    return ran, plan


def _no_injection(c: dict) -> None:
    ran_anything = sorted(str(p.relative_to(c["tmp"])) for p in c["tmp"].rglob("PWNED*"))
    assert not ran_anything, f"a hostile value ran as a command: {ran_anything}"


def test_every_hostile_value_arrives_as_one_literal_word(cluster):
    c = cluster
    ran, plan = _run(c, _spec(c))
    assert ran.returncode == 3, ran.stderr          # srun's status: node 1's probe exited 3
    _no_injection(c)
    for node in (0, 1):
        got = json.loads((c["out"] / f"py-{node}.json").read_text())
        py = str(c["python"])
        is_host = "true" if node == 0 else "false"
        assert got["argv"] == [
            "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:29500", "--rdzv-id=hostile-a0",
            f"--rdzv-conf=join_timeout=600,read_timeout=600,is_host={is_host}", "--max-restarts=0", "--no-python",
            "--", py, "-m", "orchestrator.runtime.affinity", py, *HOSTILE_ARGS]
        env = got["env"]
        assert {k: env.get(k) for k in HOSTILE_ENV} == HOSTILE_ENV
        assert env["PET_NODE_RANK"] == str(node) and env["WMCTL_NODE_NAME"] == f"n{node + 1}"
        # no container: the volume's folder itself (the shared filesystem), as on the local backend
        assert env["WMCTL_CHECKPOINT_DIR"] == str(c["spec_dir"] / DATA / CKPT / "hostile")
        assert got["cwd"] == str(c["spec_dir"])
    attempt = c["home"] / "runs" / "hostile" / "attempt-0"
    assert [Path(p) for p in plan.request.node_logs] == [attempt / "node-0.log", attempt / "node-1.log"]
    for node in (0, 1):
        assert f"probe on node {node}" in (attempt / f"node-{node}.log").read_text()


def test_the_job_leaves_exit_records_a_watcher_reads(cluster):
    """How each node and the job ended, in the attempt folder, read back by classify."""
    c = cluster
    _, plan = _run(c, _spec(c))
    ends = [classify.node_end(Path(p).read_text()) for p in plan.request.node_exit_records]
    assert [(e.node, e.host, e.exit_code, e.job_id) for e in ends if e] == [(0, "n1", 0, "4242"), (1, "n2", 3, "4242")]
    job = classify.job_end(Path(plan.request.job_exit_record).read_text())
    assert job is not None and (job.job_id, job.exit_code) == ("4242", 3)
    assert ends[1] is not None
    event = classify.node_exited(ends[1])
    assert (event.kind, event.node, event.host, event.exit_code) == ("node_exited", 1, "n2", 3)
    assert not list(Path(plan.request.attempt_dir).glob("*.tmp"))


def test_a_node_that_fails_after_slurms_signal_is_evicted_not_the_jobs_error(cluster):
    """The time limit's SIGTERM can land inside torch's import, before the runtime's handler: the
    worker dies without saving and torchrun exits 1. The node's script records that the signal
    came, so the watcher reads a preemption (resubmit from the newest checkpoint, no retry spent),
    not the job's own error; the node that got no signal still reads as it exited."""
    from orchestrator import failures as F

    c = cluster
    _, plan = _run(c, _spec(c), PROBE_TERM_1="1", PROBE_EXIT_1="1")
    ends = [classify.node_end(Path(p).read_text()) for p in plan.request.node_exit_records]
    assert [(e.node, e.exit_code, e.signalled) for e in ends if e] == [(0, 0, False), (1, 1, True)]
    assert ends[1] is not None
    event = classify.node_exited(ends[1])
    assert (event.kind, event.reason, event.exit_code) == ("evicted", "Signalled", 1)
    failure = F.classify_event(event)
    assert failure is not None and failure.kind == F.PREEMPTED
    # a signalled node that saved (83) or that the teardown SIGKILLed (137) reads as before
    for code in (83, 137):
        assert classify.node_exited(classify.NodeEnd(1, "n2", code, "4242", 0.0, True)).kind == "node_exited"


def test_a_container_gets_the_same_words_and_its_mounts_whole(cluster):
    """apptainer: the node script runs inside the container (the shim runs it on this machine),
    with the run folder and each host_path volume bound, each --bind one word."""
    c = cluster
    ran, _ = _run(c, _spec(c, container="apptainer"))
    assert ran.returncode == 3, ran.stderr
    _no_injection(c)
    got = json.loads((c["out"] / "torchrun-0.json").read_text())
    assert got["argv"][-len(HOSTILE_ARGS) - 3:] == ["--", "wmctl-bind", "python", *HOSTILE_ARGS]
    assert {k: got["env"].get(k) for k in HOSTILE_ENV} == HOSTILE_ENV
    assert got["env"]["WMCTL_CHECKPOINT_DIR"] == f"/workspace/data/{CKPT}/hostile"
    apptainer = json.loads((c["out"] / "apptainer-0.json").read_text())
    run_dir = str(c["home"] / "runs" / "hostile")
    binds = [apptainer[i + 1] for i, a in enumerate(apptainer) if a == "--bind"]
    assert binds == [f"{run_dir}:{run_dir}", f"{c['spec_dir'] / DATA}:/workspace/data"]
    assert apptainer[apptainer.index("--pwd") + 1] == "/workspace"
    assert "docker://registry.example.com/team/job:v1" in apptainer


def test_pyxis_options_reach_srun_as_single_words(cluster):
    c = cluster
    ran, _ = _run(c, _spec(c, container="pyxis"))
    assert ran.returncode == 3, ran.stderr
    _no_injection(c)
    srun = json.loads((c["out"] / "srun.json").read_text())
    run_dir = str(c["home"] / "runs" / "hostile")
    assert f"--container-mounts={run_dir}:{run_dir},{c['spec_dir'] / DATA}:/workspace/data" in srun
    assert "--container-image=registry.example.com#team/job:v1" in srun
    assert "--container-workdir=/workspace" in srun
    got = json.loads((c["out"] / "torchrun-1.json").read_text())
    assert got["argv"][-len(HOSTILE_ARGS):] == HOSTILE_ARGS


@pytest.mark.parametrize("field,value", [
    ("partition", "gpu\n#SBATCH --uid=0"), ("account", "a b"), ("qos", "q#x"), ("reservation", 'r"'),
    ("constraint", "a100\\&ib"), ("gres", "gpu\nx"), ("time_limit", "1:00\n#SBATCH --uid=0"),
])
def test_a_value_for_an_sbatch_line_that_would_need_quoting_is_refused(cluster, field, value):
    with pytest.raises(SpecError) as exc:
        _run(cluster, _spec(cluster, **{field: value}))
    assert exc.value.problems[0][0] == f"slurm.{field}"


@pytest.mark.parametrize("option", ["--mail-user=a@b.c\n#SBATCH --uid=0", "--mail-user=a b", "--comment='x'",
                                    "--begin=now#x", "--hint=$(id)"])
def test_an_extra_option_that_would_need_quoting_is_refused(cluster, option):
    with pytest.raises(SpecError) as exc:
        _run(cluster, _spec(cluster, extra_options=[option]))
    assert exc.value.problems == [("slurm.extra_options[0]", exc.value.problems[0][1])]
    assert "not an sbatch option as wmctl takes them" in exc.value.problems[0][1]


def test_a_node_name_to_exclude_must_be_one(cluster):
    spec = _spec(cluster)
    host = HostFacts(cpus=(0,), python="/usr/bin/python3", home=cluster["home"])
    with pytest.raises(SpecError, match="--exclude-node"):
        backends.render_plan(spec, load_profile("cpu"), "slurm", AttemptContext(excluded_nodes=("n1 n2",)), host)


@pytest.mark.parametrize("home", ["relative/home", "/tmp/a\nb"])
def test_wmctl_home_must_be_absolute_and_one_line(cluster, home):
    host = HostFacts(cpus=(0,), python="/usr/bin/python3", home=Path(home))
    with pytest.raises(OptionError, match="WMCTL_HOME"):
        backends.render_plan(_spec(cluster), load_profile("cpu"), "slurm", AttemptContext(), host)


def test_after_wmctls_teardown_kills_the_steps_the_shell_waits_for_its_scancel(cluster):
    """wmctl's teardown (engine.cancel) writes the attempt's teardown marker, SIGKILLs the steps,
    then scancels the job. The shell must not end on the steps' exit first (CI saw it: Slurm then
    recorded the cancelled job FAILED, exit 137, as if it had failed by itself): it waits for the
    scancel's SIGTERM, and ends on it with the job's exit record written."""
    import signal
    import time

    from orchestrator.backends.slurm.render import TEARDOWN_FILE

    c = cluster
    host = HostFacts(cpus=(0,), python=str(c["python"]), home=c["home"])
    plan = backends.render_plan(_spec(c), load_profile("cpu"), "slurm", AttemptContext(), host)
    attempt = Path(plan.request.attempt_dir)
    attempt.mkdir(parents=True, exist_ok=True)
    (attempt / TEARDOWN_FILE).write_text("1\n")
    script = c["tmp"] / "job.sbatch"
    script.write_text(plan.request.script, encoding="utf-8")
    env = {"PATH": f"{c['shims']}{os.pathsep}{os.environ['PATH']}", "HOME": str(c["tmp"]),
           "PROBE_OUT": str(c["out"]), "PROBE_EXIT_0": "137", "PROBE_EXIT_1": "137",      # the steps SIGKILLed
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]"}
    proc = subprocess.Popen(["bash", str(script)], cwd=c["tmp"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        records = [Path(p) for p in plan.request.node_exit_records]
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in records):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        with pytest.raises(subprocess.TimeoutExpired):      # the steps are over: it waits for the scancel
            proc.wait(timeout=2)
        assert not (attempt / "job.exit.json").exists()
        proc.send_signal(signal.SIGTERM)                    # the scancel's
        assert proc.wait(timeout=30) == 137, proc.communicate()[0]
        assert json.loads((attempt / "job.exit.json").read_text())["exit_code"] == 137
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
