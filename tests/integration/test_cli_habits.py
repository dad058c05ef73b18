"""The CLI's kubectl/docker habits on real local runs: `logs` (--tail, --all-nodes, --raw, -f into
the next attempt), `describe`, `prune`, `-o json|yaml` results, and every `wmctl ...` command the
CLI prints for a user to run, collected from its real output and run as printed."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time

import click
import pytest
import yaml

from orchestrator.cli import COMMANDS, cli

from . import harness as h

# Under xdist the whole module runs on one worker (--dist loadgroup): its module fixtures run
# real jobs, which every worker given one of its tests would otherwise run again.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("cli-habits")]

RUN = "habits"


def write_spec(tmp, name, **kw):
    """harness.write_spec with a rendezvous port of its own: the machine's other runs prefer 29500."""
    path = h.write_spec(tmp, name, **kw)
    data = yaml.safe_load(path.read_text())
    data["local"] = {"master_port": random.randint(20000, 28000)}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-habits")


def env_of(home):
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO), "PYTHONFAULTHANDLER": "1"}
    env.pop("WMCTL_TEST_PAUSE_AT", None)
    return env


def wmctl(home, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env_of(home), capture_output=True,
                          text=True, timeout=timeout, cwd=str(h.REPO))


def wmctl_bg(home, *args):
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=env_of(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(h.REPO),
                            start_new_session=True)


@pytest.fixture(scope="module")
def killed(home):
    """A 2-node run whose node 1 is killed after checkpoint 10 and auto-resumed, followed from
    its first attempt by `wmctl logs -f --all-nodes`. Returns (follower's stdout, watcher's output)."""
    spec = write_spec(home, RUN, steps=40, every=5, sleep=0.1)
    w = h.Watch(spec, home)
    h.wait_until(lambda: (h.run_folder(home, RUN) / "attempt-0" / "node-1.log").exists(), 60, "node 1's log")
    follower = wmctl_bg(home, "logs", RUN, "-f", "--all-nodes")
    h.wait_checkpoint(home, RUN, 0, 10)
    assert h.kill_node(RUN, 0, 1) > 0
    assert w.wait() == 0, w.output
    try:
        out, err = follower.communicate(timeout=60)     # it ends by itself once the run has ended
    finally:
        if follower.poll() is None:
            os.killpg(follower.pid, signal.SIGKILL)
    assert follower.returncode == 0, err
    return out, w.output


def node_log(home, attempt, node):
    return (h.run_folder(home, RUN) / f"attempt-{attempt}" / f"node-{node}.log").read_text().splitlines()


def test_follow_goes_on_into_the_next_attempt_with_node_prefixes(home, killed):
    out, _ = killed
    lines = out.splitlines()
    banner = "==> habits-a1 (attempt 1) <=="
    assert banner in lines, out
    after = lines[lines.index(banner) + 1:]
    for node in (0, 1):        # every line of each node's attempt-1 log, prefixed, after the banner
        shown = [ln for ln in node_log(home, 1, node) if "WMCTL-PROGRESS" not in ln]
        assert shown and all(f"[node {node}] {ln}" in after for ln in shown), (node, out)
    assert any(ln.startswith("[node 1] ") for ln in lines[:lines.index(banner)]), out
    assert "WMCTL-PROGRESS" not in out
    assert all(re.match(r"\[node [01]\] |==> ", ln) for ln in lines), out


def test_progress_lines_hidden_unless_raw_and_tail_counts_the_lines_shown(home, killed):
    rank0 = next(n for n in (0, 1) if any("WMCTL-PROGRESS" in ln for ln in node_log(home, 1, n)))
    plain = wmctl(home, "logs", RUN, "--node", str(rank0))
    raw = wmctl(home, "logs", RUN, "--node", str(rank0), "--raw")
    assert plain.returncode == raw.returncode == 0, plain.stderr + raw.stderr
    assert "WMCTL-PROGRESS" not in plain.stdout and "WMCTL-PROGRESS" in raw.stdout
    assert raw.stdout.splitlines() == node_log(home, 1, rank0)
    tail = wmctl(home, "logs", RUN, "--node", str(rank0), "--raw", "--tail", "3", "--attempt", "0")
    assert tail.returncode == 0 and tail.stdout.splitlines() == node_log(home, 0, rank0)[-3:], tail.stderr
    every = node_log(home, 1, rank0)
    shown = [ln for ln in every if "WMCTL-PROGRESS" not in ln]
    # torchrun may print teardown warnings after the last progress line, so count from that line:
    # the last n raw lines hold one progress line, and --tail n must still show n lines, one of
    # them from before it (a tail that filtered after cutting would show n - 1).
    last = max(i for i, ln in enumerate(every) if "WMCTL-PROGRESS" in ln)
    n = len(every) - last
    assert len(shown) >= n      # a shown line before that progress line
    tail = wmctl(home, "logs", RUN, "--node", str(rank0), "--tail", str(n))
    assert tail.returncode == 0 and tail.stdout.splitlines() == shown[-n:], tail.stdout


def test_logs_shows_the_node_holding_global_rank_0_by_default_and_says_which(home, killed):
    """The rendezvous, not the node index, puts global rank 0 somewhere (node 1 in about half the
    local runs): what only rank 0 prints is on that node, so `wmctl logs RUN` shows it, and says
    on stderr which node it shows."""
    for attempt in (0, 1):
        rank0 = next(n for n in (0, 1) if any("WMCTL-PROGRESS" in ln for ln in node_log(home, attempt, n)))
        shown = wmctl(home, "logs", RUN, "--attempt", str(attempt), "--raw")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines() == node_log(home, attempt, rank0), (attempt, rank0)
        assert f"attempt {attempt}: node {rank0} (global rank 0)" in shown.stderr, shown.stderr


def test_since_and_timestamps_are_refused_on_local_naming_the_flag(home, killed):
    for flag in (["--since", "10m"], ["--timestamps"]):
        r = wmctl(home, "logs", RUN, *flag)
        assert r.returncode == 2 and flag[0] in r.stderr and "local" in r.stderr and "Traceback" not in r.stderr
        assert "docker, kubernetes" in r.stderr, r.stderr
    bad = wmctl(home, "logs", RUN, "--since", "ten minutes")
    assert bad.returncode == 2 and "--since" in bad.stderr and "30s" in bad.stderr, bad.stderr


def test_describe_tells_the_story_in_order(home, killed):
    r = wmctl(home, "describe", RUN, "-o", "json")
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)
    assert all(set(e) == {"time", "attempt", "event", "detail"} for e in events)
    kinds = [e["event"] for e in events]
    order = ["submitted", "attempt", "start", "checkpoint", "failure", "decision", "attempt", "resume",
             "succeeded", "ended"]
    it = iter(kinds)
    assert all(k in it for k in order), kinds          # a subsequence, in this order
    failure = next(e for e in events if e["event"] == "failure")
    assert failure["attempt"] == 0 and failure["detail"].startswith("node_lost on node 1"), failure
    times = [e["time"] for e in events]
    assert times == sorted(times) and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", t) for t in times)
    table = wmctl(home, "describe", RUN)
    assert table.returncode == 0 and "None" not in table.stdout
    assert table.stdout.splitlines()[1].split() == ["TIME", "ATTEMPT", "EVENT", "DETAIL"], table.stdout
    assert yaml.safe_load(wmctl(home, "describe", RUN, "-o", "yaml").stdout) == events


def _wmctl_commands(text: str) -> list[str]:
    """The `wmctl ...` commands a text tells its reader to run (quoted, or after a colon)."""
    found = [m.group(1).strip() for m in re.finditer(r"(?:`|:\s+)(wmctl [a-z][^`;\n]*)", text)]
    return [c for c in found if c.split()[1] in COMMANDS]


def _parses(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[0] == "wmctl"
    sub = cli.get_command(click.Context(cli), argv[1])
    assert sub is not None, command
    sub.make_context(argv[1], argv[2:])         # raises on an option or argument that does not parse
    return argv[1:]


def test_printed_commands_run_as_printed_and_do_what_they_say(home, tmp_path):
    """Every command submit, its errors and Ctrl-C print, pasted back into wmctl."""
    spec = write_spec(tmp_path, "pasted", nodes=1, steps=6, every=3, sleep=0.3)
    first = wmctl(home, "submit", str(spec), "--detach")
    assert first.returncode == 0, first.stderr
    printed = _wmctl_commands(first.stdout)
    assert printed == ["wmctl watch pasted --auto-resume", "wmctl status pasted"], first.stdout
    argv = [_parses(c) for c in printed]
    status = wmctl(home, *argv[1])                  # "shows where it stands"
    assert status.returncode == 0 and "run pasted (local)" in status.stdout, status.stderr
    watch = wmctl(home, *argv[0])                   # "starts one": it watches the run to its end
    assert watch.returncode == 0 and "succeeded" in watch.stdout, watch.stdout + watch.stderr

    again = wmctl(home, "submit", str(spec), "--detach")       # the name is taken: the hint says what to do
    assert again.returncode == 4
    hinted = _wmctl_commands(again.stderr)
    assert hinted == ["wmctl delete pasted"], again.stderr
    deleted = wmctl(home, *_parses(hinted[0]))
    assert deleted.returncode == 0 and "pasted" not in wmctl(home, "list").stdout, deleted.stderr

    # a detached watcher: its lines are where submit says
    long = write_spec(tmp_path, "pasted2", nodes=1, steps=400, every=50, sleep=0.2)
    sub = wmctl(home, "submit", str(long), "--detach", "--auto-resume")
    assert sub.returncode == 0, sub.stderr
    (logs_cmd,) = _wmctl_commands(sub.stdout)
    lines = wmctl(home, *_parses(logs_cmd))
    assert lines.returncode == 0 and "pasted2" in lines.stdout, lines.stderr
    busy = wmctl(home, "submit", str(long), "--detach")         # not ended, and watched: look at it, or cancel
    assert busy.returncode == 4
    hinted = _wmctl_commands(busy.stderr)
    assert hinted == ["wmctl status pasted2", "wmctl cancel pasted2"], busy.stderr
    look = wmctl(home, *_parses(hinted[0]))
    assert look.returncode == 0 and "run pasted2 (local): running" in look.stdout, look.stdout + look.stderr
    second = wmctl(home, "watch", "pasted2")                    # a second watcher is refused, and says what works
    assert second.returncode == 4 and _wmctl_commands(second.stderr) == ["wmctl status pasted2"], second.stderr
    cancel = wmctl(home, *_parses(hinted[1]))
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout, cancel.stderr
    assert h.record(home, "pasted2")["status"] == "cancelled"
    assert not h.leftover_processes("pasted2")


def test_ctrl_c_on_watch_prints_commands_that_reattach_and_cancel(home, tmp_path):
    spec = write_spec(tmp_path, "pasted3", nodes=1, steps=400, every=50, sleep=0.2)
    assert wmctl(home, "submit", str(spec), "--detach").returncode == 0
    watcher = wmctl_bg(home, "watch", "pasted3")
    h.wait_until(lambda: (h.run_folder(home, "pasted3") / "watcher.json").exists(), 60, "the watcher's lease")
    os.killpg(watcher.pid, signal.SIGINT)
    try:
        _, err = watcher.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the watcher outlived Ctrl-C by 30 s:\n{h.dump_stacks(watcher)}") from None
    assert watcher.returncode == 130, err
    reattach, cancel = _wmctl_commands(err)
    assert (reattach, cancel) == ("wmctl watch pasted3 --auto-resume", "wmctl cancel pasted3"), err
    again = wmctl_bg(home, *_parses(reattach))                  # re-attaches: it holds the run again
    h.wait_until(lambda: (h.run_folder(home, "pasted3") / "watcher.json").exists(), 60, "re-attached")
    stop = wmctl(home, *_parses(cancel))
    assert stop.returncode == 0, stop.stderr
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 8 and "cancel" in out, out       # the re-attached watcher saw the cancel
    assert h.record(home, "pasted3")["status"] == "cancelled"


def test_results_as_json_and_yaml_have_list_s_schema_and_no_none(home, killed):
    rows = json.loads(wmctl(home, "list", "-o", "json").stdout)
    mine = next(r for r in rows if r["run"] == RUN)
    cancel = wmctl(home, "cancel", RUN, "-o", "json")
    assert cancel.returncode == 0, cancel.stderr
    result = json.loads(cancel.stdout)
    assert set(result) == set(mine) and result["status"] == "succeeded"   # an ended run stays as it ended
    assert yaml.safe_load(wmctl(home, "cancel", RUN, "-o", "yaml").stdout) == result
    assert "None" not in wmctl(home, "list").stdout


def test_prune_deletes_only_runs_ended_long_enough_ago_and_keeps_checkpoints(home, killed, tmp_path):
    spec = write_spec(tmp_path, "pruned-running", nodes=1, steps=400, every=50, sleep=0.2)
    sub = wmctl(home, "submit", str(spec), "--detach", "-o", "json")     # the result on stdout, lines on stderr
    assert sub.returncode == 0, sub.stderr
    result = json.loads(sub.stdout)
    assert (result["run"], result["backend"], result["status"], result["attempts"]) == \
        ("pruned-running", "local", "running", 1)
    assert set(result) == {"run", "backend", "status", "attempts", "step", "watcher", "problem"}
    assert "submitted pruned-running attempt 0" in sub.stderr
    try:
        kept = wmctl(home, "prune", "--older-than", "1h")
        assert kept.returncode == 0 and "deleted 0 run(s)" in kept.stdout, kept.stdout
        dry = wmctl(home, "prune", "--older-than", "0s", "--dry-run")
        assert dry.returncode == 0 and RUN in dry.stdout and "pruned-running" not in dry.stdout, dry.stdout
        assert (h.run_folder(home, RUN) / "run.json").exists()
        gone = wmctl(home, "prune", "--older-than", "0s")
        assert gone.returncode == 0 and RUN in gone.stdout, gone.stdout + gone.stderr
        assert not (h.run_folder(home, RUN) / "run.json").exists()
        assert (h.run_checkpoints(home / f"{RUN}.yaml")).is_dir()              # never the checkpoints
        assert h.record(home, "pruned-running")["status"] == "running"         # never a running run
        refused = wmctl(home, "delete", "pruned-running")                        # nor does delete: it says how
        assert refused.returncode == 4
        (hinted,) = _wmctl_commands(refused.stderr)
        assert hinted == "wmctl cancel pruned-running", refused.stderr
        assert wmctl(home, *_parses(hinted)).returncode == 0
        assert wmctl(home, "delete", "pruned-running").returncode == 0            # "first, then delete it"
    finally:
        wmctl(home, "cancel", "pruned-running")


def test_follow_of_a_run_nobody_watches_ends_when_a_killed_node_ends_it(home, tmp_path):
    """No watcher records the end; the follower reconciles the run in memory (never saving it, never
    taking the lease) and stops, while the surviving node still waits for its peer."""
    run = "unwatched-follow"
    spec = write_spec(tmp_path, run, steps=400, every=50, sleep=0.1)
    assert wmctl(home, "submit", str(spec), "--detach").returncode == 0
    try:
        h.wait_step(home, run, 0, 3)
        follower = wmctl_bg(home, "logs", run, "-f", "--all-nodes")
        time.sleep(1.0)
        # Node 0 frozen whole (agent, torchrun, job): its log never ends, so only the record can
        # end the follow. Left running, it may end by itself within a second of its peer's death
        # (gloo raises on the closed peer), and the test would not tell which ended the follow.
        assert h.kill_node(run, 0, 0, signal.SIGSTOP) > 0
        assert h.kill_node(run, 0, 1) > 0
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "[node 0] " in out and "==>" not in out, out
        assert h.node_pids(run, 0, 0), "node 0 still exists: the follower ended on the record, not on its exit"
        assert h.record(home, run)["status"] == "running"      # the follower saved nothing
    finally:
        h.kill_node(run, 0, 0, signal.SIGCONT)
        wmctl(home, "cancel", run)
