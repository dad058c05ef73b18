"""The spare-node keeper (runtime/keeper.py) runs where a node runs: a local process, a container,
a pod or a Slurm task, in an image that may hold no wmctl. So it is one file of standard library
only that a backend can mount and run by path; these tests hold it to that."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator.runtime import keeper
from orchestrator.runtime.protocol import ENV_LOCAL_TAG

KEEPER = Path(keeper.__file__)


def test_keeper_imports_only_the_standard_library():
    tree = ast.parse(KEEPER.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"a relative import in keeper.py: {ast.dump(node)}"
            imported.add((node.module or "").split(".")[0])
    # torch only inside prewarm(), guarded: an image without torch still runs the keeper
    imported -= {"__future__", "torch"}
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_keeper_tag_name_is_the_protocols():
    assert keeper.ENV_LOCAL_TAG == ENV_LOCAL_TAG


def test_keeper_runs_by_path_outside_the_package(tmp_path):
    """Copied alone into a folder with nothing of wmctl beside it (a mounted file), it runs a
    round: slot 0 of round 0 runs the command, writes its exit file and returns its code."""
    alone = tmp_path / "mnt" / "keeper.py"
    alone.parent.mkdir()
    alone.write_text(KEEPER.read_text())
    rounds = tmp_path / "rounds"
    rounds.mkdir()
    keeper.write_round(rounds, 0, [0], "rdzv-0", {"ROUND_SAYS": "hello"})
    out = tmp_path / "out.txt"
    code = subprocess.run(
        [sys.executable, "-I", str(alone), "--rounds", str(rounds), "--slot", "0", "--log", str(tmp_path / "log"),
         "--exit-file", str(tmp_path / "exit.json"), "--pid-file", str(tmp_path / "pid.json"), "--",
         sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['ROUND_SAYS'])"],
        cwd=tmp_path, timeout=60).returncode
    assert code == 0
    assert out.read_text() == "hello"
    ended = json.loads((tmp_path / "exit.json").read_text())
    assert ended["exit_code"] == 0 and ended["round"] == 0


def test_keeper_without_a_command_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-I", str(KEEPER), "--rounds", str(tmp_path), "--slot", "0", "--log", "l",
                           "--exit-file", "e", "--pid-file", "p"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "the command to run each round" in proc.stderr


def test_keeper_log_dash_is_its_own_stdout(tmp_path):
    """``--log -``: the round's output goes to the keeper's stdout (a container's, which `docker
    logs` reads), not to a file named '-' and not by reopening /dev/stdout."""
    rounds = tmp_path / "rounds"
    rounds.mkdir()
    keeper.write_round(rounds, 0, [0], "rdzv-0", {})
    proc = subprocess.run(
        [sys.executable, "-I", str(KEEPER), "--rounds", str(rounds), "--slot", "0", "--log", "-",
         "--exit-file", str(tmp_path / "exit.json"), "--pid-file", str(tmp_path / "pid.json"), "--",
         sys.executable, "-c", "print('from the round', flush=True)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "from the round" in proc.stdout
    assert not (tmp_path / "-").exists()


def test_a_keepers_agent_polls_its_rendezvous_faster_scaled_to_the_nodes(monkeypatch):
    """torch's agents ask the store once a second whether the rendezvous is complete (up to a
    second lost per recovery); a keeper's forked torchrun asks every sync_poll_s instead, and
    only that delay changes."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    asked: list[object] = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", lambda seconds: asked.append(seconds))
    monkeypatch.setattr(dynamic_rendezvous, "_BackendRendezvousStateHolder",
                        dynamic_rendezvous._BackendRendezvousStateHolder)
    keeper.quicken_rendezvous(keeper.sync_poll_s(2))
    dynamic_rendezvous._delay(seconds=1)
    dynamic_rendezvous._delay((0, 0.3))          # the first round's random skew: scaled alike
    dynamic_rendezvous._delay(0.5)               # any other delay: kept
    assert asked == [0.05, (0, 0.015), 0.5]
    # the state the join loop reads is cached for poll_s, not a second
    nothing: Any = object()
    holder = dynamic_rendezvous._BackendRendezvousStateHolder(nothing, nothing)
    assert holder._cache_duration == 0.05
    assert [keeper.sync_poll_s(n) for n in (2, 100, 500, 5000)] == [0.05, 0.1, 0.5, 1.0]
