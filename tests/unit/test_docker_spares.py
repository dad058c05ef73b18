"""Spare nodes on Docker (restart.spares, docs/spares.md), without an engine: the plan (slot
containers running the keeper, the c10d store in a container of its own, what each mounts), the
shell line that finds the image's python, the host's rounds and exit files, and the refusal on a
remote engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator import labels as L
from orchestrator import layout
from orchestrator.backends.docker import slotfiles
from orchestrator.backends.docker import spares as S
from orchestrator.backends.docker.engine import DockerBackend
from orchestrator.plan import AttemptContext
from orchestrator.runtime import keeper
from orchestrator.vendors import load_profile

from .helpers import render_plan, spec_from

BASE = {"name": "dsp", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "x:1"}}


def _plan(cpus: int = 8, **extra):
    spec = spec_from({**BASE, "restart": {"spares": 1}, **extra})
    return spec, render_plan(spec, load_profile("cpu"), "docker", AttemptContext(attempt=3), cpus=list(range(cpus)))


def test_a_plan_with_a_spare_has_three_keeper_slots_and_the_store_apart():
    spec, plan = _plan()
    stores = [r for r in plan.resources if r["kind"] == "store"]
    slots = [r for r in plan.resources if r["kind"] == "container"]
    assert [r.get("spare") for r in slots] == [False, False, True]
    assert plan.to_dict()["extra"]["spares"] == 1
    store = stores[0]["create"]
    assert store["name"] == "dsp-a3-store" and store["network"] == "dsp-a3"
    assert store["labels"][L.NODE] == "store" and store["labels"][L.RUN] == "dsp" and store["labels"][L.ATTEMPT] == "3"
    assert store["command"][-3:] == [S.STORE, "--port", str(spec.rendezvous.port)]
    assert [m["Target"] for m in store["mounts"]] == [S.STORE]
    for slot in slots:
        create, node = slot["create"], slot["node"]
        argv = create["command"]
        assert argv[:3] == ["sh", "-c", S.PYTHON_SH]
        assert argv[argv.index("--slot") + 1] == str(node) and argv[argv.index("--log") + 1] == "-"
        torchrun = argv[argv.index("--", argv.index("--pid-file")) + 1:]
        assert torchrun[:3] == [S.PYTHON_WORD, "-m", "torch.distributed.run"]
        assert f"--rdzv-endpoint=dsp-a3-store:{spec.rendezvous.port}" in torchrun
        assert any(a.startswith("--rdzv-conf=") and a.endswith(",is_host=false") for a in torchrun)
        assert "--node-rank" not in " ".join(torchrun)
        env = create["environment"]
        # c10d ranks the nodes of each round; the keeper finds its processes by the tag
        assert "PET_NODE_RANK" not in env and env["WMCTL_LOCAL_TAG"] == create["name"]
        assert env["WMCTL_FENCE_EPOCH"] == "3000"
        assert create["labels"][L.NODES] == "3"
        mounts = {m["Target"]: m for m in create["mounts"]}
        assert mounts[S.KEEPER]["ReadOnly"] and mounts[S.KEEPER]["Source"] == S.source_files()[0]
        assert mounts[S.ROUNDS]["ReadOnly"] and mounts[S.ROUNDS]["Source"] == str(layout.rounds_dir("dsp", 3))
        assert not mounts[S.SLOTS]["ReadOnly"] and mounts[S.SLOTS]["Source"] == str(S.slots_dir("dsp", 3))
    assert any("1 spare node(s) (slots 2) wait beside" in n for n in plan.notes), plan.notes


def test_spare_slots_split_the_cpus_or_share_a_nodes_when_too_few():
    _, plan = _plan(cpus=6)
    assert [r["create"]["cpuset_cpus"] for r in plan.resources if r["kind"] == "container"] == ["0-1", "2-3", "4-5"]
    _, plan = _plan(cpus=2)
    assert [r["create"]["cpuset_cpus"] for r in plan.resources if r["kind"] == "container"] == ["0", "1", "0"]
    assert any("a spare shares a node's" in n for n in plan.notes), plan.notes


def test_a_plan_without_spares_keeps_the_node_rank_and_no_keeper():
    spec = spec_from(BASE)
    plan = render_plan(spec, load_profile("cpu"), "docker", AttemptContext(), cpus=list(range(8)))
    assert not [r for r in plan.resources if r["kind"] == "store"]
    slots = [r for r in plan.resources if r["kind"] == "container"]
    assert [r["create"]["environment"]["PET_NODE_RANK"] for r in slots] == ["0", "1"]
    assert all(r["create"]["command"][0] == "torchrun" and "spare" not in r for r in slots)
    assert "spares" not in plan.to_dict()["extra"]


def test_the_python_line_runs_the_images_python_and_replaces_only_the_first_marker(tmp_path):
    """The shell line every spare-node container starts with, run for real: python3 (else
    python) from PATH is exec'd with the words given, its first PYTHON_WORD replaced; a user's
    word equal to the marker, or with shell in it, is passed as it is."""
    out = tmp_path / "argv.json"
    script = f"import json, sys; json.dump([sys.executable, *sys.argv[1:]], open({str(out)!r}, 'w'))"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    words = ["-c", script, S.PYTHON_WORD, "$(touch pwned)", S.PYTHON_WORD]
    done = subprocess.run(["sh", "-c", S.PYTHON_SH, "wmctl-keeper", *words], env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0
    got = json.loads(out.read_text())
    assert got[1:] == [str(bin_dir / "python3"), "$(touch pwned)", S.PYTHON_WORD]
    assert not (tmp_path / "pwned").exists()


def test_an_image_without_python_says_so(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "sh").symlink_to("/bin/sh")
    done = subprocess.run(["/bin/sh", "-c", S.PYTHON_SH, "wmctl-keeper", "x"], env={"PATH": str(empty)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 127 and "no python3 or python to run the spare-node keeper" in done.stderr


def test_rounds_and_exit_files_on_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    slotfiles.prepare("dsp", 1, [0, 1], shared=True)
    assert os.stat(S.slots_dir("dsp", 1)).st_mode & 0o7777 == 0o1777
    info = slotfiles.current("dsp", 1)
    assert info is not None and info["active"] == [0, 1] and info["rdzv_id"] == layout.round_rendezvous_id("dsp", 1, 0)
    slotfiles.prepare("dsp", 1, [0, 1], shared=False)         # an adopted attempt: round 0 is not written again
    assert len(keeper.all_rounds(layout.rounds_dir("dsp", 1))) == 1
    exit_path = S.slots_dir("dsp", 1) / S.exit_file(1)
    exit_path.write_text(json.dumps({"exit_code": 1, "signal": None, "time": 5.0, "round": 0}))
    ended = slotfiles.round_end("dsp", 1, 1, 0)
    assert ended is not None and ended["exit_code"] == 1
    pid_path = S.slots_dir("dsp", 1) / S.pid_file(1)
    pid_path.write_text(json.dumps({"keeper": 1, "agent": None, "started": 4.0, "round": -1}))
    assert slotfiles.round_start("dsp", 1, 1, 0) is None           # a keeper waiting: not started
    pid_path.write_text(json.dumps({"keeper": 1, "agent": 7, "started": 4.5, "round": 0}))
    assert slotfiles.round_start("dsp", 1, 1, 0) == 4.5
    n, active = slotfiles.next_round("dsp", 1, lost=1, spare=2)
    assert slotfiles.round_start("dsp", 1, 1, 1) is None
    assert (n, active) == (1, [0, 2])
    info = slotfiles.current("dsp", 1)
    assert info is not None and info["env"] == {"WMCTL_RESUME": "1", "WMCTL_FENCE_EPOCH": "1001"}
    assert info["rdzv_id"] == layout.round_rendezvous_id("dsp", 1, 1)
    assert slotfiles.round_end("dsp", 1, 1, 1) is None       # round 0's end is not round 1's news
    assert slotfiles.used_slots("dsp", 1) == {0, 1, 2}
    slotfiles.close("dsp", 1)
    assert (layout.rounds_dir("dsp", 1) / keeper.CLOSED).exists()


def test_spares_on_a_remote_engine_are_refused_naming_the_field(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.11.12.13:2376")
    spec = spec_from({**BASE, "restart": {"spares": 1}})
    problems = DockerBackend().check_host(spec)
    assert [field for field, _ in problems] == ["restart.spares"]
    assert "set restart.spares: 0" in problems[0][1] and "10.11.12.13" in problems[0][1]
    assert DockerBackend().check_host(spec_from(BASE)) == []


@pytest.mark.parametrize("spares", [0, 1])
def test_the_docker_run_line_of_every_container_is_shell_quoted(spares):
    import shlex

    spec = spec_from({**BASE, "restart": {"spares": spares}})
    plan = render_plan(spec, load_profile("cpu"), "docker", AttemptContext(), cpus=list(range(8)))
    for r in plan.resources:
        if r["kind"] in ("container", "store"):
            words = shlex.split(r["docker_run"])
            assert words[-len(r["create"]["command"]):] == list(r["create"]["command"])


def test_a_replenished_spare_is_the_lost_slots_container_renamed(tmp_path, monkeypatch):
    """replenish_spare's container: the lost slot's (its CPUs, mounts, torchrun line), under the
    new slot's name, labels, tag and keeper slot; read back from the attempt's saved plan."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    _, plan = _plan(cpus=6)
    slotfiles.prepare("dsp", 3, [0, 1], shared=False)
    slotfiles.save_plan("dsp", 3, plan.to_dict())
    lost = slotfiles.slot_resource("dsp", 3, 1)
    assert lost is not None and slotfiles.slot_resource("dsp", 3, 9) is None
    fresh = S.for_slot(lost, "dsp", 3, 3)
    create, before = fresh["create"], lost["create"]
    assert fresh["node"] == 3 and fresh["spare"] and fresh["aliases"] == ["dsp-a3-3"]
    assert create["name"] == create["hostname"] == "dsp-a3-3"
    assert create["labels"][L.NODE] == "3" and create["labels"][L.NODES] == "4"
    assert create["environment"]["WMCTL_LOCAL_TAG"] == create["environment"]["WMCTL_NODE_NAME"] == "dsp-a3-3"
    argv = create["command"]
    assert argv[argv.index("--slot") + 1] == "3" and f"{S.SLOTS}/{S.exit_file(3)}" in argv
    assert argv[argv.index(S.PYTHON_WORD):] == before["command"][before["command"].index(S.PYTHON_WORD):]
    assert create["cpuset_cpus"] == before["cpuset_cpus"] == "2-3" and create["mounts"] == before["mounts"]
    assert before["name"] == "dsp-a3-1"          # the saved plan is left as it was


def test_the_cli_refuses_spares_on_a_remote_engine_before_anything(tmp_path):
    """`wmctl submit --dry-run` with DOCKER_HOST on another machine: exit 2 naming the field and the
    fix, no traceback (nothing contacts the engine)."""
    spec = tmp_path / "s.yaml"
    spec.write_text("name: dsx\ncommand: [python, train.py]\nnodes: 2\nimage: {vendor: cpu, tag: 'x:1'}\n"
                    "restart: {spares: 1}\n")
    env = {**os.environ, "DOCKER_HOST": "tcp://10.11.12.13:2376", "WMCTL_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "submit", str(spec), "--backend", "docker",
                           "--dry-run"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "restart.spares: spare nodes need the Docker engine on this machine" in done.stderr
    assert "set restart.spares: 0" in done.stderr and "Traceback" not in done.stderr
