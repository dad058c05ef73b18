"""The spare-node keeper (runtime/keeper.py) runs where a node runs: a local process, a container,
a pod or a Slurm task, in an image that may hold no wmctl. So it is one file of standard library
only that a backend can mount and run by path; these tests hold it to that."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.runtime import keeper
from orchestrator.runtime.protocol import ENV_LOCAL_TAG, PROGRESS_PREFIX, format_progress, parse_progress

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


def test_keeper_exit_line_is_a_progress_line_of_the_protocols():
    """keeper.py repeats the progress line's prefix and format (it imports nothing of wmctl)."""
    assert keeper.PROGRESS_PREFIX == PROGRESS_PREFIX
    line = keeper.exit_line(3, 1, 137, 9, when=12.5)
    fields = {"round": 3, "slot": 1, "exit_code": 137, "signal": 9}
    assert line == format_progress(keeper.KEEPER_EXIT, **fields).rsplit('"time":', 1)[0] + '"time":12.5}'
    assert parse_progress(line) == {"event": keeper.KEEPER_EXIT, **fields, "time": 12.5}


def _held(tmp_path: Path, code: str, hold: list[str]) -> tuple[int, list[str]]:
    """Run a keeper for slot 0 of round 0 around ``python -c code``; without a hold it waits for
    teardown once its command failed, so the rounds are closed once its exit file is written."""
    rounds = tmp_path / "rounds"
    rounds.mkdir(exist_ok=True)
    keeper.write_round(rounds, 0, [0], "rdzv-0", {})
    log, ended = tmp_path / "log", tmp_path / "exit.json"
    log.unlink(missing_ok=True)
    ended.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-I", str(KEEPER), "--rounds", str(rounds), "--slot", "0", "--log", str(log),
         "--exit-file", str(ended), "--pid-file", str(tmp_path / "pid.json"), *hold, "--",
         sys.executable, "-c", code], cwd=tmp_path)
    try:
        if not hold:
            deadline = time.monotonic() + 60
            while not ended.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            keeper.close(rounds)
        return proc.wait(timeout=60), log.read_text().splitlines()
    finally:
        proc.kill()
        (rounds / keeper.CLOSED).unlink(missing_ok=True)


def test_a_held_keeper_says_its_failed_round_after_the_output(tmp_path):
    """With ``--hold`` (a pod's keeper) a failed torchrun's end is one progress line after its
    output, the round's, the slot's, its code and its signal; the keeper then holds and ends with
    the code. Killed by a signal, the line says which. Without a hold (local, Docker, Slurm: their
    watchers read the exit files) nothing is added to the output."""
    code, lines = _held(tmp_path, "print('last words', flush=True); raise SystemExit(3)", ["--hold", "0.1"])
    assert code == 3 and lines[0] == "last words"
    said = parse_progress(lines[-1])
    assert said is not None and lines[-1].startswith(PROGRESS_PREFIX) and len(lines) == 2
    assert {k: said[k] for k in ("event", "round", "slot", "exit_code", "signal")} == {
        "event": keeper.KEEPER_EXIT, "round": 0, "slot": 0, "exit_code": 3, "signal": None}
    code, lines = _held(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ["--hold", "0.1"])
    said = parse_progress(lines[-1])
    assert code == 137 and said is not None and (said["exit_code"], said["signal"]) == (137, 9)
    code, lines = _held(tmp_path, "print('last words', flush=True); raise SystemExit(3)", [])
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 3
    assert code == 0 and lines == ["last words"]          # closed at teardown: nothing added


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
