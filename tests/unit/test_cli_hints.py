"""Every error hint names only flags and commands that exist, and never a file of this repository.

The hints are read from the source (every ``hint=`` argument, every ``hint`` variable and every
``*_HINT`` constant, f-string holes read as a placeholder), and checked against the real Click
command tree: a hint that says ``--kubeconfig`` while no command takes it fails here. A ``kubectl``
line in a hint is split with shlex and checked against kubectl's own verbs and flags."""

from __future__ import annotations

import ast
import functools
import re
import shlex
from pathlib import Path

import click
import pytest

from orchestrator.cli import COMMANDS, cli

SRC = Path(__file__).resolve().parents[2] / "orchestrator"
HOLE = "X"      # what an f-string's {...} reads as

# kubectl's verbs and the flags wmctl's hints use with them (kubectl --help, kubectl delete --help)
KUBECTL_VERBS = {"get", "describe", "delete", "logs", "apply", "config", "auth"}
KUBECTL_FLAGS = {"-n", "--namespace", "--context", "--kubeconfig", "--cascade", "--grace-period", "--force",
                 "-o", "--output", "-l", "--selector"}
KUBECTL_CONFIG = {"get-contexts", "current-context", "use-context", "view"}
# a hint may point at the user's files, never at a file of this repository
REPO_PATHS = re.compile(r"(?<![\w/{])(?:manifests|tests|bench|examples|scripts|tools|\.ci|orchestrator)/|"
                        r"\b[\w-]+\.py\b|python3? -m orchestrator")


def _text(node: ast.AST, consts: dict[str, str]) -> list[str]:
    """The strings an expression can be (both arms of a conditional), holes as HOLE."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out = [""]
        for part in node.values:
            pieces = _text(part, consts) if isinstance(part, ast.Constant) else [HOLE]
            out = [o + p for o in out for p in pieces]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _text(node.left, consts) for b in _text(node.right, consts)]
    if isinstance(node, ast.IfExp):
        return _text(node.body, consts) + _text(node.orelse, consts)
    if isinstance(node, ast.BoolOp):
        return [t for v in node.values for t in _text(v, consts)]
    if isinstance(node, ast.Name) and node.id in consts:
        return [consts[node.id]]
    if isinstance(node, ast.Attribute) and node.attr in consts:
        return [consts[node.attr]]
    return []


@functools.lru_cache(maxsize=1)
def hints() -> list[tuple[str, str]]:
    """(where, text) of every hint in orchestrator/."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}
    consts: dict[str, str] = {}
    node: ast.AST
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                texts = _text(node.value, {})
                if len(texts) == 1:
                    consts[node.targets[0].id] = texts[0]
    out = []
    for path, tree in trees.items():
        where = str(path.relative_to(SRC.parent))
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.Call):
                values = [k.value for k in node.keywords if k.arg == "hint"]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and (t.id == "hint" or t.id.endswith("HINT")) for t in targets):
                    values = [node.value] if node.value is not None else []
            for value in values:
                assert isinstance(node, (ast.Call, ast.Assign, ast.AnnAssign))
                out += [(f"{where}:{node.lineno}", t) for t in _text(value, consts)]
    return out


def options_of(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


@functools.lru_cache(maxsize=1)
def tree() -> dict[str, set[str]]:
    ctx = click.Context(cli)
    return {name: options_of(cli.get_command(ctx, name)) for name in COMMANDS}


# A command in a hint is quoted (`wmctl status RUN`, (wmctl render)) or follows a colon ("stop
# it: wmctl cancel RUN"); prose ("the same wmctl version") is not one. Its flags are the rest of
# that quote or clause.
MENTION = re.compile(r"(?:[`(]|:\s+)wmctl ([a-z][a-z-]*)([^`();]*)")
OTHER_TOOL = re.compile(r"\b(?:kubectl|docker|pip|git|python3?|torchrun) [^`();]*")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def test_the_scan_finds_the_hints():
    found = hints()
    assert len(found) > 50
    assert any("--replace replaces it" in t for _, t in found)     # an f-string hint, holes read


@pytest.mark.parametrize("where,text", hints())
def test_hint_names_only_real_commands_and_flags(where, text):
    commands = tree()
    every = set().union(*commands.values()) | options_of(cli)
    rest = OTHER_TOOL.sub(" ", text)           # another tool's flags: kubectl's are checked below
    for m in MENTION.finditer(rest):
        name = m.group(1)
        assert name in commands, f"{where}: hint names `wmctl {name}`, no such command: {text}"
        for flag in FLAG.findall(m.group(2)):
            assert flag in commands[name] | options_of(cli), \
                f"{where}: hint names `wmctl {name} ... {flag}`, which {name} does not take: {text}"
    for flag in FLAG.findall(MENTION.sub(" ", rest)):
        assert flag in every, f"{where}: hint names {flag}, which no wmctl command takes: {text}"


@pytest.mark.parametrize("where,text", hints())
def test_hint_never_points_at_a_file_of_this_repository(where, text):
    assert not REPO_PATHS.search(text), f"{where}: an installed wmctl has no such file: {text}"


def kubectl_lines(text: str) -> list[str]:
    return [m.group(0).rstrip(" .;,") for m in re.finditer(r"kubectl [^`();]+", text)]


@pytest.mark.parametrize("where,text", [(w, t) for w, t in hints() if "kubectl " in t])
def test_printed_kubectl_lines_parse_as_kubectl(where, text):
    for line in kubectl_lines(text):
        argv = shlex.split(line)
        assert argv[0] == "kubectl"
        words = [a for i, a in enumerate(argv[1:], 1)
                 if not a.startswith("-") and argv[i - 1] not in ("-n", "--namespace")]
        assert words and words[0] in KUBECTL_VERBS, f"{where}: {line!r}: not a kubectl verb"
        if words[0] == "config":
            assert words[1] in KUBECTL_CONFIG, f"{where}: {line!r}"
        for arg in argv[1:]:
            if arg.startswith("-"):
                assert arg.split("=", 1)[0] in KUBECTL_FLAGS, f"{where}: {line!r}: kubectl has no {arg}"
        if "-n" in argv:
            assert argv.index("-n") + 1 < len(argv), f"{where}: {line!r}: -n without a namespace"


def test_the_checks_catch_a_bad_hint():
    """The checks fail on the hints they exist for: a flag no command takes, a repo script."""
    commands = tree()
    assert "--kubeconfig" in commands["submit"] and "--context" in commands["submit"]
    assert "--no-such-flag" not in set().union(*commands.values())
    assert REPO_PATHS.search("run bench/device_resume_check.py") and REPO_PATHS.search("see manifests/rbac.yaml")
    assert not REPO_PATHS.search("fill it with `wmctl wheelhouse SPEC --dir DIR`")


def test_the_human_output_format_has_one_name_everywhere():
    ctx = click.Context(cli)
    for name in COMMANDS:
        for p in cli.get_command(ctx, name).params:
            if "--output" in p.opts and isinstance(p.type, click.Choice):
                assert "text" not in p.type.choices, f"wmctl {name} -o: the human format is called table"


def test_kubeconfig_goes_wherever_context_does():
    for name, opts in tree().items():
        if "--context" in opts:
            assert "--kubeconfig" in opts, f"wmctl {name} takes --context but not --kubeconfig"


def test_a_missing_kubeconfig_is_refused_naming_the_flag(tmp_path, capsys):
    from orchestrator.cli import main

    spec = Path(__file__).parent / "data" / "tiny.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["submit", str(spec), "-b", "kubernetes", "--image", "r/x:1", "--kubeconfig", str(tmp_path / "nope"),
              "--dry-run"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--kubeconfig: no such file" in err and "Traceback" not in err
