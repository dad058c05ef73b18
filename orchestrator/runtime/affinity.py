"""Per-rank CPU/NUMA binding: a pure plan from the topology, and the ``wmctl-bind`` launcher.

torchrun runs the launcher once per worker::

    torchrun --nproc-per-node 4 --no-python wmctl-bind python train.py ...

It reads LOCAL_RANK / LOCAL_WORLD_SIZE / WMCTL_AFFINITY / WMCTL_VENDOR, binds itself to the
rank's CPU set, sets OMP_NUM_THREADS to the rank's share of that set (its size divided by the
number of ranks bound to it) and exec's the command, which inherits the binding. Standard library
only, and no torch: it runs before every worker starts.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace

from .protocol import ENV_AFFINITY, ENV_CHECKPOINT_DIR, ENV_KEEP_OMP, ENV_SYSFS_ROOT, ENV_VENDOR
from .protocol import ENV_BOUND_CPUS as ENV_BOUND
from .topology import Topology, TopologyError, format_cpulist, parse_cpulist, read_topology
from .vendor import from_env

MODES = ("none", "numa", "exclusive")


class AffinityError(Exception):
    """The binding asked for cannot be made; the message says what to change."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.hint})" if self.hint else self.message


@dataclass(frozen=True)
class RankBinding:
    local_rank: int
    cpus: frozenset[int]
    numa_node: int | None = None
    device: str | None = None     # PCI BDF of the rank's accelerator
    # OpenMP/MKL threads: the rank's share of its set. In numa mode the ranks of a node share
    # the node's CPUs; each taking all of them would oversubscribe the node ranks-per-node times.
    threads: int = 0

    def to_dict(self) -> dict:
        return {
            "local_rank": self.local_rank,
            "cpus": format_cpulist(self.cpus),
            "num_cpus": len(self.cpus),
            "threads": self.threads,
            "numa_node": self.numa_node,
            "device": self.device,
        }


@dataclass(frozen=True)
class BindingPlan:
    requested: str                 # the mode asked for (none, numa, exclusive, map)
    mode: str                      # the mode applied (the above, or "even" after a fallback)
    ranks: tuple[RankBinding, ...]
    allowed: frozenset[int]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {
            "requested": self.requested,
            "mode": self.mode,
            "allowed": format_cpulist(self.allowed),
            "ranks": [r.to_dict() for r in self.ranks],
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- mode parsing

def parse_mode(value: str | dict | None) -> str | dict[int, frozenset[int]]:
    """``none|numa|exclusive`` or an explicit JSON map ``{"0": "0-15", "1": "16-31"}``."""
    if isinstance(value, dict):
        raw = value
    else:
        text = (value or "numa").strip()
        if text.lower() in MODES:
            return text.lower()
        if not text.startswith("{"):
            raise AffinityError(
                f"affinity {text!r} is not a mode",
                "use none, numa, exclusive or a JSON map like {\"0\": \"0-15\", \"1\": \"16-31\"}",
            )
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise AffinityError(f"affinity map is not valid JSON: {exc}",
                                "write it like {\"0\": \"0-15\", \"1\": \"16-31\"}") from None
        if not isinstance(raw, dict):
            raise AffinityError("affinity map must be a JSON object", "{\"0\": \"0-15\"}")
    out: dict[int, frozenset[int]] = {}
    for key, cpus in raw.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            raise AffinityError(f"affinity map key {key!r} is not a local rank",
                                "keys are local ranks 0, 1, ...") from None
        if rank < 0:
            raise AffinityError(f"affinity map key {key!r} is negative", "keys are local ranks 0, 1, ...")
        try:
            if isinstance(cpus, (list, tuple, set, frozenset)):
                out[rank] = frozenset(int(c) for c in cpus)
            else:
                out[rank] = parse_cpulist(str(cpus))
        except (TopologyError, ValueError, TypeError):
            raise AffinityError(f"affinity map entry for local rank {rank}: bad CPU list {cpus!r}",
                                "use a list like \"0-15\" or \"0-7,32-39\"") from None
        if not out[rank]:
            raise AffinityError(f"affinity map entry for local rank {rank} is empty", "give it at least one CPU")
    return out


# ---------------------------------------------------------------- the plan (pure)

def split_evenly(cpus, n: int, cores=()) -> list[frozenset[int]]:
    """Split ``cpus`` into ``n`` disjoint, contiguous, near-equal sets.

    Whole physical cores (SMT siblings together) are handed out when there are at least ``n``
    of them; otherwise single CPUs. Raises AffinityError when n > len(cpus).
    """
    cpus = frozenset(cpus)
    if n > len(cpus):
        raise AffinityError(
            f"{n} ranks but only {len(cpus)} allowed CPUs ({format_cpulist(cpus) or 'none'}): "
            "each rank needs at least one CPU of its own",
            "lower nproc_per_node or raise the cpu request (resources.cpu / --cpuset-cpus)",
        )
    groups: list[frozenset[int]] = []
    seen: set[int] = set()
    for core in cores:
        g = frozenset(core) & cpus
        if g and not (g & seen):
            groups.append(g)
            seen |= g
    groups += [frozenset({c}) for c in sorted(cpus - seen)]
    groups.sort(key=min)
    if len(groups) < n:
        # Not enough whole cores: split threads, still keeping each core's threads adjacent.
        groups = [frozenset({c}) for g in groups for c in sorted(g)]
    total = len(groups)
    return [frozenset().union(*groups[i * total // n:(i + 1) * total // n]) for i in range(n)]


def _even(topo: Topology, nproc: int, requested: str, notes: list[str]) -> BindingPlan:
    if requested != "exclusive" and nproc > len(topo.allowed):
        # Sharing is what numa mode means; only exclusive promises each rank CPUs of its own.
        ncpu = len(topo.allowed)
        singles = split_evenly(topo.allowed, ncpu, topo.cores)
        sets = [singles[r * ncpu // nproc] for r in range(nproc)]
        notes.append(
            f"{nproc} ranks but only {ncpu} allowed CPUs ({format_cpulist(topo.allowed)}): ranks share CPUs, "
            "one OpenMP thread each, and contend for CPU time; lower nproc_per_node or raise the cpu request"
        )
    else:
        sets = split_evenly(topo.allowed, nproc, topo.cores)
    ranks = tuple(RankBinding(r, s, _node_of(topo, s), _bdf(topo, r)) for r, s in enumerate(sets))
    return BindingPlan(requested, "even", ranks, topo.allowed, tuple(notes))


def _bdf(topo: Topology, rank: int) -> str | None:
    return topo.devices[rank].bdf if rank < len(topo.devices) else None


def _node_of(topo: Topology, cpus) -> int | None:
    nodes = [n for n, c in topo.node_cpus.items() if cpus and cpus <= c]
    return nodes[0] if len(nodes) == 1 else None


def _missing_numa_reason(topo: Topology, nproc: int) -> str | None:
    if topo.vendor == "cpu":
        return "vendor cpu: no accelerators"
    if not topo.devices:
        return f"no {topo.vendor} devices found in sysfs"
    if len(topo.devices) < nproc:
        return f"{nproc} ranks but {len(topo.devices)} {topo.vendor} devices found"
    for r in range(nproc):
        d = topo.devices[r]
        if d.numa_node < 0 or d.numa_node not in topo.node_cpus:
            return f"device {d.bdf} of local rank {r} has no NUMA node (numa_node={d.numa_node})"
    return None


def plan_binding(topo: Topology, nproc: int, mode) -> BindingPlan:
    """Per-local-rank CPU sets for ``nproc`` ranks. Pure: everything comes from ``topo``.

    Every set lies within ``topo.allowed``. numa: the rank's device's node (shared between the
    ranks on that node); exclusive: the node's CPUs split among its ranks, no sharing; map: as
    given, validated; fallback ("even"): the allowed CPUs split evenly by local rank (shared,
    with a note, when ranks outnumber CPUs outside exclusive mode). Each rank's ``threads`` is
    its set's size divided by the number of ranks whose sets overlap it (at least 1).
    """
    plan = _plan(topo, nproc, mode)
    return replace(plan, ranks=_with_threads(plan.ranks))


def _with_threads(ranks: tuple[RankBinding, ...]) -> tuple[RankBinding, ...]:
    out = []
    for r in ranks:
        sharers = sum(1 for other in ranks if other.cpus & r.cpus)
        out.append(replace(r, threads=max(1, len(r.cpus) // max(1, sharers))))
    return tuple(out)


def _plan(topo: Topology, nproc: int, mode) -> BindingPlan:
    if nproc < 1:
        raise AffinityError(f"nproc must be at least 1, got {nproc}", "pass --nproc N with N >= 1")
    parsed = parse_mode(mode)
    allowed = topo.allowed
    if not allowed:
        raise AffinityError("this process is allowed no CPUs", "check the cgroup cpuset of the container")

    if parsed == "none":
        ranks = tuple(RankBinding(r, allowed, None, _bdf(topo, r)) for r in range(nproc))
        return BindingPlan("none", "none", ranks, allowed)

    if isinstance(parsed, dict):
        return _plan_map(topo, nproc, parsed)

    notes: list[str] = []
    reason = _missing_numa_reason(topo, nproc)
    if reason:
        notes.append(f"{reason}; splitting the allowed CPUs evenly by local rank")
        return _even(topo, nproc, parsed, notes)

    per_rank_node = [topo.devices[r].numa_node for r in range(nproc)]
    available = {n: topo.node_cpus[n] & allowed for n in set(per_rank_node)}
    empty = sorted(n for n, c in available.items() if not c)
    if empty:
        notes.append(
            f"the allowed CPUs ({format_cpulist(allowed)}) exclude NUMA node(s) "
            f"{', '.join(map(str, empty))} of some ranks' devices; splitting the allowed CPUs evenly"
        )
        return _even(topo, nproc, parsed, notes)

    if parsed == "numa":
        ranks = tuple(
            RankBinding(r, available[n], n, topo.devices[r].bdf) for r, n in enumerate(per_rank_node)
        )
        for node in sorted(available):
            members = per_rank_node.count(node)
            if members > len(available[node]):
                notes.append(
                    f"NUMA node {node}: {members} ranks share {len(available[node])} allowed CPU(s) "
                    f"({format_cpulist(available[node])}): one OpenMP thread each, and they contend for CPU "
                    "time; lower nproc_per_node or raise the cpu request"
                )
        return BindingPlan("numa", "numa", ranks, allowed, tuple(notes))

    # exclusive: each node's allowed CPUs split among the ranks whose devices sit on it.
    sets: dict[int, frozenset[int]] = {}
    for node in sorted(available):
        on_node = [r for r, n in enumerate(per_rank_node) if n == node]
        if len(on_node) > len(available[node]):
            notes.append(
                f"NUMA node {node} has {len(on_node)} ranks but only {len(available[node])} allowed CPUs; "
                "splitting the allowed CPUs evenly"
            )
            return _even(topo, nproc, parsed, notes)
        for r, s in zip(on_node, split_evenly(available[node], len(on_node), topo.cores), strict=True):
            sets[r] = s
    ranks = tuple(RankBinding(r, sets[r], per_rank_node[r], topo.devices[r].bdf) for r in range(nproc))
    return BindingPlan("exclusive", "exclusive", ranks, allowed, tuple(notes))


def _plan_map(topo: Topology, nproc: int, mapping: dict[int, frozenset[int]]) -> BindingPlan:
    extra = sorted(r for r in mapping if r >= nproc)
    if extra:
        raise AffinityError(
            f"affinity map names local rank(s) {', '.join(map(str, extra))} but there are only {nproc} ranks",
            f"use local ranks 0..{nproc - 1}",
        )
    missing = [r for r in range(nproc) if r not in mapping]
    if missing:
        raise AffinityError(
            f"affinity map has no CPU list for local rank(s) {', '.join(map(str, missing))}",
            "give every local rank an entry, or use mode numa/exclusive",
        )
    notes: list[str] = []
    for r in range(nproc):
        outside = mapping[r] - topo.allowed
        if outside:
            raise AffinityError(
                f"affinity map: local rank {r} asks for CPUs {format_cpulist(outside)}, "
                f"outside the allowed CPUs {format_cpulist(topo.allowed)}",
                "pick CPUs from the allowed set (see `wmctl affinity`) or raise the cpu request",
            )
    for a in range(nproc):
        for b in range(a + 1, nproc):
            if mapping[a] & mapping[b]:
                notes.append(f"local ranks {a} and {b} share CPUs {format_cpulist(mapping[a] & mapping[b])}")
    ranks = tuple(RankBinding(r, mapping[r], _node_of(topo, mapping[r]), _bdf(topo, r)) for r in range(nproc))
    return BindingPlan("map", "map", ranks, topo.allowed, tuple(notes))


# ---------------------------------------------------------------- applying it

def _env_int(env, name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise AffinityError(f"{name}={text!r} is not an integer", f"unset {name} or set it to a number") from None


def plan_for_this_rank(env=None) -> tuple[BindingPlan, RankBinding]:
    """The plan for the environment torchrun gives a worker, and this worker's entry in it."""
    env = os.environ if env is None else env
    local_rank = _env_int(env, "LOCAL_RANK", 0)
    nproc = _env_int(env, "LOCAL_WORLD_SIZE", 1)
    if not 0 <= local_rank < nproc:
        raise AffinityError(f"LOCAL_RANK={local_rank} is outside LOCAL_WORLD_SIZE={nproc}",
                            "run the launcher under torchrun, which sets both")
    root = env.get(ENV_SYSFS_ROOT, "/") or "/"
    try:
        own = from_env(env)
        topo = read_topology(own.name if own else (env.get(ENV_VENDOR, "auto") or "auto"), root, env)
    except TopologyError as exc:
        raise AffinityError(str(exc), "set WMCTL_VENDOR to a known vendor profile") from None
    # A fake tree still runs on the real CPUs: never plan outside what the kernel allows us.
    real = frozenset(os.sched_getaffinity(0))
    if root != "/":
        topo = Topology(topo.vendor, topo.devices, topo.node_cpus, topo.cores, topo.allowed & real,
                        topo.device_source, topo.notes)
    plan = plan_binding(topo, nproc, env.get(ENV_AFFINITY, "numa"))
    return plan, plan.ranks[local_rank]


def _set_threads_env(env, n: int) -> None:
    if env.get(ENV_KEEP_OMP, "") == "1":
        return
    env["OMP_NUM_THREADS"] = str(n)
    env["MKL_NUM_THREADS"] = str(n)


def _describe(plan: BindingPlan, rank: RankBinding, global_rank: str | None = None) -> str:
    node = "-" if rank.numa_node is None else str(rank.numa_node)
    line = (f"wmctl-bind: local_rank={rank.local_rank} cpus={format_cpulist(rank.cpus)} numa={node} mode={plan.mode}"
            f" threads={rank.threads}" + (f" rank={global_rank}" if global_rank is not None else ""))
    return line + "".join(f"\nwmctl-bind: note: {n}" for n in plan.notes if rank.local_rank == 0)


def apply_binding_for_this_rank(env=None, *, log=None) -> RankBinding | None:
    """Bind the calling process (use before spawning threads) as the launcher would.

    For jobs that do not use ``wmctl-bind``. Returns the binding, or None for mode ``none``.
    """
    env = os.environ if env is None else env
    plan, rank = plan_for_this_rank(env)
    if plan.mode == "none":
        return None
    os.sched_setaffinity(0, rank.cpus)
    env[ENV_BOUND] = format_cpulist(rank.cpus)
    _set_threads_env(env, rank.threads)
    torch = sys.modules.get("torch")  # already loaded: env vars alone are too late for its pool
    if torch is not None and env.get(ENV_KEEP_OMP, "") != "1":
        torch.set_num_threads(rank.threads)
    print(_describe(plan, rank), file=log or sys.stderr, flush=True)
    return rank


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def verify_binding(env=None, *, reapply: bool = True, log=None) -> dict:
    """Re-check the binding after process-group init: some collective libraries (NCCL 2.30)
    reset CPU affinity during init. Re-applies the launcher's set to every thread if it changed.

    Returns a small dict for the progress line: status ok | reapplied | changed | unbound.
    """
    env = os.environ if env is None else env
    bound = env.get(ENV_BOUND, "").strip()
    current = frozenset(os.sched_getaffinity(0))
    if not bound:
        return {"status": "unbound", "cpus": format_cpulist(current)}
    expected = parse_cpulist(bound)
    if current == expected:
        return {"status": "ok", "cpus": bound}
    report = {"status": "changed", "cpus": bound, "found": format_cpulist(current)}
    if reapply:
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, expected)
            except (ProcessLookupError, PermissionError):
                continue  # the thread ended meanwhile, or is not ours to move
        os.sched_setaffinity(0, expected)
        report["status"] = "reapplied"
    print(
        f"wmctl-bind: local_rank={env.get('LOCAL_RANK', '0')} affinity changed after init "
        f"(found {report['found']}, expected {bound}){'; re-applied' if reapply else ''}",
        file=log or sys.stderr, flush=True,
    )
    return report


USAGE = "usage: wmctl-bind [--] COMMAND [ARGS...]   (run by torchrun --no-python per worker)"


def _ensure_checkpoint_dir(env: "os._Environ[str] | dict[str, str]") -> None:
    """The run's own checkpoint folder (``<checkpoint.dir>/<run>``, WMCTL_CHECKPOINT_DIR) exists
    before the job starts, on every backend: a script that never imports the runtime writes
    into it as it would into the folder it configured."""
    folder = env.get(ENV_CHECKPOINT_DIR)
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        print(f"wmctl-bind: warning: cannot create the checkpoint folder {folder}: {exc}", file=sys.stderr,
              flush=True)
        return
    if not os.access(folder, os.W_OK | os.X_OK):
        # Said before the job runs, not at its first save: a container running as a user
        # (docker.user) who does not own the host folder behind its checkpoint mount.
        print(f"wmctl-bind: error: the checkpoint folder {folder} is not writable by uid {os.getuid()} "
              f"gid {os.getgid()}: give that user the folder on the host, or set docker.user",
              file=sys.stderr, flush=True)
        sys.exit(2)


def launcher_main(argv: list[str] | None = None) -> None:
    """Entry point of ``wmctl-bind`` and ``python -m orchestrator.runtime.affinity``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        sys.exit(0 if args else 2)
    env = os.environ
    try:
        plan, rank = plan_for_this_rank(env)
    except AffinityError as exc:
        print(f"wmctl-bind: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if plan.mode != "none":
        try:
            os.sched_setaffinity(0, rank.cpus)
        except OSError as exc:
            print(f"wmctl-bind: error: cannot bind to CPUs {format_cpulist(rank.cpus)}: {exc}",
                  file=sys.stderr, flush=True)
            sys.exit(2)
        env[ENV_BOUND] = format_cpulist(rank.cpus)
        _set_threads_env(env, rank.threads)
    # The global rank ends the line: `wmctl logs` finds the node holding rank 0 by it (the
    # rendezvous, not the node index, decides where rank 0 runs).
    print(_describe(plan, rank, env.get("RANK", "-")), file=sys.stderr, flush=True)
    _ensure_checkpoint_dir(env)
    try:
        os.execvp(args[0], args)
    except FileNotFoundError:
        print(f"wmctl-bind: error: command not found: {args[0]}", file=sys.stderr, flush=True)
        sys.exit(127)
    except PermissionError:
        print(f"wmctl-bind: error: command not executable: {args[0]}", file=sys.stderr, flush=True)
        sys.exit(126)


if __name__ == "__main__":
    launcher_main()
