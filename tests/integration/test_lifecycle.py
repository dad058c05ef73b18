"""The run lifecycle on the local backend, with real processes: cancel in every phase with the
watcher in another process, two watchers, a detached watcher, and runs nobody watches.

Each test asserts the final state, the exit codes, and that no attempt was submitted twice
(each attempt folder exists once, and the record lists each attempt once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from . import harness as h

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("wmctl-life")


def wmctl(home, *args, timeout=120):
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)}
    env.pop("WMCTL_TEST_PAUSE_AT", None)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=str(h.REPO))


def cancel_in_background(home, run, *extra):
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "cancel", run, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(h.REPO))


def submitted_attempts(home, run) -> list[int]:
    rec = h.record(home, run)
    numbers = [a["attempt"] for a in rec["attempts"]]
    assert len(numbers) == len(set(numbers)), f"an attempt was recorded twice: {numbers}"
    return numbers


def attempt_folders(home, run) -> list[str]:
    return sorted(p.name for p in h.run_folder(home, run).glob("attempt-*"))


def pause_marker(home, run, phase):
    return h.run_folder(home, run) / f"pause-{phase}"


def held_watch(home, run, phase, **spec_kw):
    """A watcher in another process, held open at ``phase`` by the test hook."""
    spec = h.write_spec(home, run, **spec_kw)
    os.environ["WMCTL_TEST_PAUSE_AT"] = phase
    try:
        w = h.Watch(spec, home)
    finally:
        del os.environ["WMCTL_TEST_PAUSE_AT"]
    marker = pause_marker(home, run, phase)
    h.wait_until(marker.exists, 120, f"the watcher to reach {phase}")
    return w, marker


def cancel_while_held(home, run, marker):
    """Cancel from another process while the watcher is held; let the watcher go once the intent
    is recorded (the cancel waits for the watcher to end the run)."""
    proc = cancel_in_background(home, run)
    h.wait_until((h.run_folder(home, run) / "cancel.json").exists, 60, "the cancel intent")
    marker.unlink()
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def assert_cancelled(home, run, w, attempts):
    assert w.wait(timeout=120) == 8, w.output
    rec = h.record(home, run)
    assert rec["status"] == "cancelled", rec
    assert submitted_attempts(home, run) == attempts
    assert not h.leftover_processes(run)
    assert "cancelled" in rec["final_report"]


def test_cancel_while_submitting_submits_nothing(home):
    run = "c-submitting"
    w, marker = held_watch(home, run, "submitting", nodes=1, steps=400)
    code, out = cancel_while_held(home, run, marker)
    assert code == 0, out
    assert_cancelled(home, run, w, [0])
    assert attempt_folders(home, run) == [], "attempt 0 was submitted after the cancel"
    assert "not submitted: the run was cancelled" in w.output


def test_cancel_while_starting_tears_the_attempt_down(home):
    run = "c-starting"
    w, marker = held_watch(home, run, "starting", nodes=2, steps=400)
    code, out = cancel_while_held(home, run, marker)
    assert code == 0, out
    assert_cancelled(home, run, w, [0])
    assert attempt_folders(home, run) == ["attempt-0"]


def test_cancel_during_the_backoff_wait_submits_nothing_more(home):
    run = "c-backoff"
    spec = h.write_spec(home, run, nodes=1, steps=400, restart={"backoff": "60s"})
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    assert h.kill_node(run, 0, 0) > 0
    h.wait_until(lambda: "backing off 60 s" in w.output, 60, "the backoff")
    started = time.monotonic()
    cancel = wmctl(home, "cancel", run)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert_cancelled(home, run, w, [0])
    assert time.monotonic() - started < 30, "the watcher slept out its backoff instead of waking for the cancel"
    assert attempt_folders(home, run) == ["attempt-0"]
    assert h.record(home, run)["attempts"][0]["outcome"] == "node_lost"


def test_cancel_during_the_teardown_of_a_failed_attempt_submits_nothing_more(home):
    run = "c-teardown"
    marker = pause_marker(home, run, "teardown")
    spec = h.write_spec(home, run, nodes=1, steps=400)
    os.environ["WMCTL_TEST_PAUSE_AT"] = "teardown"
    try:
        w = h.Watch(spec, home)
    finally:
        del os.environ["WMCTL_TEST_PAUSE_AT"]
    h.wait_checkpoint(home, run, 0, 5)
    assert h.kill_node(run, 0, 0) > 0
    h.wait_until(marker.exists, 60, "the teardown")
    code, out = cancel_while_held(home, run, marker)
    assert code == 0, out
    assert_cancelled(home, run, w, [0])
    assert attempt_folders(home, run) == ["attempt-0"]


def test_graceful_cancel_waits_for_the_checkpoint_then_ends_cancelled(home):
    run = "c-graceful"
    spec = h.write_spec(home, run, nodes=1, steps=400, every=1000)   # no periodic checkpoint
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 3)
    cancel = wmctl(home, "cancel", run, "--graceful")
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert_cancelled(home, run, w, [0])
    events = h.progress(home, run, 0)
    saved = [p["step"] for p in events if p["event"] == "checkpoint"]
    assert saved, "SIGTERM did not get its checkpoint before the teardown"
    assert any(p["event"] == "preempted" for p in events)
    rec = h.record(home, run)
    assert f"newest checkpoint is step {saved[-1]}" in rec["final_report"]
    assert "gracefully" in rec["final_report"]


def test_a_second_watcher_is_refused_naming_the_first(home):
    run = "two-watchers"
    spec = h.write_spec(home, run, nodes=1, steps=400)
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 1)
    second = wmctl(home, "watch", run, "--auto-resume")
    assert second.returncode == 4 and "Traceback" not in second.stderr
    assert f"watched by {w.proc.pid}@" in second.stderr
    status = wmctl(home, "status", run)
    assert f"watcher: watched by {w.proc.pid}@" in status.stdout
    assert wmctl(home, "cancel", run).returncode == 0
    assert_cancelled(home, run, w, [0])


def assert_unwatched_status(home, run: str, expected: str, outcome: str | None) -> dict[str, Any]:
    """What `wmctl status` and `wmctl list` say of a run nobody watches, once it is ``expected``:
    the truth, with no watcher and no None in it. Returns the status JSON."""
    def settled():
        return json.loads(wmctl(home, "status", run, "-o", "json").stdout)["status"] == expected
    h.wait_until(settled, 120, f"status {expected}")
    status = wmctl(home, "status", run)
    assert status.returncode == 0 and "None" not in status.stdout
    assert "watcher: unwatched" in status.stdout
    data = json.loads(wmctl(home, "status", run, "-o", "json").stdout)
    assert data["watcher"] == {"state": "unwatched", "pid": None, "host": None, "beat_age_s": None}
    assert data["attempts"][0]["outcome"] == outcome, data
    listing = [line.split() for line in wmctl(home, "list").stdout.splitlines()]
    assert [run, "local", expected] == next(r[:3] for r in listing if r[0] == run)
    assert submitted_attempts(home, run) == [0]
    return data


# A node killed unwatched: test_a_node_killed_unwatched_is_node_lost_however_late_anyone_looks.
@pytest.mark.parametrize("outcome", ["succeeded", "app_error", "running-then-cancelled"])
def test_status_of_a_run_nobody_watches_is_the_truth(home, outcome):
    run = f"unwatched-{outcome.replace('_', '-')}"
    cases: dict[str, dict[str, Any]] = {
        "succeeded": {"steps": 10}, "app_error": {"steps": 400, "job_args": ["--fail-at", "3"]},
        "running-then-cancelled": {"steps": 4000}}
    # app_error on 2 nodes: the peer's end must not be read as the cause
    spec = h.write_spec(home, run, nodes=2 if outcome == "app_error" else 1, **cases[outcome])
    sub = wmctl(home, "submit", str(spec))
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert f"nothing will resume {run}" in sub.stdout
    if outcome == "running-then-cancelled":
        h.wait_step(home, run, 0, 2)
        assert_unwatched_status(home, run, "running", None)
        assert wmctl(home, "cancel", run).returncode == 0
        assert_unwatched_status(home, run, "cancelled", "cancelled")
    else:
        assert_unwatched_status(home, run, {"succeeded": "succeeded", "app_error": "failed"}[outcome], outcome)
    h.wait_until(lambda: not h.leftover_processes(run), 60, "no processes left")


def test_a_node_killed_unwatched_is_node_lost_however_late_anyone_looks(home):
    """Issue 22 item 2: nobody looks until the survivor has died of the lost peer (gloo's
    "Connection closed by peer", exit 1) and longer than the consequence window has passed since.
    The vanished node is still the cause, and a later watcher resumes the run from its checkpoint."""
    from orchestrator.failures import CONSEQUENCE_WINDOW_S

    run = "unwatched-late-look"
    spec = h.write_spec(home, run, nodes=2, steps=60)
    assert wmctl(home, "submit", str(spec)).returncode == 0
    h.wait_checkpoint(home, run, 0, 5)
    assert h.kill_node(run, 0, 1) > 0
    survivor = h.run_folder(home, run) / "attempt-0" / "node-0.exit.json"
    h.wait_until(survivor.exists, 120, "the survivor to exit")
    exited = json.loads(survivor.read_text())
    assert exited["exit_code"] not in (0, 137), exited       # it died of the lost peer, not of a signal
    assert not (h.run_folder(home, run) / "attempt-0" / "node-1.exit.json").exists()
    # The look comes late: longer after the survivor's exit than the consequence window.
    h.wait_until(lambda: time.time() > exited["time"] + CONSEQUENCE_WINDOW_S + 1, 60, "a late look")
    # the first look after that already says it (assert_unwatched_status would wait for it)
    assert json.loads(wmctl(home, "status", run, "-o", "json").stdout)["status"] == "failed"
    data = assert_unwatched_status(home, run, "failed", "node_lost")
    assert data["attempts"][0]["failed_node"] == 1, data
    assert "wmctl watch" in data["final_report"] and "--auto-resume" in data["final_report"]
    w = h.Watch(spec, home, run, "--auto-resume", command="watch")
    assert w.wait(timeout=240) == 0, w.output
    assert "failed while nobody watched it (node_lost); resuming it" in w.output
    rec = h.record(home, run)
    assert rec["status"] == "succeeded", w.output
    assert submitted_attempts(home, run) == [0, 1]
    assert rec["attempts"][1]["resumed_from_step"] >= 5, rec["final_report"]


def test_detach_with_auto_resume_starts_a_watcher_never_knocked_off_by_status_in_a_loop(home):
    """`submit --detach --auto-resume` starts a watcher of its own that resumes the run after a
    node is killed, says where its log is, and lets go when done. Issue 22 item 3: another shell
    runs `wmctl status` in a loop from before the submit; the detached watcher still takes the
    run, keeps it, and resumes it."""
    run = "detached-looked-at"
    spec = h.write_spec(home, run, nodes=2, steps=60)
    env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(h.REPO)}
    loop = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys\n"
        "while True:\n"
        f"    subprocess.run([sys.executable, '-m', 'orchestrator.cli', 'status', {run!r}], capture_output=True)\n")],
        env=env, cwd=str(h.REPO))
    try:
        sub = wmctl(home, "submit", str(spec), "--detach", "--auto-resume")
        assert sub.returncode == 0, sub.stdout + sub.stderr
        assert f"wmctl logs {run} --watcher" in sub.stdout
        h.wait_checkpoint(home, run, 0, 5)
        assert "watcher: watched by " in wmctl(home, "status", run).stdout
        assert h.kill_node(run, 0, 1) > 0
        h.wait_until(lambda: h.record(home, run)["status"] != "running", 240, "the run to end")
    finally:
        loop.kill()
        loop.wait()
    log = wmctl(home, "logs", run, "--watcher").stdout
    assert "already watched" not in log, log
    assert h.record(home, run)["status"] == "succeeded", log
    assert submitted_attempts(home, run) == [0, 1]
    assert "attempt 0 failed: node_lost" in log and f"run {run} succeeded on attempt 1" in log, log
    h.wait_until(lambda: "watcher: unwatched" in wmctl(home, "status", run).stdout, 30, "the watcher to let go",
                 every=1.0)


def test_an_app_error_is_reported_with_the_jobs_own_traceback(home):
    run = "crashes"
    spec = h.write_spec(home, run, nodes=2, job="crash.py")
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 7, w.output
    rec = h.record(home, run)
    a0 = rec["attempts"][0]
    assert a0["outcome"] == "app_error"
    assert 'crash.py", line 18' in a0["evidence"] and "ValueError: bad batch shape (4, 3) at step 2" in a0["evidence"]
    assert a0["error"][-1] == "ValueError: bad batch shape (4, 3) at step 2"
    assert 'crash.py", line 18' in w.output
    status = wmctl(home, "status", run).stdout
    assert 'crash.py", line 18, in load_batch' in status and "torch/distributed" not in status


def test_a_rank_that_aborts_after_the_job_completed_does_not_fail_the_run(home):
    """Rank 1 dies of SIGABRT after the last barrier (as gloo + DCP teardown sometimes does): the
    job said it completed, its checkpoint is committed, so the run succeeded, and says why."""
    run = "aborts-at-exit"
    spec = h.write_spec(home, run, nodes=2, steps=6, every=3, sleep=0.05, job="tiny.py",
                        job_args=["--abort-at-exit", "1"])
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 0, w.output
    assert "aborted (SIGABRT)): a crash on the way out, not counted as a failure" in w.output
    assert h.record(home, run)["status"] == "succeeded"
    assert submitted_attempts(home, run) == [0]


def test_a_command_that_does_not_exist_is_named(home):
    run = "no-command"
    spec = h.write_spec(home, run, nodes=1, command=["pythonx", "counter.py"])
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 7, w.output
    a0 = h.record(home, run)["attempts"][0]
    assert "command not found: pythonx (exit 127)" in a0["evidence"], a0
    assert submitted_attempts(home, run) == [0]


def test_a_taken_run_name_is_refused_replaced_on_request_and_deleted(home):
    run = "reused"
    spec = h.write_spec(home, run, nodes=1, steps=6)
    w = h.Watch(spec, home)
    assert w.wait(timeout=120) == 0, w.output
    first = h.record(home, run)
    again = wmctl(home, "submit", str(spec))
    assert again.returncode == 4 and "Traceback" not in again.stderr
    assert f"a run named '{run}' already exists (succeeded" in again.stderr
    assert "--replace" in again.stderr and f"wmctl delete {run}" in again.stderr
    assert h.record(home, run) == first, "a refused submit changed the record"
    replaced = wmctl(home, "submit", str(spec), "--replace", "--auto-resume")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert f"replacing run {run} (succeeded)" in replaced.stdout
    second = h.record(home, run)
    assert second["created_at"] != first["created_at"] and submitted_attempts(home, run) == [0]
    assert not (h.run_folder(home, run).parent / ".archive").exists()
    gone = wmctl(home, "delete", run)
    assert gone.returncode == 0, gone.stderr
    assert "checkpoints under" in gone.stdout
    assert not h.run_folder(home, run).exists()
    assert run not in wmctl(home, "list").stdout
    assert wmctl(home, "status", run).returncode == 6
    ckpt = h.yaml.safe_load(spec.read_text())["checkpoint"]["dir"]
    assert any(os.scandir(ckpt)), "delete removed the run's checkpoints"


def test_a_running_run_is_neither_replaced_nor_deleted(home):
    run = "busy"
    spec = h.write_spec(home, run, nodes=1, steps=4000)
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 1)
    for args in (("submit", str(spec), "--replace"), ("delete", run)):
        out = wmctl(home, *args)
        assert out.returncode == 4 and "has not ended" in out.stderr, out.stderr
        assert f"watched by {w.proc.pid}@" in out.stderr
    assert wmctl(home, "cancel", run).returncode == 0
    assert_cancelled(home, run, w, [0])


def test_two_runs_of_one_name_in_two_homes_never_touch_each_other(tmp_path):
    """The README's run name in two WMCTL_HOMEs: cancelling one (and a teardown of its failed
    attempt) signals only its own processes, found by the random run id in its record."""
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    specs = []
    for home in homes:
        home.mkdir()
        specs.append(h.write_spec(home, "worldmodel", nodes=1, steps=4000))
        assert wmctl(home, "submit", str(specs[-1])).returncode == 0
    for home in homes:
        h.wait_step(home, "worldmodel", 0, 1)
    ids = [h.record(home, "worldmodel")["run_id"] for home in homes]
    assert all(ids) and ids[0] != ids[1]
    from orchestrator.backends.local.engine import tagged_pids
    a_pids, b_pids = (tagged_pids("worldmodel-a0/", run_id=run_id) for run_id in ids)
    assert a_pids and b_pids and not set(a_pids) & set(b_pids)
    cancel = wmctl(homes[0], "cancel", "worldmodel")
    assert cancel.returncode == 0, cancel.stderr
    assert not tagged_pids("worldmodel-a0/", run_id=ids[0]), "home A's own processes survived its cancel"
    assert h.record(homes[0], "worldmodel")["status"] == "cancelled"
    alive = [pid for pid in b_pids if os.path.exists(f"/proc/{pid}")]
    assert alive, "cancelling the run in home A killed the run in home B"
    h.wait_step(homes[1], "worldmodel", 0, h.progress(homes[1], "worldmodel", 0)[-1].get("step", 0) + 1)
    status = json.loads(wmctl(homes[1], "status", "worldmodel", "-o", "json").stdout)
    assert status["status"] == "running"
    assert wmctl(homes[1], "cancel", "worldmodel").returncode == 0
    h.wait_until(lambda: not h.leftover_processes("worldmodel"), 60, "home B's processes to go")


def test_a_missing_context_is_refused_before_anything_is_recorded(home):
    import yaml
    run = "no-context"
    spec = h.write_spec(home, run, nodes=1)
    data = yaml.safe_load(spec.read_text())
    data["image"]["context"] = str(home / "missing-dir")
    spec.write_text(yaml.safe_dump(data))
    sub = wmctl(home, "submit", str(spec), "--auto-resume")
    assert sub.returncode == 2 and "Traceback" not in sub.stderr
    assert "image.context" in sub.stderr and "missing-dir" in sub.stderr
    assert not h.run_folder(home, run).exists()


def test_a_start_that_fails_ends_the_run_failed_with_its_reason(home):
    """The context passed the dry run's check, then vanished before the nodes started (the
    watcher is held at submitting while the test removes it): the start fails, and the run ends
    failed with why, instead of staying `running` with a watch that waits forever."""
    import shutil

    import yaml
    run = "no-start"
    context = home / "missing-dir"
    shutil.copytree(h.JOBS, context)
    spec = h.write_spec(home, run, nodes=1)
    data = yaml.safe_load(spec.read_text())
    data["image"]["context"] = str(context)
    spec.write_text(yaml.safe_dump(data))
    os.environ["WMCTL_TEST_PAUSE_AT"] = "submitting"
    try:
        w = h.Watch(spec, home)
    finally:
        del os.environ["WMCTL_TEST_PAUSE_AT"]
    marker = pause_marker(home, run, "submitting")
    h.wait_until(marker.exists, 120, "the watcher to reach submitting")
    shutil.rmtree(context)
    marker.unlink()
    code = w.wait(timeout=120)
    assert code != 0 and "Traceback" not in w.output and "missing-dir" in w.output, w.output
    rec = h.record(home, run)
    assert rec["status"] == "failed" and rec["attempts"][0]["outcome"] == "not_submitted"
    assert "missing-dir" in rec["attempts"][0]["evidence"]
    watch = wmctl(home, "watch", run, timeout=30)
    assert watch.returncode == 7, watch.stdout + watch.stderr
    # Fixed: nothing of the refused run ever ran, so its record does not hold the name (it did,
    # and the corrected spec was refused as a name clash: issue 22 item 4).
    shutil.copytree(h.JOBS, context)
    again = wmctl(home, "submit", str(spec))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "earlier submission never started" in again.stdout + again.stderr, again.stdout + again.stderr
    rec = h.record(home, run)
    assert rec["attempts"][0]["outcome"] != "not_submitted", rec
    cancel = wmctl(home, "cancel", run)
    assert cancel.returncode == 0 and not h.leftover_processes(run), cancel.stdout + cancel.stderr


@pytest.mark.parametrize("edit", ["renamed", "deleted"])
def test_watch_runs_the_spec_as_submitted_whatever_became_of_the_file(home, edit):
    import yaml
    run = f"spec-{edit}"
    spec = h.write_spec(home, run, nodes=1, steps=8)
    assert wmctl(home, "submit", str(spec), "--detach").returncode == 0
    if edit == "renamed":
        data = yaml.safe_load(spec.read_text())
        data["name"] = "someone-else"
        spec.write_text(yaml.safe_dump(data))
    else:
        spec.unlink()
    watch = wmctl(home, "watch", run, "--auto-resume")
    assert watch.returncode == 0, watch.stdout + watch.stderr
    assert f"run {run} succeeded" in watch.stdout
    if edit == "renamed":
        assert "changed since submission; running the spec as submitted" in watch.stdout
    assert submitted_attempts(home, run) == [0]


def _tiny_spec(home, run, ckpt_dir, steps=20):
    import yaml
    # one node a run: what is shared here is the folder, not a node (two ranks commit one
    # checkpoint in the corruption matrix); a node less is two torch imports less a run
    spec = h.write_spec(home, run, nodes=1, steps=steps, every=5, job="tiny.py")
    data = yaml.safe_load(spec.read_text())
    data["checkpoint"]["dir"] = str(ckpt_dir)
    spec.write_text(yaml.safe_dump(data))
    return spec


@pytest.mark.timeout(600)       # four runs, two at once, on 2 cores
def test_runs_sharing_a_checkpoint_folder_keep_to_their_own_unless_one_resumes_another_on_purpose(home):
    """Two runs at once on one checkpoint folder each keep to their own subfolder; a third run
    there starts fresh, never taking another run's checkpoints; a fourth resumes from one of them
    on purpose (--resume-from), leaving its files as they were; --resume-from of a run that does
    not exist is refused before anything is recorded."""
    shared = home / "shared-ckpt"
    watchers = [h.Watch(_tiny_spec(home, run, shared, steps=10), home) for run in ("sweep-a", "sweep-b")]
    for w in watchers:
        assert w.wait(timeout=240) == 0, w.output
    for run in ("sweep-a", "sweep-b"):
        final = json.loads((shared / run / "final.json").read_text())
        assert final["run"] == run and final["steps"] == 10
        marker = json.loads((shared / run / "step-00000010" / "COMMITTED").read_text())
        assert marker.get("run") == run or marker.get("identity", {}).get("run") == run, marker
        assert not any(p["event"] == "resume" for p in h.progress(home, run, 0))
    # a third run on the same folder starts fresh: it never takes another run's checkpoints
    w = h.Watch(_tiny_spec(home, "sweep-c", shared, steps=5), home)
    assert w.wait(timeout=240) == 0, w.output
    assert not any(p["event"] == "resume" for p in h.progress(home, "sweep-c", 0))
    # ... unless asked to
    before = sorted(p.name for p in (shared / "sweep-a").iterdir())
    ft = wmctl(home, "submit", str(_tiny_spec(home, "finetune", shared, steps=20)), "--resume-from", "sweep-a",
               "--auto-resume", timeout=240)
    assert ft.returncode == 0, ft.stdout + ft.stderr
    resumed = [p for p in h.progress(home, "finetune", 0) if p["event"] == "resume"]
    assert resumed and resumed[0]["step"] == 10, resumed
    assert json.loads((shared / "finetune" / "final.json").read_text())["steps"] == 20
    assert sorted(p.name for p in (shared / "sweep-a").iterdir()) == before, "the source run's checkpoints changed"
    bad = wmctl(home, "submit", str(_tiny_spec(home, "orphan", shared)), "--resume-from", "nosuchrun")
    assert bad.returncode == 2 and "--resume-from" in bad.stderr and "Traceback" not in bad.stderr
    assert not h.run_folder(home, "orphan").exists()


def test_ctrl_c_stops_the_watcher_not_the_run_and_says_how_to_reattach(home):
    import signal
    run = "ctrl-c"
    # 300 steps (30 s): the run must outlast the watcher's exit on a loaded machine
    spec = h.write_spec(home, run, nodes=1, steps=300, every=5, sleep=0.1)
    w = h.Watch(spec, home)
    h.wait_step(home, run, 0, 3)
    os.kill(w.proc.pid, signal.SIGINT)
    assert w.wait(timeout=60) == 130, w.output
    assert f"wmctl watch {run} --auto-resume" in w.output and f"wmctl cancel {run}" in w.output
    assert "Traceback" not in w.output
    assert h.node_pids(run, 0, 0), "Ctrl-C on the watcher stopped the run"
    again = wmctl(home, "watch", run, "--auto-resume", timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert h.record(home, run)["status"] == "succeeded" and submitted_attempts(home, run) == [0]


def test_a_watcher_killed_before_submitting_leaves_an_attempt_a_later_watcher_starts(home):
    """Issue 22 item 10.1: a watcher killed between recording attempt 0 and submitting it. `status`
    called that attempt node_lost ("removed outside wmctl?") and a later watcher spent a retry on
    it. It was recorded but never started: `status` says so, and a watcher submits it as itself."""
    run = "never-started"
    w, marker = held_watch(home, run, "submitting", nodes=1, steps=10)
    w.kill()
    assert attempt_folders(home, run) == []
    status = wmctl(home, "status", run)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "recorded but never started" in status.stdout, status.stdout
    assert "node_lost" not in status.stdout and "removed outside" not in status.stdout
    assert f"wmctl watch {run}" in status.stdout
    again = h.Watch(h.write_spec(home, run, nodes=1, steps=10), home, run, "--auto-resume", command="watch")
    assert again.wait(timeout=240) == 0, again.output
    assert "attempt 0 was recorded but never started" in again.output
    rec = h.record(home, run)
    assert rec["status"] == "succeeded", again.output
    assert submitted_attempts(home, run) == [0], "a retry was spent on an attempt that never ran"
    assert attempt_folders(home, run) == ["attempt-0"]


def test_ctrl_c_during_the_backoff_says_nothing_runs_and_what_watch_would_do(home):
    """Issue 22 item 10.3: Ctrl-C while the watcher waited out its backoff said "the run goes on"
    while nothing ran: the failed attempt was torn down and the next one not yet submitted."""
    import signal

    run = "ctrl-c-backoff"
    spec = h.write_spec(home, run, nodes=1, steps=400, restart={"backoff": "300s"})
    w = h.Watch(spec, home)
    h.wait_checkpoint(home, run, 0, 5)
    assert h.kill_node(run, 0, 0) > 0
    h.wait_until(lambda: "backing off 300 s" in w.output, 60, "the backoff")
    os.kill(w.proc.pid, signal.SIGINT)
    assert w.wait(timeout=60) == 130, w.output
    assert "the run goes on" not in w.output, w.output
    assert "nothing of it runs now: attempt 0 ended (node_lost) and attempt 1 was not submitted" in w.output
    assert f"wmctl watch {run} --auto-resume" in w.output and "submits the next attempt" in w.output
    assert attempt_folders(home, run) == ["attempt-0"]
    assert wmctl(home, "cancel", run).returncode == 0
    h.wait_until(lambda: not h.leftover_processes(run), 60, "no processes left")
