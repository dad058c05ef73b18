"""Fixtures for tests that need a real Slurm cluster (.ci/start-slurm.sh starts one on this host:
one slurmctld, three ``slurmd -N n1|n2|n3``, partition ``debug``).

- ``slurm_cluster``: a :class:`SlurmCluster` for the cluster that ``SLURM_CONF`` names (default
  /etc/wmctl-slurm/slurm.conf, where .ci/start-slurm.sh writes it). On CI (CI=true) or with
  WMCTL_REQUIRE_SLURM=1 a missing or unhealthy cluster FAILS the test; elsewhere it skips, saying
  how to start one. It kills nothing it did not find, and on teardown it cancels the jobs the
  test submitted through it and revives every node the test killed, then waits until the three
  nodes are idle again: the next test finds the cluster as the first one did.

Every test in this folder is marked ``slurm``; each module carries ``xdist_group("slurm")`` (one
cluster, one worker: a node killed by one test must not fail another's job).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from tests.ci_no_skip import on_ci

DEFAULT_CONF = Path("/etc/wmctl-slurm/slurm.conf")
REQUIRE_SLURM = on_ci() or os.environ.get("WMCTL_REQUIRE_SLURM") == "1"
START_HINT = "start one with `bash .ci/start-slurm.sh` (needs root: it apt-installs Debian's slurm packages)"
# The cluster's own node states that mean "up and taking jobs" (sinfo %T, no '*' = responding).
UP_STATES = {"idle", "mixed", "allocated", "completing"}


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


def unavailable(reason: str) -> NoReturn:
    """Fail on CI or with WMCTL_REQUIRE_SLURM=1 (a cluster was promised), skip otherwise."""
    if REQUIRE_SLURM:
        log = os.environ.get("WMCTL_SLURM_START_LOG")
        where = f" (start-slurm.sh's log: {log})" if log else ""
        pytest.fail(f"CI=true or WMCTL_REQUIRE_SLURM=1, but {reason}{where}", pytrace=False)
    pytest.skip(f"{reason}; {START_HINT}")


def parse_fields(line: str) -> dict[str, str]:
    """``scontrol show job -o`` / ``show node -o``: one line of ``Key=value`` pairs; a value runs to
    the next `` Key=`` (keys are like ``JobState``, ``AllocNode:Sid``, ``CPUs/Task``)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)",
                                                        line.strip())}


def conf_values(conf: Path) -> dict[str, str]:
    """slurm.conf's top-level ``Key=value`` lines (NodeName/PartitionName lines left out)."""
    values: dict[str, str] = {}
    for raw in conf.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line or line.startswith(("NodeName=", "PartitionName=")):
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip()
    return values


def _proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def proc_argv(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits for its parent to reap it)."""
    return _proc_status(pid).get("State", "Z").strip()[:1] not in ("Z", "X", "")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _fds_into(pid: int, path: Path) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


@dataclass
class SlurmCluster:
    conf: Path
    settings: dict[str, str]
    nodes: list[str]
    submitted: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)

    # --- the client tools --------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def sbatch(self, *argv: str, cwd: Path | None = None) -> str:
        """``sbatch --parsable ARGV``; the job id. The fixture cancels it on teardown if still there."""
        out = subprocess.run(["sbatch", "--parsable", *argv], env=self.env, cwd=cwd, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, f"sbatch {argv} failed ({out.returncode}): {out.stderr}"
        jobid = out.stdout.strip().split(";")[0]
        self.submitted.append(jobid)
        return jobid

    def job(self, jobid: str) -> dict[str, str]:
        """``scontrol show job -o JOBID`` as fields ({} once the job is gone: MinJobAge after its end)."""
        out = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        return parse_fields(out.stdout) if out.returncode == 0 and out.stdout.strip() else {}

    def squeue(self, jobid: str) -> str:
        """``squeue -h -t all -o '%i|%T|%r|%N' -j JOBID`` (``-t all``: finished jobs too)."""
        return self.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%r|%N", "-j", jobid).stdout.strip()

    def node_states(self) -> dict[str, tuple[str, str]]:
        """``sinfo -h -N -o '%N %T %E'``: node -> (state as sinfo prints it, reason)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T %E")
        states = {}
        for line in out.stdout.splitlines():
            name, state, reason = (line.split(" ", 2) + ["", ""])[:3]
            states[name] = (state, reason)
        return states

    def wait_job_state(self, jobid: str, states: Iterable[str], timeout: float = 120) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job's JobState is one of ``states``; its fields then.
        Fails naming the states it went through and the last line."""
        want, seen = set(states), list[str]()
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(jobid)
            state = fields.get("JobState", "<gone>")
            if not seen or seen[-1] != state:
                seen.append(state)
            if state in want:
                return fields
            if time.monotonic() > deadline:
                pytest.fail(f"job {jobid} not in {sorted(want)} within {timeout:.0f}s; went through "
                            f"{' -> '.join(seen)}; last: {fields}", pytrace=False)
            time.sleep(0.2)

    def wait_node(self, node: str, ok: Iterable[str], timeout: float = 60) -> tuple[str, str]:
        """Poll sinfo until ``node``'s state is one of ``ok``; (state, reason) then."""
        want = set(ok)
        deadline = time.monotonic() + timeout
        while True:
            state = self.node_states().get(node, ("<missing>", ""))
            if state[0] in want:
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"node {node} not in {sorted(want)} within {timeout:.0f}s: {state}", pytrace=False)
            time.sleep(0.2)

    # --- a node's death and return -----------------------------------------------------------
    def _node_path(self, key: str, node: str) -> Path:
        return Path(self.settings[key].replace("%n", node))

    def slurmd_pids(self, node: str) -> list[int]:
        """The running ``slurmd ... -N node`` of this cluster (its pid file, checked against its argv)."""
        pids = []
        for pid in _pids():
            argv = proc_argv(pid)
            if argv and Path(argv[0]).name == "slurmd" and _flag(argv, "-N") == node \
                    and _flag(argv, "-f") in (str(self.conf), None) and alive(pid):
                pids.append(pid)
        return pids

    def node_processes(self, node: str) -> set[int]:
        """What dies with ``node``: its slurmd; every task process (its environment says
        SLURMD_NODENAME=node for this cluster's SLURM_CONF); their ``slurmstepd`` parents; and any
        slurmstepd holding that node's slurmd log (a step daemon forked by that slurmd, the
        batch step's included, keeps its log open)."""
        log = self._node_path("SlurmdLogFile", node) if "SlurmdLogFile" in self.settings else None
        found = set(self.slurmd_pids(node))
        for pid in _pids():
            if not alive(pid):
                continue
            argv = proc_argv(pid)
            if argv and argv[0].startswith("slurmstepd"):
                if log is not None and _fds_into(pid, log):
                    found.add(pid)
                continue
            env = _proc_environ(pid)
            if env.get("SLURMD_NODENAME") == node and env.get("SLURM_CONF", str(self.conf)) == str(self.conf):
                found.add(pid)
                parent = int(_proc_status(pid).get("PPid", "0") or 0)
                if parent > 1 and proc_argv(parent)[:1] and proc_argv(parent)[0].startswith("slurmstepd"):
                    found.add(parent)
        return found

    def node_kill(self, node: str) -> set[int]:
        """The node dies at once: every process of :meth:`node_processes` is stopped (SIGSTOP, so
        none reports the others' end or starts another), the search repeated until it finds
        nothing new, then all are SIGKILLed. The pids killed. The fixture revives the node on
        teardown if the test did not."""
        assert node in self.nodes, f"{node} is not a node of {self.conf} ({self.nodes})"
        assert self.slurmd_pids(node), f"{node}'s slurmd is not running"
        self.killed.append(node)
        frozen: set[int] = set()
        while True:
            new = self.node_processes(node) - frozen
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            frozen |= new
        for pid in frozen:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in frozen):
            assert time.monotonic() < deadline, f"still alive after SIGKILL: {[p for p in frozen if alive(p)]}"
            time.sleep(0.05)
        return frozen

    def node_revive(self, node: str, timeout: float = 60) -> tuple[str, str]:
        """Start the node's slurmd again (unless it runs) and wait until Slurm has it back: idle, or
        running what it was given (ReturnToService=2 returns a DOWN node when it registers)."""
        if not self.slurmd_pids(node):
            self.run("slurmd", "-f", str(self.conf), "-N", node)
        state = self.wait_node(node, UP_STATES, timeout)
        if node in self.killed:
            self.killed.remove(node)
        return state

    def cleanup(self) -> None:
        for node in list(self.killed):
            self.node_revive(node)
        if self.submitted:
            self.run("scancel", *self.submitted, check=False)
        for jobid in self.submitted:
            fields = self.job(jobid)
            if fields and fields.get("JobState") in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                self.wait_job_state(jobid, {"CANCELLED", "COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT"}, 90)
        self.submitted.clear()
        # A revived node keeps the dead job COMPLETING until slurmctld resends its TERMINATE_JOB:
        # about 90 s here (CI saw 89.4 s and 90.2 s for the frozen-node test), so 90 s was a coin toss.
        for node in self.nodes:
            self.wait_node(node, {"idle"}, 180)


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name) and len(arg) > len(name):
            return arg[len(name):]
    return None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _find_cluster() -> SlurmCluster:
    for tool in ("sbatch", "sinfo", "scontrol", "slurmd"):
        if shutil.which(tool) is None:
            unavailable(f"Slurm's {tool} is not installed")
    conf = Path(os.environ.get("SLURM_CONF") or DEFAULT_CONF)
    if not conf.is_file():
        unavailable(f"no slurm.conf at {conf} (SLURM_CONF or {DEFAULT_CONF})")
    cluster = SlurmCluster(conf=conf, settings=conf_values(conf), nodes=[])
    try:
        states = cluster.node_states()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else "timed out"
        unavailable(f"sinfo does not answer for {conf}: {detail}")
    cluster.nodes = sorted(states)
    if len(cluster.nodes) < 3:
        unavailable(f"the tests want three nodes; {conf} has {cluster.nodes}")
    return cluster


@pytest.fixture
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = _find_cluster()
    # A node an earlier test (or run) left down is revived first: every test starts on three nodes.
    for node in cluster.nodes:
        if not cluster.slurmd_pids(node):
            cluster.node_revive(node)
    for node in cluster.nodes:
        state = cluster.wait_node(node, {"idle"}, 90)
        assert state[0] == "idle", state
    yield cluster
    cluster.cleanup()
