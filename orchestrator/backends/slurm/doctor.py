"""``wmctl doctor --slurm``: a Slurm preflight a user runs on the submit host before the first submit.

Each check runs one of Slurm's client tools as this user (an argument list, never a shell) and
says what a "no" means:
- ``sinfo`` answers (the controller is up and SLURM_CONF names it);
- the partition (the spec's, else the default one) exists and is up;
- the GRES the spec asks for exists on the partition's idle nodes (``sinfo -N -t idle -o '%N|%G'``);
- munge works here (``munge -n`` piped to ``unmunge``: the credential every Slurm RPC carries);
- the run folder and the checkpoint dir are one filesystem for every node: an srun step writes a
  probe file from each node, read back here.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from ...errors import EngineUnavailable
from ...runtime.preflight import Finding
from ...spec import JobSpec
from ...vendors import VendorProfile
from ..local.render import local_checkpoint_dir
from .check import GRES_NONE
from .tools import SlurmTools

PROBE_TIMEOUT_S = 60
# The probe each node runs: fixed text; the folder and the token are its arguments.
PROBE = 'printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}" >"$1/.wmctl-probe-$2-${SLURM_NODEID:-x}"'


def check_cluster(spec: JobSpec | None, profile: VendorProfile | None, tools: SlurmTools | None = None,
                  home: Path | None = None) -> list[Finding]:
    tools = tools or SlurmTools()
    try:
        out = tools.run(["sinfo", "-h", "-o", "%P|%a|%D|%t"])
    except EngineUnavailable as exc:
        return [Finding("error", "sinfo", exc.message, exc.hint or "")]
    if out.returncode != 0:
        return [Finding("error", "sinfo", f"sinfo failed: {out.stderr.strip()[:300]}",
                        "is slurmctld up? `scontrol ping`; SLURM_CONF names the cluster")]
    parts: dict[str, tuple[str, int]] = {}
    default = None
    for line in out.stdout.splitlines():
        name, avail, count, _ = (line.split("|") + ["", "", "", ""])[:4]
        if name.endswith("*"):
            name = default = name[:-1]
        n = int(count) if count.isdigit() else 0
        parts[name] = (avail, parts.get(name, (avail, 0))[1] + n)
    findings = [Finding("ok", "sinfo", f"the controller answers: partitions {', '.join(sorted(parts))}")]
    wanted = (spec.slurm.partition.split(",")[0] if spec is not None and spec.slurm.partition else default)
    findings.append(_partition(wanted, parts, spec))
    if spec is not None and profile is not None:
        findings += _gres(tools, spec, profile, wanted)
    findings.append(_munge())
    findings += _shared_fs(tools, spec, wanted, home)
    return findings


def _partition(wanted: str | None, parts: dict[str, tuple[str, int]], spec: JobSpec | None) -> Finding:
    if wanted is None:
        return Finding("error", "partition", "no default partition and the spec names none",
                       "set slurm.partition")
    if wanted not in parts:
        return Finding("error", "partition", f"partition {wanted} does not exist ({', '.join(sorted(parts))} do)",
                       "set slurm.partition to one of them")
    avail, count = parts[wanted]
    if avail != "up":
        return Finding("error", "partition", f"partition {wanted} is {avail}", "ask the admins, or use another")
    if spec is not None and spec.nodes > count:
        return Finding("error", "partition", f"partition {wanted} holds {count} nodes; the spec asks for {spec.nodes}",
                       "lower nodes or choose a bigger partition")
    return Finding("ok", "partition", f"partition {wanted} is up with {count} nodes")


def _gres(tools: SlurmTools, spec: JobSpec, profile: VendorProfile, partition: str | None) -> list[Finding]:
    from ...launch import accelerators_per_node

    name = spec.slurm.gres or profile.slurm.gres
    if not accelerators_per_node(spec, profile) or spec.slurm.gres == GRES_NONE or not name:
        return []
    argv = ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N|%G"] + (["-p", partition] if partition else [])
    out = tools.run(argv)
    rows = [line.split("|", 1) for line in out.stdout.splitlines() if "|" in line]
    having = [node for node, gres in rows if any(g.split("(")[0].startswith(name) for g in gres.split(","))]
    if not rows:
        return [Finding("warn", "gres", f"no idle node in {partition or 'the default partition'} to check "
                        f"GRES {name} on", "run again when nodes are idle")]
    if not having:
        return [Finding("error", "gres", f"no idle node has GRES {name} ({', '.join(sorted({g for _, g in rows}))})",
                        "set slurm.gres to the name the nodes have (`scontrol show node` lists Gres=), or none")]
    return [Finding("ok", "gres", f"GRES {name} on idle nodes {', '.join(having)}")]


def _munge() -> Finding:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        back = subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10)
    except FileNotFoundError:
        return Finding("warn", "munge", "munge is not installed here",
                       "a site with another auth plugin may not need it")
    except subprocess.TimeoutExpired:
        return Finding("error", "munge", "munge did not answer", "is munged running? (`systemctl status munge`)")
    if cred.returncode != 0 or back.returncode != 0:
        said = (cred.stderr or back.stderr).decode(errors="replace").strip()[:200]
        return Finding("error", "munge", f"munge -n | unmunge failed: {said}",
                       "start munged; /etc/munge/munge.key must match the cluster's")
    return Finding("ok", "munge", "munge -n | unmunge works")


def _shared_fs(tools: SlurmTools, spec: JobSpec | None, partition: str | None, home: Path | None) -> list[Finding]:
    from ... import layout

    folders = {"run folder": (home or layout.wmctl_home()) / layout.RUNS}
    if spec is not None and spec.slurm.container == "none":
        folders["checkpoint dir"] = local_checkpoint_dir(spec)
    nodes = spec.nodes if spec is not None else 2
    out: list[Finding] = []
    for what, folder in folders.items():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            out.append(Finding("error", "shared filesystem", f"{what} {folder} cannot be made here: {exc.strerror}"))
            continue
        token = secrets.token_hex(4)
        argv = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--time=1", f"--job-name=wmctl-doctor-{token}",
                *([f"--partition={partition}"] if partition else []), "bash", "-c", PROBE, "wmctl-probe",
                str(folder), token]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            tools.run(["scancel", f"--name=wmctl-doctor-{token}"])
            out.append(Finding("warn", "shared filesystem", f"the srun probe of {what} did not start within "
                               f"{PROBE_TIMEOUT_S} s (the partition is busy)", "run doctor again when nodes are free"))
            continue
        except FileNotFoundError:
            out.append(Finding("error", "shared filesystem", "srun is not installed here"))
            continue
        probes = sorted(folder.glob(f".wmctl-probe-{token}-*"))
        seen = [p.read_text().strip() for p in probes]
        for p in probes:
            os.unlink(p)
        if run.returncode != 0:
            out.append(Finding("error", "shared filesystem", f"the srun probe of {what} failed: "
                               f"{run.stderr.strip()[:200]}"))
        elif len(seen) < nodes:
            out.append(Finding("error", "shared filesystem", f"{what} {folder}: {len(seen)} of {nodes} nodes' probe "
                               "files are seen here", "put it on a filesystem every node and this host mount "
                               "(WMCTL_HOME, checkpoint.dir)"))
        else:
            out.append(Finding("ok", "shared filesystem", f"{what} {folder}: written by {', '.join(seen)}, "
                               "read here"))
    return out
