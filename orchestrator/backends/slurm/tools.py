"""Slurm's client tools, run as argument lists (never a shell), and what they print, parsed.

Formats chosen to hold from Slurm 22.05 (Debian 12) to the current release:

- ``scontrol show job -o JOBID`` (man scontrol, ``-o, --oneliner``): one line of ``Key=value``
  pairs. Keys used: JobState, Reason, ExitCode (``exit:signal`` of the batch script), NodeList,
  BatchHost. After MinJobAge (300 s by default) the job is gone: "Invalid job id specified", exit 1.
- ``sacct -n -X -P -j JOBID -o State,ExitCode,NodeList`` (man sacct, ``--parsable2``: fields
  split by '|', no trailing one): what slurmdbd kept of a job scontrol has forgotten. Without
  slurmdbd it prints "accounting storage is disabled", exit 1, and is not asked again.
- ``sinfo -h -N -n NODES -o '%N|%T|%E'`` (man sinfo, ``-o``): node, long state (a trailing ``*``:
  not responding), reason. ``scontrol show hostnames LIST`` expands a hostlist, in node order
  (SLURM_NODEID follows it).

The JSON outputs exist too, but their schema changed after 22.05 (OpenAPI v0.0.38 -> data_parser
v0.0.40+): the columns above did not.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from ...errors import EngineUnavailable

TOOL_TIMEOUT_S = 20.0
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)")
# What the client tools print when the controller does not answer (src/api: slurm_strerror of
# SLURM_COMMUNICATIONS_CONNECTION_ERROR and friends).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|"
                          r"Zero Bytes were transmitted|Communication connection failure", re.I)
_GONE = re.compile(r"Invalid job id specified", re.I)


@dataclass(frozen=True)
class JobInfo:
    """A job as Slurm tells it now."""

    job_id: str
    state: str                 # PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, TIMEOUT, ... (base state)
    reason: str                # the pending reason, or why it ended (None: none)
    exit_code: int | None      # the batch script's exit status (ExitCode's first half)
    exit_signal: int | None    # ExitCode's second half: the signal that ended it
    nodes: str                 # NodeList, a hostlist expression ("" while pending)
    flags: tuple[str, ...] = ()   # what followed '+' in the state (e.g. CANCELLED+... on newer releases)
    source: str = "scontrol"


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str                 # sinfo's long state, e.g. "down*", "mixed", "idle*"
    reason: str

    @property
    def responding(self) -> bool:
        return not self.state.endswith("*")

    @property
    def down(self) -> bool:
        base = self.state.rstrip("*~#!%$@^-").lower()
        return base in ("down", "fail", "failing", "drained", "draining", "drain", "unknown", "not_responding") \
            or not self.responding


class SlurmTools:
    """The client tools, as one user runs them (SLURM_CONF from the environment)."""

    def __init__(self, timeout: float = TOOL_TIMEOUT_S):
        self.timeout = timeout
        self.sacct_works: bool | None = None     # None: not asked yet

    def run(self, argv: list[str], *, check_contact: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                                 stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EngineUnavailable(f"Slurm's {argv[0]} is not installed on this host",
                                    hint="run wmctl on a Slurm login node (slurm-client installed)") from None
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"{argv[0]} did not answer in {self.timeout:.0f} s",
                                    hint="is slurmctld up? `scontrol ping` says") from None
        if check_contact and out.returncode != 0 and _UNREACHABLE.search(out.stderr):
            raise EngineUnavailable(f"{argv[0]}: {out.stderr.strip().splitlines()[-1]}",
                                    hint="is slurmctld up? `scontrol ping` says; SLURM_CONF names the cluster")
        return out

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """A tool started and not waited for (``scancel`` of a step that waits MessageTimeout for a
        dead node's slurmd): the caller waits as long as it cares to."""
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EngineUnavailable(f"Slurm's {argv[0]} is not installed on this host",
                                    hint="run wmctl on a Slurm login node (slurm-client installed)") from None

    def node_names(self, partition: str | None) -> frozenset[str] | None:
        """Every node of ``partition`` (else of every partition), down, drained or failing ones
        too; None when sinfo does not answer."""
        argv = ["sinfo", "-h", "-N", "-o", "%N|%T"] + (["-p", partition] if partition else [])
        try:
            out = self.run(argv)
        except EngineUnavailable:
            return None
        if out.returncode != 0:
            return None
        return parse_partition_nodes(out.stdout)

    def cluster_name(self) -> str | None:
        """What keys this cluster's remembered exclusions: ``slurm:<ClusterName>`` (`scontrol show
        config`), else ``slurm:<the SLURM_CONF path>``, else None."""
        try:
            out = self.run(["scontrol", "show", "config"])
        except EngineUnavailable:
            out = None
        name = parse_cluster_name(out.stdout) if out is not None and out.returncode == 0 else None
        if name:
            return f"slurm:{name}"
        conf = os.environ.get("SLURM_CONF")
        return f"slurm:{os.path.abspath(conf)}" if conf else None

    def job(self, job_id: str) -> JobInfo | None:
        """The job as scontrol has it, else as sacct kept it; None once both have forgotten it."""
        out = self.run(["scontrol", "show", "job", "-o", job_id])
        if out.returncode == 0 and out.stdout.strip():
            return parse_scontrol_job(job_id, out.stdout)
        if out.returncode != 0 and not _GONE.search(out.stderr):
            raise EngineUnavailable(f"scontrol show job {job_id}: {out.stderr.strip()[:200]}")
        return self.sacct_job(job_id)

    def sacct_job(self, job_id: str) -> JobInfo | None:
        if self.sacct_works is False:
            return None
        out = self.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList"])
        if out.returncode != 0:
            self.sacct_works = False     # no slurmdbd here ("accounting storage is disabled")
            return None
        self.sacct_works = True
        return parse_sacct(job_id, out.stdout)

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist in ("(null)", "None"):
            return []
        out = self.run(["scontrol", "show", "hostnames", nodelist])
        return out.stdout.split() if out.returncode == 0 else []

    def node_states(self, names: list[str]) -> dict[str, NodeState]:
        if not names:
            return {}
        out = self.run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"])
        return parse_sinfo(out.stdout) if out.returncode == 0 else {}

    def partition_nodes(self, partition: str | None) -> int | None:
        """How many nodes the partition (the default one when None) holds, for the fix of a
        request too big for it."""
        argv = ["sinfo", "-h", "-o", "%P|%D"]
        out = self.run(argv + (["-p", partition] if partition else []))
        if out.returncode != 0:
            return None
        total = 0
        for line in out.stdout.splitlines():
            name, _, count = line.partition("|")
            if partition or name.endswith("*"):
                total += int(count) if count.strip().isdigit() else 0
        return total or None


def parse_fields(line: str) -> dict[str, str]:
    """One ``-o`` line of ``Key=value`` pairs; a value runs to the next `` Key=``."""
    return {m.group(1): m.group(2) for m in _FIELD.finditer(line.strip())}


def parse_scontrol_job(job_id: str, text: str) -> JobInfo:
    f = parse_fields(text.strip().splitlines()[0])
    state, *flags = (f.get("JobState") or "UNKNOWN").split("+")
    code, sig = _exit_pair(f.get("ExitCode", ""))
    nodes = f.get("NodeList", "")
    return JobInfo(job_id, state, f.get("Reason", "None"), code, sig, "" if nodes == "(null)" else nodes,
                   tuple(flags))


def parse_sacct(job_id: str, text: str) -> JobInfo | None:
    """``State|ExitCode|NodeList`` of the job's own line (-X). sacct writes ``CANCELLED by UID``."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3:
            continue
        state_text, code_text, nodes = parts[0], parts[1], parts[2]
        state = state_text.split()[0] if state_text.strip() else "UNKNOWN"
        who = state_text.split(" by ", 1)[1].strip() if " by " in state_text else ""
        code, sig = _exit_pair(code_text)
        return JobInfo(job_id, state.rstrip("+"), f"by uid {who}" if who else "None", code, sig,
                       "" if nodes in ("None assigned", "(null)") else nodes, source="sacct")
    return None


def parse_sinfo(text: str) -> dict[str, NodeState]:
    states = {}
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            states[parts[0]] = NodeState(parts[0], parts[1], parts[2].strip())
    return states


def parse_sbatch(stdout: str) -> str | None:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER`` (man sbatch)."""
    first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = first.split(";")[0].strip()
    return job_id if job_id.isdigit() else None


def _exit_pair(text: str) -> tuple[int | None, int | None]:
    code, _, sig = text.partition(":")
    return (int(code) if code.strip().isdigit() else None, int(sig) if sig.strip().isdigit() else None)


def parse_cluster_name(text: str) -> str | None:
    """``ClusterName = x`` of `scontrol show config`'s output, or None."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ClusterName" and value.strip() and value.strip() != "(null)":
            return value.strip()
    return None


def parse_partition_nodes(text: str) -> frozenset[str]:
    """`sinfo -h -N -o '%N|%T'` -> every node listed, whatever its state (a node listed once per
    partition is one node)."""
    out = set()
    for line in text.splitlines():
        name, sep, _state = line.strip().partition("|")
        if sep and name:
            out.add(name)
    return frozenset(out)
