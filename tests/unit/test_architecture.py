"""The shape of orchestrator/: imports flow one way, the runtime stands alone, and backends are
known by the registry alone.

The layer table below covers every module (a new module without a row fails the test). A module
may import from its own layer and the layers under it, never from one above:

    commands -> api -> runs, logs -> supervisor, reconcile -> backends (engines) -> render/check/classify
    -> spec, layout, vendors

Within a layer imports may not go round in a circle either (``test_no_import_circles_above_the_runtime``).

Function-local imports count the same as top-level ones: a lazy import is still a dependency.
And no module imports itself through others, within a layer too: no import cycle anywhere.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from pathlib import Path

import pytest

from orchestrator import backends

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"

# (module or package prefix, layer); the longest matching prefix wins. Higher imports lower.
LAYERS: list[tuple[str, int]] = [
    ("orchestrator.cli", 8),
    ("orchestrator.commands", 8),
    ("orchestrator.api", 7),             # load, plan, submit, and where the watcher runs
    ("orchestrator.watcher", 7),         # the detached watcher process: the library's watch
    ("orchestrator.runs", 6),            # what a run is and what can be asked of it (status, list, cancel, ...)
    ("orchestrator.logview", 6),         # `wmctl logs`: the library's logs, across nodes and attempts
    ("orchestrator.supervisor", 5),
    ("orchestrator.tracker", 5),         # what an attempt's observations add up to: the supervisor's verdict
    ("orchestrator.keptmetrics", 5),     # which progress lines the run store already has
    ("orchestrator.endgame", 5),         # an attempt's end once the job is done: benign exits, the exit barrier
    ("orchestrator.inplace", 5),         # in-place recovery with spare nodes: the attempt goes on
    ("orchestrator.reconcile", 5),       # a run nobody watches: read from its backend, handed back to a watcher
    ("orchestrator.timeline", 5),        # `wmctl describe`: a run's events, from its folder
    ("orchestrator.display", 5),
    ("orchestrator.panel", 5),           # the live panel's model: pure, rows out of the supervisor's news
    ("orchestrator.watchview", 5),       # what a watcher hands its view: lines and news
    ("orchestrator.joberror", 5),        # a failure in the job's own words, read from its node's output
    ("orchestrator.waitnote", 5),        # a running attempt's wait, said in status: the API away, a pull
    ("orchestrator.silence", 5),         # the runtime's node beat turned into node loss
    ("orchestrator.stragglers", 5),      # the ranks' step pace turned into stragglers (pure)
    ("orchestrator.stragglerwatch", 5),  # the supervisor's side of stragglers: told, recorded, replaced
    # backends: the registry, each package's face and its engine (they reach the SDKs and the store)
    ("orchestrator.backends", 4),
    ("orchestrator.backends.local.engine", 4),
    ("orchestrator.backends.local.agent", 4),
    ("orchestrator.backends.docker.engine", 4),
    ("orchestrator.backends.kubernetes.engine", 4),     # the Backend face; its rooms below
    ("orchestrator.backends.kubernetes.cluster", 4),    # the client, namespaces, API errors in our words
    ("orchestrator.backends.kubernetes.apply", 4),      # create/adopt/own/delete through the kinds table
    ("orchestrator.backends.kubernetes.record", 4),     # the one per-attempt record
    ("orchestrator.backends.kubernetes.observe", 4),    # watches and poll
    ("orchestrator.backends.kubernetes.podlogs", 4),    # log followers, wmctl logs, kept tails
    ("orchestrator.backends.kubernetes.teardown", 4),   # cancel, graceful stop, cut_grace
    ("orchestrator.backends.kubernetes.client", 4),
    ("orchestrator.backends.kubernetes.watch", 4),
    ("orchestrator.backends.kubernetes.nodewatch", 4),
    ("orchestrator.backends.kubernetes.rounds", 4),     # spare nodes at run time: rounds, fencing, a new spare
    ("orchestrator.backends.slurm.engine", 4),          # the Backend face: sbatch, poll, scancel
    ("orchestrator.backends.slurm.tools", 4),           # Slurm's client tools, run and parsed
    ("orchestrator.backends.slurm.doctor", 4),          # wmctl doctor --slurm
    # pure planning: renderers, checks, classifiers, and what they share
    ("orchestrator.backends.base", 3),
    ("orchestrator.backends.host_paths", 3),
    ("orchestrator.backends.logcursor", 3),  # a followed log read again: what both engines share
    ("orchestrator.backends.local.render", 3),
    ("orchestrator.backends.local.classify", 3),
    ("orchestrator.backends.docker.render", 3),
    ("orchestrator.backends.docker.classify", 3),
    ("orchestrator.backends.docker.spares", 3),         # spare nodes: the keeper's command, mounts, the store
    ("orchestrator.backends.kubernetes.render", 3),
    ("orchestrator.backends.kubernetes.check", 3),
    ("orchestrator.backends.kubernetes.kinds", 3),
    ("orchestrator.backends.kubernetes.spares", 3),     # what spare nodes add to the plan
    ("orchestrator.backends.kubernetes.classify", 3),
    ("orchestrator.backends.kubernetes.podend", 3),     # a pod's end or failed start, in the kubelet's words
    ("orchestrator.backends.slurm.render", 3),          # the sbatch script and command line
    ("orchestrator.backends.slurm.check", 3),           # the slurm: section, and what #SBATCH lines may hold
    ("orchestrator.backends.slurm.classify", 3),        # exit records, job states, reasons -> events
    # what a failure is, from events and a node's own words: pure; the backends read a node's words
    # with it too (a peer's breakage, the job's own error: slurm/classify.py, kubernetes/rounds.py)
    ("orchestrator.failures", 3),
    ("orchestrator.launch", 3),
    ("orchestrator.templating", 3),
    ("orchestrator.imagebuild", 3),
    ("orchestrator.plot", 3),            # run pictures: pure plot data, a text chart, matplotlib drawing
    # the ground floor: spec types, names and paths, vendor profiles, run state
    ("orchestrator.spec", 2),             # the spec's types and limits
    ("orchestrator.specload", 2),         # YAML, overrides and --set flags -> a checked JobSpec
    ("orchestrator.speccheck", 2),        # the spec's checks: problems naming the field and the fix
    ("orchestrator.validate", 2),
    ("orchestrator.yamlsafe", 2),        # the strict, bounded loader of what users write
    ("orchestrator.imageref", 2),        # image references: distribution/reference's grammar
    ("orchestrator.names", 2),           # DNS, Kubernetes and env names, checked without patterns
    ("orchestrator.vendors", 2),
    ("orchestrator.plan", 2),
    ("orchestrator.state", 2),
    ("orchestrator.storehook", 2),       # which module keeps run state: the registry answers, state asks
    ("orchestrator.exclusions", 2),      # exclusions remembered past a run, per cluster, beside the run store
    ("orchestrator.serialize", 2),
    ("orchestrator.labels", 2),
    ("orchestrator.resources", 2),
    ("orchestrator.layout", 2),
    ("orchestrator.errors", 2),
    ("orchestrator.adaptors", 2),        # the SDKs, loaded on first use; they import only errors
    ("orchestrator", 2),                 # the package itself (__version__)
    # inside the job: imports only itself, torch and the standard library
    ("orchestrator.runtime", 1),
    ("orchestrator.runtime.checkpoint", 1),           # the manager, and the checkpoint's public face
    ("orchestrator.runtime.checkpoint_sharded", 1),   # FSDP model + optimizer through torch.distributed.checkpoint
    ("orchestrator.runtime.ckpt_format", 1),          # names, marker, digests, discovery: standard library only
    ("orchestrator.runtime.ckpt_io", 1),              # durable writes, ENOSPC, RNG, the root lock, retention
    ("orchestrator.runtime.ckpt_read", 1),            # which checkpoint a restore takes, and reading it
    ("orchestrator.runtime.ckpt_tensors", 1),         # the one walk over nested tensors
    ("orchestrator.runtime.loader", 1),   # registered DataLoaders' iterators, rebuilt exactly on resume
    ("orchestrator.runtime.records", 1),  # dataclasses whose methods are shared: the dry run's types
]

# Import cycles found when the cycle check came (issue 21), each owned by another change: listed
# so that the check holds for everything else. A cycle that grows, or a new one, fails.
KNOWN_CYCLES: list[set[str]] = []   # none: a cycle found is split, never listed here


@functools.cache
def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), level)
    return None if best is None else best[1]


def imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every orchestrator module ``module`` imports, with the line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import layout` imports the module orchestrator.layout; `from .x import f`, x
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in modules() else target, node.lineno))
    known = modules()
    return [(name, line) for name, line in found if name in known]


def test_every_module_has_a_layer():
    missing = [m for m in modules() if layer(m) is None]
    assert not missing, f"add these modules to LAYERS: {missing}"


def test_imports_never_go_up_a_layer():
    upward = []
    for module, path in modules().items():
        mine = layer(module)
        for target, line in imports(module, path):
            theirs = layer(target)
            if theirs is not None and mine is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} (layer {mine}) imports "
                              f"{target} (layer {theirs})")
    assert not upward, "\n".join(upward)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, directly or around a longer loop: each strongly
    connected group of the import graph with more than one module (or a module importing
    itself), sorted. Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(group))
    return sorted(cycles)


def import_graph() -> dict[str, set[str]]:
    return {module: {target for target, _ in imports(module, path)} - {module}
            for module, path in modules().items()}


def test_no_import_cycles():
    """Within a layer too (the runtime is one layer): modules that import each other, even
    through a function-local import, are one module in two files, and the order they load in
    decides what works."""
    found = [c for c in import_cycles(import_graph()) if set(c) not in KNOWN_CYCLES]
    assert not found, "import cycles (make one side own what both need):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_check_sees_a_function_local_cycle_within_a_layer(tmp_path):
    """The check itself: a lazy import back from checkpoint_sharded to checkpoint, as there was
    once, makes the two runtime modules a cycle; a longer loop is found whole."""
    lazy = tmp_path / "checkpoint_sharded.py"
    lazy.write_text("def _hasher():\n"
                    "    from orchestrator.runtime.checkpoint import new_hasher\n"
                    "    return new_hasher()\n")
    graph = import_graph()
    graph["orchestrator.runtime.checkpoint_sharded"] = {
        t for t, _ in imports("orchestrator.runtime.checkpoint_sharded", lazy)}
    assert "orchestrator.runtime.checkpoint" in graph["orchestrator.runtime.checkpoint_sharded"]
    assert any({"orchestrator.runtime.checkpoint", "orchestrator.runtime.checkpoint_sharded"} <= set(c)
               for c in import_cycles(graph))
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_runtime_imports_only_itself_torch_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "orchestrator"}
    bad = []
    for module, path in modules().items():
        if layer(module) != 1:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # what a type checker alone reads (`if TYPE_CHECKING:`) never runs in the job
        type_only = {id(inner) for node in ast.walk(tree)
                     if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                     for stmt in node.body for inner in ast.walk(stmt)}
        for node in ast.walk(tree):
            names: list[str] = []
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top not in allowed or (top == "orchestrator" and not name.startswith("orchestrator.runtime")):
                    assert isinstance(node, (ast.Import, ast.ImportFrom))
                    bad.append(f"{module}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The walker itself: a relative import from a backend renderer up to the api is found."""
    path = tmp_path / "render.py"
    path.write_text("from ...api import load_job\n\ndef f():\n    from ... import supervisor\n")
    found = dict(imports("orchestrator.backends.docker.render", path))
    assert "orchestrator.api" in found and "orchestrator.supervisor" in found


def _backend_name_literals() -> list[str]:
    """String literals equal to a backend's name outside the backend packages and the registry:
    a string switch on a backend name (``if backend == "docker"``) shows up as one. (Inside a
    backend's package its own name is its identity, and a word like Docker's "local" volume
    driver is that backend's vocabulary.)"""
    out = []
    registry = ROOT / "backends" / "__init__.py"
    packages = [ROOT / "backends" / name for name in backends.names()]
    for name in backends.names():
        for path in sorted(ROOT.rglob("*.py")):
            if path == registry or any(pkg in path.parents for pkg in packages):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value == name:
                    out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {name!r}")
    return out


def test_no_backend_name_is_spelled_outside_its_package_and_the_registry():
    found = _backend_name_literals()
    assert not found, "ask the backend's capability flags or class instead:\n" + "\n".join(found)


def test_the_registry_is_the_only_list_of_backends():
    """The CLI's choice and dispatch come from the registry: every registered backend's class
    names itself, and the click option offers exactly the registry's names."""
    from orchestrator.commands._common import BACKEND_CHOICE

    assert list(BACKEND_CHOICE.choices) == backends.names()
    for name in backends.names():
        assert backends.backend_class(name).name == name


@pytest.mark.parametrize("name", backends.names())
def test_each_backend_is_a_package_with_its_rooms(name):
    package = ROOT / "backends" / name
    assert (package / "__init__.py").is_file() and (package / "render.py").is_file()
    assert (package / "engine.py").is_file() and (package / "classify.py").is_file()


def test_no_source_file_is_ignored_by_git():
    """A .gitignore pattern that swallows a package (a bare `build/` once hid orchestrator/imagebuild/)
    leaves a checkout that works here and a clone that cannot import: every file that ships must
    be visible to git."""
    import shutil
    import subprocess

    repo = ROOT.parent
    if shutil.which("git") is None or not (repo / ".git").exists():
        assert os.environ.get("CI") != "true", "CI runs in a git clone: git and .git must be there"
        pytest.skip("not a git checkout")
    paths = [str(p.relative_to(repo)) for top in ("orchestrator", "templates", "images", "manifests", "tests")
             for p in (repo / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    found = subprocess.run(["git", "check-ignore", "--stdin"], input="\n".join(paths), cwd=repo,
                           capture_output=True, text=True)
    assert found.stdout.strip() == "", f"ignored by git: {found.stdout.split()}"


def test_logs_and_run_queries_sit_below_the_api():
    """`wmctl logs` and the run queries need what a run is (orchestrator.runs), never the api
    that submits runs: the api<->logview circle of issue 21 stays broken."""
    for module in ("orchestrator.logview", "orchestrator.runs", "orchestrator.reconcile"):
        targets = {t for t, _ in imports(module, modules()[module])}
        assert "orchestrator.api" not in targets, module
        mine, api = layer(module), layer("orchestrator.api")
        assert mine is not None and api is not None and mine < api
