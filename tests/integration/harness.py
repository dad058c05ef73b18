"""Drive real `wmctl submit --auto-resume` runs on the local backend and inject faults.

Faults are real signals to real processes: every process of a local node carries
WMCTL_LOCAL_TAG, so "kill node 1" SIGKILLs its keeper, torchrun agent and workers at once,
the way a machine dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from orchestrator.backends.local.engine import tagged_pids
from orchestrator.runtime.protocol import parse_progress, run_checkpoint_dir

JOBS = Path(__file__).parent / "jobs"
REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp: Path, name: str, *, nodes: int = 2, steps: int = 40, every: int = 5, sleep: float = 0.1,
               job_args: list[str] | None = None, restart: dict | None = None, job: str = "counter.py",
               command: list[str] | None = None) -> Path:
    spec = {
        "name": name, "nodes": nodes, "nproc_per_node": 1, "affinity": "none",
        "image": {"vendor": "cpu", "context": str(JOBS)},
        # ``command``: the program as given (a missing script, a missing interpreter), no job flags
        "command": command or ["python", job, "--steps", str(steps), "--every", str(every), "--sleep", str(sleep),
                               *(job_args or [])],
        "checkpoint": {"dir": str(tmp / f"ckpt-{name}"), "every_steps": every},
        # The heartbeat counts from a node's start, torch's import included: 25 s was a bet that a
        # job starts that fast, lost on a loaded 2-core machine with xdist workers (seen: 18 s to the
        # launcher, then "hang: no progress line for 25 s" twice). No test relies on this default
        # to catch a hang: every hang test sets its own.
        "restart": {"max_attempts": 4, "backoff": "0s", "heartbeat_timeout": "120s", **(restart or {})},
        "rendezvous": {"join_timeout": "60s"},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def dump_stacks(proc: subprocess.Popen) -> str:
    """Where a process that should have ended is stuck: started with PYTHONFAULTHANDLER=1, SIGABRT
    makes it print every thread's stack (to its stderr) before it dies. Returns its stderr when
    the test holds it as a pipe."""
    exited = proc.poll()
    if exited is not None:
        return f"(it had exited with {exited}: something else holds its output open)"
    os.kill(proc.pid, signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return "(no stacks: it did not die on SIGABRT)"
    return err or ""


class Watch:
    """A `wmctl submit --auto-resume` process and the run folder it writes."""

    def __init__(self, spec: Path, home: Path, *extra: str, command: str = "submit"):
        self.home = home
        self.env = {**os.environ, "WMCTL_HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
        home.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=home, prefix="watch-", suffix=".out")   # two Watches never share one
        self.out_path = Path(path)
        self.out = os.fdopen(fd, "w")
        args = [str(spec), "--auto-resume"] if command == "submit" else list(extra[:1])
        rest = extra if command == "submit" else extra[1:]
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", command, *args, *rest],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=self.env, cwd=str(REPO),
                                     start_new_session=True)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{dump_stacks(self.proc)}\n"
                                 f"{self.output}") from None
        finally:
            self.out.close()

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.out.close()

    @property
    def output(self) -> str:
        return self.out_path.read_text()


def run_folder(home: Path, run: str) -> Path:
    return home / "runs" / run


def progress(home: Path, run: str, attempt: int) -> list[dict]:
    """Progress lines of an attempt, from whichever node hosts global rank 0."""
    out = []
    for log in sorted((run_folder(home, run) / f"attempt-{attempt}").glob("node-*.log")):
        out += [p for p in map(parse_progress, log.read_text(errors="replace").splitlines()) if p]
    return out


def counter_state(steps: int = 40, world: int = 2) -> str:
    """What an uninterrupted jobs/counter.py run leaves in final.txt after ``steps`` steps on
    ``world`` ranks: the same float64 operations in the same order (each rank's term, summed by the
    all-reduce, added to the decayed state), computed here. A resumed run must match it bit for bit;
    no reference run is needed to know it."""
    state = 0.0
    for step in range(steps):
        contrib = 0.0
        for rank in range(world):
            contrib += ((step + 1) * 0.1 + rank) / 3.0
        state = state * 0.999 + contrib
    return state.hex()


def wait_until(predicate, timeout: float = 120, what: str = "condition", every: float = 0.1) -> None:
    """Poll ``predicate`` every ``every`` seconds until it holds. A predicate that costs CPU (a
    Docker API call, a `wmctl` process) asks for a slower poll: CI's two cores are shared by
    every test, and a tight loop of them is one core's worth of work taken from the others."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def wait_checkpoint(home: Path, run: str, attempt: int, step: int, timeout: float = 120) -> None:
    wait_until(lambda: any(p["event"] == "checkpoint" and p["step"] >= step for p in progress(home, run, attempt)),
               timeout, f"checkpoint >= {step} in attempt {attempt}")


def wait_step(home: Path, run: str, attempt: int, step: int, timeout: float = 120) -> None:
    wait_until(lambda: any(p["event"] == "step" and p["step"] >= step for p in progress(home, run, attempt)),
               timeout, f"step >= {step} in attempt {attempt}")


def wait_new_checkpoint(home: Path, run: str, attempt: int, timeout: float = 180) -> None:
    """Wait for attempt ``attempt`` to commit a checkpoint past the step it resumed from (its first,
    for an attempt that started fresh): where a chained test puts its next fault."""
    def done() -> bool:
        events = progress(home, run, attempt)
        start = next((e["step"] for e in events if e["event"] == "resume"), 0)
        return any(e["event"] == "checkpoint" and e["step"] > start for e in events)
    wait_until(done, timeout, f"a new checkpoint in attempt {attempt}")


def node_pids(run: str, attempt: int, node: int) -> list[int]:
    return tagged_pids(f"{run}-a{attempt}/{node}", exact=True)


def training_pids(run: str, attempt: int, node: int, job: str = "counter.py") -> list[int]:
    """The job's own processes on a node: not the keeper nor the torchrun agent that launched them."""
    return [pid for pid in node_pids(run, attempt, node)
            if job in cmdline(pid) and "torch.distributed.run" not in cmdline(pid)
            and "orchestrator.backends.local.agent" not in cmdline(pid)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_node(run: str, attempt: int, node: int, sig: int = signal.SIGKILL) -> int:
    pids = node_pids(run, attempt, node)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return len(pids)


def signal_agent(home: Path, run: str, attempt: int, node: int, sig: int) -> None:
    pid_file = run_folder(home, run) / f"attempt-{attempt}" / f"node-{node}.pid.json"
    wait_until(pid_file.exists, 30, "pid file")
    os.kill(json.loads(pid_file.read_text())["agent"], sig)


def record(home: Path, run: str) -> dict:
    return json.loads((run_folder(home, run) / "run.json").read_text())


def final_state(spec: Path) -> str:
    return (run_checkpoints(spec) / "final.txt").read_text()


def run_checkpoints(spec: Path) -> Path:
    """The run's own checkpoint root: its subfolder of checkpoint.dir, as the launcher scopes it."""
    data = yaml.safe_load(spec.read_text())
    return Path(run_checkpoint_dir(data["checkpoint"]["dir"], data["name"]))


def leftover_processes(run: str) -> list[int]:
    return tagged_pids(f"{run}-a")
