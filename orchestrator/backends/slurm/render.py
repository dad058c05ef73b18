"""Spec -> one sbatch script (``templates/slurm/job.sbatch.j2``) and the sbatch command line.

The script asks for the nodes in ``#SBATCH`` lines (values checked in check.py to an alphabet
sbatch's own parser copies as it is), then starts one srun step, one task per node, that runs the
torchrun line every backend builds (launch.torchrun_args) under a node script of its own: the
node's log and exit record go to the attempt folder, on the filesystem the cluster shares.
Everything a user writes reaches the script as one quoted shell word (templating.shell_word).

Pure: the submitting host's facts (its interpreter, $WMCTL_HOME) come in as ``HostFacts``.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

from ... import layout
from ...errors import OptionError, SpecError
from ...launch import STORE_HOST_SH, accelerators_per_node, job_env, torchrun_args
from ...plan import AttemptContext, HostFacts, Plan, Request
from ...runtime.protocol import ENV_NODE_NAME, run_checkpoint_dir
from ...runtime.records import record
from ...spec import JobSpec
from ...names import is_env_name
from ...templating import Verbatim, render_shell_template, shell_word
from ...vendors import VendorProfile
from ..host_paths import host_path_source
from ..local.render import PYTHON_NAMES, local_checkpoint_dir
from .check import GRES, GRES_NONE, format_minutes, limit_seconds, problems, signal_lead_s, time_limit_minutes

TEMPLATE = "slurm/job.sbatch.j2"
SPARES_TEMPLATE = "slurm/job-spares.sbatch.j2"   # restart.spares: one step per slot, each running the keeper
SCRIPT_FILE = "job.sbatch"            # in the attempt folder: what sbatch was given
BATCH_LOG = "batch.log"               # the batch shell's own output (sbatch --output)
JOB_EXIT_FILE = "job.exit.json"       # the script's last word: srun's exit status
# Written by wmctl's teardown (engine.cancel) before it kills the steps: the batch shell then waits
# for the scancel that follows rather than end first, so Slurm records the job CANCELLED.
TEARDOWN_FILE = "teardown.requested"
# sbatch's filename patterns (man sbatch, "filename pattern"): %j, %N, ... and %% for a '%'.
_PERCENT = re.compile("%")
# A node name from Slurm (or `--exclude-node`): what sbatch's --exclude takes, hostlist ranges too.
NODE_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")
_CONTROL = re.compile("[\x00-\x1f\x7f\u0085\u2028\u2029]")


@record(frozen=True)
class SlurmRequest(Request):
    """What the engine submits and then reads: the script, the sbatch line, the files the job writes."""

    job_name: str                     # the sbatch job name: the attempt's name
    script: str                       # the whole sbatch script
    script_path: Path                 # where the engine writes it (in the attempt folder)
    sbatch_argv: list[str]            # the sbatch command line, --parsable: it prints JOBID[;CLUSTER]
    attempt_dir: Path
    batch_log: Path                   # the batch shell's output (sbatch --output)
    node_logs: list[str]              # per node, in node order (SLURM_NODEID)
    node_exit_records: list[str]      # per node: {"node", "host", "exit_code", "job_id", "time"}
    job_exit_record: str              # {"job_id", "exit_code" (srun's), "time"}
    checkpoint_dir: str               # the run's own checkpoint root, as the job sees it
    container: str                    # none | pyxis | apptainer
    time_limit_minutes: int | None    # None: the partition's default; 0: unlimited
    signal_lead_s: int                # SIGTERM this long before the time limit
    # spare nodes (restart.spares, docs/spares.md): the last ``spares`` of the slots (node_logs) wait
    # as spares; the rounds folder in the attempt folder says which slots run (runtime/keeper.py)
    spares: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        if not self.spares:
            data.pop("spares")      # a plan without spares reads as it always did
        return data


def render_slurm(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, host: HostFacts) -> Plan[SlurmRequest]:
    found = problems(spec)
    if found:
        raise SpecError(found)
    home = _home(host)
    job_name = layout.attempt_name(spec.name, ctx.attempt)
    attempt_dir = layout.attempt_dir(spec.name, ctx.attempt, home)
    container = spec.slurm.container
    notes: list[str] = [f"attempt folder {attempt_dir}: every node writes its log and exit record there, so it must "
                        "be on a filesystem the nodes and this host share"]
    checkpoint_root = _checkpoint_root(spec, home, notes)
    spares = spec.restart.spares
    slots = spec.nodes + spares
    directives = _directives(spec, profile, ctx, job_name, notes)
    srun_options, launch, torchrun = _step(spec, profile, ctx, host, home, notes)
    if spares:
        notes.append(f"{spares} spare node(s): the allocation has {slots} nodes, one slot each (slots "
                     f"{', '.join(map(str, range(spec.nodes, slots)))} wait as spares); the c10d store runs in the "
                     f"batch script on the allocation's first node, whose slot is the last spare")
    env = job_env(spec, profile, ctx, checkpoint_dir=_checkpoint_dir(spec, home),
                  backend_env=dict(profile.docker.env) if container != "none" else None)
    bad = [k for k in env if not is_env_name(k)]
    if bad:
        raise SpecError([(f"env.{bad[0]}", "not an environment variable name (letters, digits, _)")])
    script_path = attempt_dir / SCRIPT_FILE
    batch_log = attempt_dir / BATCH_LOG
    sbatch_argv = ["sbatch", "--parsable", f"--output={_PERCENT.sub('%%', str(batch_log))}", str(script_path)]
    notes += _resource_notes(spec)
    comments = [f"wmctl plan: run {spec.name}, attempt {ctx.attempt}, spec {spec.spec_hash()}",
                f"submitted as: {_shell_line(sbatch_argv)}", *(f"note: {n}" for n in notes)]
    common = {
        "comments": [Verbatim(_comment(c)) for c in comments],
        "directives": [Verbatim(d) for d in directives],
        "attempt_dir": str(attempt_dir),
        "teardown_file": Verbatim(TEARDOWN_FILE),
        "workdir": str(spec.context_dir) if container == "none" else str(attempt_dir),
        "env": [(Verbatim(k), v) for k, v in env.items()],
        "node_name_env": Verbatim(ENV_NODE_NAME),
        "srun_options": _wrapped(srun_options),
        "torchrun": _wrapped(torchrun),
    }
    if spares:
        script = render_shell_template(SPARES_TEMPLATE, {
            **common, "slots": slots,
            "store": _wrapped([host.python, "-m", "orchestrator.runtime.c10dstore", "--port",
                               str(spec.rendezvous.port)]),
            "keeper": _wrapped([host.python, "-m", "orchestrator.runtime.keeper"]),
        })
    else:
        script = render_shell_template(TEMPLATE, {
            **common, "store_host": Verbatim(STORE_HOST_SH.rstrip("\n")), "launch": _wrapped(launch)})
    request = SlurmRequest(
        job_name=job_name, script=script, script_path=script_path, sbatch_argv=sbatch_argv,
        attempt_dir=attempt_dir, batch_log=batch_log,
        node_logs=[str(layout.node_log(spec.name, ctx.attempt, n, home)) for n in range(slots)],
        node_exit_records=[str(layout.node_exit_file(spec.name, ctx.attempt, n, home)) for n in range(slots)],
        job_exit_record=str(attempt_dir / JOB_EXIT_FILE), checkpoint_dir=checkpoint_root, container=container,
        time_limit_minutes=time_limit_minutes(spec.slurm.time_limit), signal_lead_s=signal_lead_s(spec),
        spares=spares)
    resources = [{"kind": "batch_job", "name": job_name, "nodes": spec.nodes, "script": str(script_path),
                  "sbatch": list(sbatch_argv), "directives": list(directives),
                  **({"spares": spares} if spares else {})}]
    return Plan(backend="slurm", run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(), request=request,
                resources=resources, notes=notes, context=ctx)


def _home(host: HostFacts) -> Path:
    """$WMCTL_HOME as every node must see it: an absolute path (the script changes folder before
    the nodes start) of one line."""
    home = host.home
    if not home.is_absolute() or _CONTROL.search(str(home)):
        raise OptionError(f"WMCTL_HOME={str(home)[:120]!r} must be an absolute path on one line for Slurm: the nodes "
                          "write their logs and exit records under it",
                          hint="point WMCTL_HOME at a folder every node mounts, e.g. /shared/$USER/.wmctl")
    return home


def _checkpoint_dir(spec: JobSpec, home: Path) -> str:
    """checkpoint.dir as the nodes see it: a folder of the shared filesystem without a container
    (as on the local backend: relative to the spec, or under a host_path volume's folder; by
    default the run folder's), the container path inside one (by default the run folder's, which
    is mounted at its own path)."""
    if spec.slurm.container == "none" or not spec.checkpoint.dir:
        return str(local_checkpoint_dir(spec, home))
    return spec.checkpoint.dir


def _checkpoint_root(spec: JobSpec, home: Path, notes: list[str]) -> str:
    root = run_checkpoint_dir(_checkpoint_dir(spec, home), spec.name)
    notes.append(f"checkpoints in {root}")
    if spec.slurm.container == "none" and spec.checkpoint.dir:
        vol = spec.volume_for(spec.checkpoint.dir)
        if vol is not None and vol.source != "host_path":
            notes.append(f"checkpoint dir {spec.checkpoint.dir} is on volume {vol.name!r} ({vol.source}), which Slurm "
                         f"does not mount without a container: the nodes write to {spec.checkpoint.dir} on their own "
                         "filesystems, which must be one shared filesystem for a resume to find it")
    return root


def _directives(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, job_name: str,
                notes: list[str]) -> list[str]:
    s = spec.slurm
    slots = spec.nodes + spec.restart.spares       # spare nodes are nodes of the allocation too
    out = [f"--job-name={job_name}", f"--nodes={slots}", "--ntasks-per-node=1"]
    cpus = _cpus(spec)
    if cpus is not None:
        out.append(f"--cpus-per-task={cpus}")
    gres = _gres(spec, profile)
    if gres:
        out.append(f"--gres={gres}")
    if spec.resources.memory_bytes is not None:
        out.append(f"--mem={_megabytes(spec.resources.memory_bytes)}")
    minutes = time_limit_minutes(s.time_limit)
    if minutes is not None:
        out.append(f"--time={format_minutes(minutes)}")
    out.append(f"--signal=TERM@{signal_lead_s(spec)}")
    if ctx.excluded_nodes:
        for name in ctx.excluded_nodes:
            if not NODE_NAME.fullmatch(name):
                raise SpecError([("--exclude-node", f"{name[:60]!r} is not a Slurm node name (letters, digits, "
                                  "_ . - and hostlist brackets)")])
        out.append(f"--exclude={','.join(ctx.excluded_nodes)}")
        own = [n for n in ctx.excluded_nodes if n not in ctx.remembered_nodes]   # the others: a note of their own
        if own:
            notes.append(f"excluding nodes that failed earlier attempts: {', '.join(own)}")
    out.append("--no-requeue")
    if spec.restart.spares:
        out.append("--no-kill")     # a failed node does not end the job: a spare takes its place
    if s.exclusive if s.exclusive is not None else slots > 1:
        out.append("--exclusive")
    for fname in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(s, fname)
        if value is not None:
            out.append(f"--{fname}={value}")
    out += s.extra_options
    return out


def _cpus(spec: JobSpec) -> int | None:
    """CPUs per node: the one task's (--cpus-per-task), whole CPUs as Slurm counts them."""
    return None if spec.resources.cpu is None else max(1, math.ceil(spec.resources.cpu))


def _gres(spec: JobSpec, profile: VendorProfile) -> str | None:
    """``NAME[:TYPE]:COUNT`` per node, or None when nothing is asked (no devices, or gres: none)."""
    accel = accelerators_per_node(spec, profile)
    if not accel or spec.slurm.gres == GRES_NONE:
        return None
    name = spec.slurm.gres or profile.slurm.gres
    if not name:
        raise SpecError([("slurm.gres", f"the {profile.name} profile names no GRES for its devices and "
                          f"accelerators_per_node is {accel}: set slurm.gres to the name your site gives them "
                          "(`scontrol show node NODE` lists a node's Gres), or none to ask for no GRES")])
    if not GRES.fullmatch(name):
        raise SpecError([("slurm.gres", f"the {profile.name} profile's GRES {name!r} is not NAME or NAME:TYPE; "
                          "set slurm.gres")])
    return f"{name}:{accel}"


def _megabytes(n: int) -> str:
    """A size as sbatch's --mem reads it (binary units, M by default): whole G when exact, else M
    rounded up."""
    if n % 2**30 == 0:
        return f"{n // 2**30}G"
    return f"{math.ceil(n / 2**20)}M"


def _step(spec: JobSpec, profile: VendorProfile, ctx: AttemptContext, host: HostFacts, home: Path,
          notes: list[str]) -> tuple[list[object], list[object], list[object]]:
    """The srun options, what runs the node script (a container's, or bash on the node), and the
    torchrun line, as shell words."""
    container = spec.slurm.container
    spares = spec.restart.spares
    per_step = 1 if spares else spec.nodes      # with spares: one step per slot, on one node each
    srun: list[object] = [f"--nodes={per_step}", f"--ntasks={per_step}", "--ntasks-per-node=1"]
    cpus = _cpus(spec)
    if cpus is not None:
        srun.append(f"--cpus-per-task={cpus}")   # srun 22.05 does not take it from sbatch's
    gres = _gres(spec, profile)
    if gres:
        srun.append(f"--gres={gres}")
    # One node ending early (a preempted node's exit 83 after its save) must not kill the others
    # before their save is committed; the supervisor tears the attempt down. --export=ALL: the
    # tasks get this script's environment even when the submitter's SBATCH_EXPORT said NONE.
    srun += ["--kill-on-bad-exit=0", "--export=ALL"]
    prefix: list[object] = []
    if container == "none":
        # As local agents do: the submitting host's interpreter (on the shared filesystem) runs
        # torchrun, the launcher and a `python` command, so the job sees the same torch and wmctl.
        python = host.python
        torchrun: list[str] | None = [python, "-m", "torch.distributed.run"]
        launcher: list[str] | None = [python, "-m", "orchestrator.runtime.affinity"]
        command = [python, *spec.command[1:]] if spec.command[0] in PYTHON_NAMES else list(spec.command)
        notes.append(f"no container: the nodes run {python} and the job's code in {spec.context_dir}, both on the "
                     "shared filesystem")
        if spec.volumes:
            notes.append("volumes are not mounted without a container: the job sees the nodes' own folders")
    else:
        image = spec.image.tag or ""
        run_dir = str(layout.run_dir(spec.name, home))
        mounts = _mounts(spec, profile, run_dir)
        workdir = spec.workdir or spec.image.workdir
        if container == "pyxis":
            srun += [f"--container-image={_enroot_image(image)}", f"--container-mounts={','.join(mounts)}",
                     f"--container-workdir={workdir}"]
        else:
            prefix = ["apptainer", "exec", *profile.slurm.apptainer_flags, *(("--bind", m) for m in mounts),
                      ("--pwd", workdir), f"docker://{image}"]
            notes.append("apptainer converts the image on each node at first use (its cache: ~/.apptainer/cache)")
        torchrun = launcher = None
        command = list(spec.command)
    launch: list[object] = [*prefix, "bash", "-c", Verbatim('"$node_script"'), "wmctl-node",
                            Verbatim('"$attempt_dir"')]
    argv = torchrun_args(spec, profile, endpoint=_ENDPOINT_MARK, rdzv_id=layout.rendezvous_id(spec.name, ctx.attempt),
                         node_rank=None, store_apart=bool(spares), launcher=launcher, torchrun=torchrun,
                         command=command)
    # The one word computed on node 0 (its NodeAddr, read by the script): a wmctl value, never the user's.
    endpoint = Verbatim(f'"--rdzv-endpoint=${{rdzv_host}}:{spec.rendezvous.port}"')
    options = argv.index("--")         # torchrun's own options end there; the user's words follow
    words: list[object] = [endpoint if arg == f"--rdzv-endpoint={_ENDPOINT_MARK}" else arg
                           for arg in argv[:options]]
    words += argv[options:]
    if sum(w is endpoint for w in words) != 1:
        raise RuntimeError("the torchrun line must hold exactly one --rdzv-endpoint")
    return srun, launch, words


_ENDPOINT_MARK = "NODE0"


def _mounts(spec: JobSpec, profile: VendorProfile, run_dir: str) -> list[str]:
    """SRC:DST[:ro] for pyxis and apptainer: the run folder at its own path (logs, exit records,
    the default checkpoints), each host_path volume, and the vendor's driver folders read-only."""
    mounts = [f"{run_dir}:{run_dir}"]
    if re.search(r"[,:]", run_dir):
        raise OptionError(f"WMCTL_HOME: the run folder {run_dir!r} holds ',' or ':', which {spec.slurm.container} "
                          "reads as separators of its mount list", hint="point WMCTL_HOME at another folder")
    for vol in spec.volumes:
        if vol.host_path is not None:
            src = str(host_path_source(spec, vol.host_path))
            mounts.append(f"{src}:{vol.mount}" + (":ro" if vol.read_only else ""))
    mounts += [f"{p}:{p}:ro" for p in profile.docker.mounts]
    return mounts


def _enroot_image(ref: str) -> str:
    """A registry reference as pyxis (enroot) reads it: ``REGISTRY#IMAGE:TAG``. Without the '#',
    enroot takes the registry's host name for a Docker Hub namespace."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def _resource_notes(spec: JobSpec) -> list[str]:
    notes = []
    minutes = time_limit_minutes(spec.slurm.time_limit)
    if minutes and minutes * 60 != limit_seconds(spec.slurm.time_limit):
        notes.append(f"slurm.time_limit {spec.slurm.time_limit} rounded up to {format_minutes(minutes)}: Slurm counts "
                     "whole minutes")
    if spec.resources.cpu is None:
        notes.append("resources.cpu is not set: each node's task gets Slurm's default CPUs (one, unless the "
                     "partition says otherwise); set resources.cpu to the CPUs per node")
    elif not float(spec.resources.cpu).is_integer():
        notes.append(f"resources.cpu {spec.resources.cpu:g} rounded up to {_cpus(spec)} CPUs: Slurm counts whole CPUs")
    notes.append(f"resources.shm ({spec.resources.shm}) does not apply: a Slurm job uses its nodes' /dev/shm")
    return notes


def _comment(text: str) -> str:
    """One comment line, whatever ``text`` holds: a control character would end the comment."""
    return _CONTROL.sub("?", text)


def _wrapped(words: list[object], width: int = 100) -> Verbatim:
    """Shell words, each quoted, on lines of about ``width`` characters joined by a backslash-newline
    (outside any quote: the same words to bash), indented under the command they continue."""
    lines: list[str] = []
    line = ""
    for word in map(shell_word, words):     # a tuple (an option and its value) stays on one line
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return Verbatim(" \\\n    ".join([*lines, line]))


def _shell_line(argv: list[str]) -> str:
    return shlex.join(argv)
