"""Spec problems only Slurm has: the ``slurm:`` section, and what its values become.

Every value that reaches an ``#SBATCH`` line is held to an alphabet sbatch copies as it is: sbatch
reads those lines with its own parser (src/sbatch/opt.c ``_get_argument``), where whitespace ends a
word, quotes and backslashes are taken away and an unescaped ``#`` starts a comment. None of those
characters (nor a control character) is allowed there, so no value can need quoting, end its line
or add an option. Everything else a user writes reaches the script shell-quoted (render.py).
"""

from __future__ import annotations

import math
import re

from ...spec import JobSpec
from ...validate import Invalid, Problems, parse_duration

# Partition, account, QOS and reservation names: what Slurm's own names use. A comma separates the
# partitions (or reservations) a job may use, the first that can start it taking it.
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
NAME_LIST = re.compile(r"^[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*$")
# Node features and their operators: & (and), | (or), [..] (one set for every node), *N (count),
# ! (not, 23.02+), parentheses and commas (sbatch's --constraint in man sbatch).
CONSTRAINT = re.compile(r"^[A-Za-z0-9_.\-&|\[\]*:!(),]+$")
# A GRES name, and optionally its type: gpu, gpu:a100 (the count comes from accelerators_per_node).
GRES = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.\-]+)?$")
GRES_NONE = "none"
# Slurm's time forms (man sbatch, --time): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds.
SLURM_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                        r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)|(?P<m>\d+):(?P<ms>\d+))$")
UNLIMITED = ("UNLIMITED", "INFINITE")
MAX_TIME_MINUTES = 2**31 - 2          # slurm.h: INFINITE is 0xffffffff minutes; any int32 is finite
# man sbatch, --signal: "Due to the resolution of event handling by Slurm, the signal may be sent up
# to 60 seconds earlier than specified", and time limits have one-minute resolution.
SIGNAL_SLACK_S = 60
MAX_SIGNAL_LEAD_S = 65535             # man sbatch, --signal: sig_time is 0 to 65535 seconds
# An extra option's value: what sbatch's own options take (mail addresses, begin times, feature and
# GRES lists, bindings), never whitespace, quotes, a backslash, '#', '$' or a control character.
OPTION = re.compile(r"^--(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>[A-Za-z0-9_@%+=:,./\-*~\[\]]+))?$")

# sbatch options a spec may add (slurm.extra_options), and whether each takes a value (man sbatch).
# Options that place or size the job, name its files, or change what sbatch does are wmctl's own.
EXTRA_OPTIONS: dict[str, bool] = {
    "acctg-freq": True, "begin": True, "comment": True, "contiguous": False, "core-spec": True,
    "cores-per-socket": True, "cpu-freq": True, "deadline": True, "delay-boot": True, "dependency": True,
    "gpu-bind": True, "gpu-freq": True, "gres-flags": True, "hint": True, "kill-on-invalid-dep": True,
    "licenses": True, "mail-type": True, "mail-user": True, "mcs-label": True, "mem-bind": True,
    "mincpus": True, "network": True, "nice": True, "overcommit": False, "oversubscribe": False,
    "power": True, "priority": True, "profile": True, "propagate": True, "reboot": False,
    "sockets-per-node": True, "spread-job": False, "switches": True, "thread-spec": True,
    "threads-per-core": True, "tmp": True, "use-min-nodes": False, "wckey": True,
}
# Options wmctl sets itself, or that would break what it relies on: the field to use instead, or why.
OWNED_OPTIONS: dict[str, str] = {
    **dict.fromkeys(("nodes", "ntasks", "ntasks-per-node", "ntasks-per-core", "ntasks-per-socket",
                     "ntasks-per-gpu"), "set nodes (wmctl starts one task per node: torchrun)"),
    **dict.fromkeys(("cpus-per-task", "cpus-per-gpu"), "set resources.cpu (CPUs per node)"),
    **dict.fromkeys(("mem", "mem-per-cpu", "mem-per-gpu"), "set resources.memory (memory per node)"),
    **dict.fromkeys(("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "tres-per-task"),
                    "set slurm.gres and accelerators_per_node"),
    "time": "set slurm.time_limit", "time-min": "set slurm.time_limit",
    "signal": "set slurm.signal_lead (the checkpoint signal before the time limit)",
    "exclude": "wmctl excludes the nodes that failed (restart.exclude_failed_nodes)",
    "nodelist": "choose nodes with slurm.partition, slurm.constraint or slurm.reservation; wmctl excludes "
                "failed nodes itself, which a fixed node list would defeat",
    "requeue": "wmctl owns retries: Slurm's requeue would rerun the script from the start",
    "no-requeue": "wmctl always sets it",
    "exclusive": "set slurm.exclusive", "partition": "set slurm.partition", "account": "set slurm.account",
    "qos": "set slurm.qos", "constraint": "set slurm.constraint", "reservation": "set slurm.reservation",
    **dict.fromkeys(("job-name", "output", "error", "input", "chdir", "open-mode", "parsable"),
                    "wmctl names the job and its files (the run folder holds every node's log)"),
    "export": "the job's environment is the spec's env (and SBATCH_EXPORT's default, ALL, carries it to srun)",
    **dict.fromkeys(("wait", "test-only", "hold", "array", "wrap", "batch", "clusters", "cluster",
                     "get-user-env", "uid", "gid", "het-job", "container", "container-id"),
                    "it changes what wmctl submits or how it follows the job"),
}


def problems(spec: JobSpec) -> Problems:
    """Everything wrong with ``spec.slurm`` (and what only Slurm refuses elsewhere in the spec)."""
    s = spec.slurm
    out: Problems = []
    for fname, pattern, example in (("partition", NAME_LIST, "gpu or gpu,gpu-long"), ("account", NAME, "proj42"),
                                    ("qos", NAME, "normal"), ("reservation", NAME_LIST, "maint-window"),
                                    ("constraint", CONSTRAINT, "a100&ib or [rack1|rack2]")):
        value = getattr(s, fname)
        if value is not None and not pattern.fullmatch(value):
            out.append((f"slurm.{fname}", f"{_shown(value)} {_why_not(value)}; give the name Slurm knows "
                        f"(e.g. {example})"))
    if s.gres is not None and s.gres != GRES_NONE and not GRES.fullmatch(s.gres):
        counted = re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.\-]+)?:\d+", s.gres)
        out.append(("slurm.gres", f"{_shown(s.gres)}: the count comes from accelerators_per_node; give only NAME or "
                    "NAME:TYPE (e.g. gpu or gpu:a100)" if counted else
                    f"{_shown(s.gres)} is not a GRES name: give NAME or NAME:TYPE as the site's gres.conf names it "
                    "(e.g. gpu, gpu:a100), or none to ask for no GRES"))
    limit = _time_problem(spec, out)
    _signal_problem(spec, limit, out)
    out += _option_problems(spec)
    out += _container_problems(spec)
    if spec.restart.spares and s.container != "none":
        out.append(("restart.spares", f"spare nodes on Slurm run without a container for now: the keeper and the "
                    f"c10d store run with this host's interpreter, not slurm.container {s.container}'s; set "
                    "restart.spares: 0, or slurm.container: none"))
    return out


def time_limit_minutes(value: str | None) -> int | None:
    """slurm.time_limit in whole minutes, Slurm's resolution, rounded up (None: the partition's
    default; 0: unlimited). Raises Invalid with what to write instead."""
    seconds = limit_seconds(value)
    if seconds is None or seconds == 0:
        return None if seconds is None else 0
    minutes = math.ceil(seconds / 60)
    if minutes > MAX_TIME_MINUTES:
        raise Invalid(f"{value!r} is longer than Slurm can count; write UNLIMITED for no limit")
    return minutes


def limit_seconds(value: str | None) -> float | None:
    """slurm.time_limit in seconds as written (None: not set; 0: unlimited)."""
    if value is None:
        return None
    text = str(value).strip()
    if text.upper() in UNLIMITED:
        return 0
    if re.fullmatch(r"\d+(\.\d+)?", text):
        raise Invalid(f"{text!r} is a bare number, which Slurm reads as minutes and wmctl durations as seconds; "
                      "write the unit (90m, 24h) or Slurm's form in quotes ('1:30:00', '1-00:00:00'). An "
                      "unquoted 1:30:00 is the number 5400 to YAML (base 60): quote it")
    m = SLURM_TIME.fullmatch(text)
    if m:
        g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
        # The leading field may be as large as it likes (90:00, 48:00:00); the ones after it may not.
        if g.get("dh", 0) > 23 or any(g.get(k, 0) > 59 for k in ("dm", "ds", "hm", "hs", "ms")):
            raise Invalid(f"{text!r} is not a time limit: after days come hours 0-23, after hours or minutes "
                          "come minutes or seconds 0-59 (e.g. 1-12:30:00)")
        seconds = float(g.get("d", 0) * 86400 + (g.get("dh", 0) + g.get("h", 0)) * 3600
                        + (g.get("dm", 0) + g.get("hm", 0) + g.get("m", 0)) * 60
                        + g.get("ds", 0) + g.get("hs", 0) + g.get("ms", 0))
    else:
        try:
            seconds = parse_duration(text)
        except Invalid:
            raise Invalid(f"{text!r} is not a time limit: write a duration (90m, 24h, 1h30m) or Slurm's form "
                          "(MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), or UNLIMITED") from None
    if seconds <= 0:
        raise Invalid(f"{text!r} is no time at all, and 0 would mean no limit to Slurm; give at least 1m "
                      "(or UNLIMITED)")
    return seconds


def format_minutes(minutes: int) -> str:
    """Minutes in Slurm's D-HH:MM:SS form (0: UNLIMITED)."""
    if minutes == 0:
        return "UNLIMITED"
    days, rest = divmod(minutes, 1440)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def signal_lead_s(spec: JobSpec) -> int:
    """slurm.signal_lead in whole seconds (sbatch's --signal counts seconds), rounded up."""
    return math.ceil(parse_duration(spec.slurm.signal_lead))


def save_room_s(spec: JobSpec) -> int:
    """What the SIGTERM checkpoint is given on every backend: the grace period the supervisor's
    graceful cancel waits and Docker's stop timeout (kubernetes.termination_grace_period)."""
    return spec.kubernetes.termination_grace_period_s


def _time_problem(spec: JobSpec, out: Problems) -> int | None:
    try:
        return time_limit_minutes(spec.slurm.time_limit)
    except Invalid as exc:
        out.append(("slurm.time_limit", str(exc)))
        return None


def _signal_problem(spec: JobSpec, limit_minutes: int | None, out: Problems) -> None:
    try:
        lead = signal_lead_s(spec)
    except Invalid as exc:
        out.append(("slurm.signal_lead", str(exc)))
        return
    try:
        room = save_room_s(spec)
    except Invalid:
        return      # kubernetes.termination_grace_period has its own problem already
    least = SIGNAL_SLACK_S + room
    if lead < least:
        out.append(("slurm.signal_lead", f"{lead}s leaves no room: Slurm's signal may come up to {SIGNAL_SLACK_S}s off "
                    f"(man sbatch, --signal: the resolution of its event handling; time limits count whole minutes), "
                    f"and the checkpoint it asks for is given {room}s (kubernetes.termination_grace_period, the "
                    f"grace every backend gives a SIGTERM checkpoint); give at least {least}s, e.g. "
                    f"{math.ceil(least / 60)}m"))
    elif lead > MAX_SIGNAL_LEAD_S:
        out.append(("slurm.signal_lead", f"{lead}s is more than sbatch's --signal takes ({MAX_SIGNAL_LEAD_S}s); "
                    "give a shorter lead, e.g. 5m"))
    elif limit_minutes and lead >= limit_minutes * 60:
        out.append(("slurm.signal_lead", f"{lead}s is not shorter than slurm.time_limit ({limit_minutes} min): the "
                    "checkpoint signal would come as the job starts; lengthen the time limit or shorten the lead"))


def _option_problems(spec: JobSpec) -> Problems:
    out: Problems = []
    for i, item in enumerate(spec.slurm.extra_options):
        path = f"slurm.extra_options[{i}]"
        m = OPTION.fullmatch(item or "")
        if m is None:
            out.append((path, f"{_shown(item)} is not an sbatch option as wmctl takes them: one item per option, "
                        "--name=value or --name, the value without spaces, quotes, '#', '$' or '\\' "
                        "(e.g. --mail-type=END)"))
            continue
        name, value = m.group("name"), m.group("value")
        if name in OWNED_OPTIONS:
            out.append((path, f"--{name} is wmctl's to set: {OWNED_OPTIONS[name]}"))
        elif name not in EXTRA_OPTIONS:
            from ...validate import did_you_mean

            out.append((path, f"--{name} is not an sbatch option wmctl passes on{did_you_mean(name, EXTRA_OPTIONS)} "
                        f"(it takes: {', '.join(sorted(EXTRA_OPTIONS))}); short forms (-x) are not taken"))
        elif EXTRA_OPTIONS[name] and value is None:
            out.append((path, f"--{name} takes a value: write --{name}=VALUE as one item"))
        elif not EXTRA_OPTIONS[name] and value is not None:
            out.append((path, f"--{name} takes no value: write --{name}"))
    return out


def _container_problems(spec: JobSpec) -> Problems:
    """A container needs an image, and keeps nothing it writes: the checkpoint dir must be a
    host_path volume (a folder of the shared filesystem). Mounts are comma-separated SRC:DST
    lists to pyxis and apptainer, so their paths hold no ',' or ':'."""
    if spec.slurm.container == "none":
        return []
    kind = spec.slurm.container
    out: Problems = []
    if not spec.image.tag:
        out.append(("image.tag", f"slurm.container {kind} runs an image: set image.tag (or pass --image)"))
    for i, vol in enumerate(spec.volumes):
        if vol.source != "host_path":
            out.append((f"volumes[{i}]", f"a {vol.source} volume cannot be mounted into a {kind} container on Slurm: "
                        "use a host_path volume (a folder of the filesystem every node mounts)"))
        elif vol.host_path and re.search(r"[,:]", vol.host_path):
            out.append((f"volumes[{i}].host_path", f"{_shown(vol.host_path)} holds ',' or ':', which {kind} reads as "
                        "separators of its mount list; use another path"))
    where = spec.container_checkpoint_dir()
    if where is not None:
        holder = spec.volume_for(where)
        if holder is None or holder.source != "host_path":
            out.append(("checkpoint.dir", f"{spec.checkpoint.dir} is inside the {kind} container, which keeps nothing "
                        "it writes: mount a host_path volume (on the shared filesystem) there"))
    return out


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


def _why_not(value: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "holds a control character (a newline, a tab), which would end its #SBATCH line"
    if re.search(r"[\s\"'\\#]", value):
        return "holds whitespace, a quote, '\\' or '#', which sbatch's #SBATCH parser would split or drop"
    return "holds characters Slurm names do not"
