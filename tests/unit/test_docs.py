"""The README and docs/ stay true to the code they describe.

- Every ``wmctl ...`` command shown (in a code block or an inline code span) names commands and
  flags the real Click tree has, and choices it offers; a concrete line of a code block (no
  ``[...]``, ``a|b`` or ``...`` synopsis) is parsed in full by Click's parser (``make_context``)
  without running the command. An inline span is a mention (`wmctl plot -o FILE`), often
  without the run or spec argument, so its command, flags and choices are checked, not arity.
- Every YAML block that is a job spec loads with the real spec loader.
- The spec reference (docs/spec.md) documents every spec field, and only fields that exist.
- Every relative link between the pages (and to files of the repository) leads somewhere: the
  file exists and, with a ``#fragment``, the page has that heading.
- The example specs render for the backends they say they serve; Kubernetes objects are valid
  against the official schemas (strict), as tests/unit/test_k8s_schema.py checks the goldens.

Nothing here reaches an engine or a cluster.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import types
import typing
from pathlib import Path

import click
import kubernetes_validate
import pytest
import yaml

from orchestrator.cli import cli, main
from orchestrator.spec import JobSpec
from orchestrator.specload import load_spec

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = REPO / "examples"
K8S_VERSIONS = ["1.30", "1.34", "1.37"]
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_FENCES = {"", "bash", "sh", "shell", "console", "text"}
SEPARATORS = {"&&", "||", ";", "|"}
SYNOPSIS = re.compile(r"[\[\]]|\.\.\.|\w\|\w|^<|>$")


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block of a Markdown text."""
    out: list[tuple[str, list[str]]] = []
    lang: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if m and lang is None:
            lang, lines = m.group(1), []
        elif line.strip() == "```" and lang is not None:
            out.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return out


def _prose(text: str) -> str:
    """The text outside fenced blocks."""
    keep, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            keep.append(line)
    return "\n".join(keep)


def _segments(line: str) -> list[list[str]]:
    """Shell words of a line cut at `&&`, `;` and pipes outside a synopsis's [...]."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:       # an unbalanced quote in a log excerpt: not a command line
        return []
    segments, depth = [], 0
    current: list[str] = []
    for word in words:
        if word in SEPARATORS and depth == 0:
            segments.append(current)
            current = []
            continue
        depth += word.count("[") - word.count("]")
        current.append(word)
    return [*segments, current]


def shown_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv after `wmctl`, whether it is a whole command line) of every wmctl command the
    docs show: lines of code blocks are whole, inline spans are mentions."""
    found: list[tuple[str, list[str], bool]] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        where = str(doc.relative_to(REPO))
        for lang, lines in _blocks(text):
            if lang not in SHELL_FENCES:
                continue
            joined = "\n".join(lines).replace("\\\n", " ")
            for line in joined.splitlines():
                line = re.sub(r"^\s*\$ ", "", line)
                for seg in _segments(line):
                    if seg and Path(seg[0]).name == "wmctl":
                        found.append((where, seg[1:], True))
        for span in re.findall(r"`(wmctl [^`]+)`", _prose(text).replace("\n", " ")):
            for seg in _segments(span):
                if seg and seg[0] == "wmctl" and seg[1:] != ["..."]:
                    found.append((where, seg[1:], False))
    return found


def _resolve(argv: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The command an argv names (walking groups), the path to it and the rest of the argv."""
    command: click.Command = cli
    path: list[str] = []
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].lstrip("[").startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        assert sub is not None, f"`wmctl {' '.join(path + rest[:1])}`: no such command"
        command, path, rest = sub, [*path, rest[0]], rest[1:]
    return command, path, rest


def _options(command: click.Command) -> dict[str, click.Parameter]:
    ctx = click.Context(command)
    params = [*command.get_params(ctx)]
    return {name: p for p in params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def check_command(argv: list[str], whole: bool = True) -> None:
    """Raise AssertionError (or click's UsageError) when argv is not a command line of this CLI."""
    alternatives = argv[0].split("/") if argv and "/" in argv[0] else [None]
    for alt in alternatives:     # `wmctl status/list/logs`: each one
        args = argv if alt is None else [alt, *argv[1:]]
        command, path, rest = _resolve(args)
        # a group runs by itself only where it says so (`wmctl nodes`, `wmctl nodes forgive NODE`)
        assert not isinstance(command, click.Group) or command.invoke_without_command, \
            f"`wmctl {' '.join(args)}` names no command"
        options = _options(command)
        where = f"`wmctl {' '.join(args)}`"
        for i, word in enumerate(rest):
            bare = word.strip("[]")
            if not bare.startswith("-") or bare == "-" or re.fullmatch(r"-\d.*", bare):
                continue
            name = bare.split("=", 1)[0]
            assert name in options, f"{where}: `wmctl {' '.join(path)}` has no option {name}"
            option = options[name]
            value = bare.split("=", 1)[1] if "=" in bare else (rest[i + 1].strip("[]") if i + 1 < len(rest) else "")
            assert isinstance(option, click.Option), name
            if isinstance(option.type, click.Choice) and not option.is_flag and value and not value.isupper():
                for choice in value.split("|"):       # `-o table|json|yaml`: each one
                    assert choice in option.type.choices, f"{where}: {name} takes no {choice!r}"
        if whole and not any(SYNOPSIS.search(word) for word in rest):
            try:
                command.make_context(f"wmctl {' '.join(path)}", list(rest), parent=click.Context(cli))
            except click.exceptions.Exit:       # --help, --version: a valid line
                pass
            except click.UsageError as exc:
                raise AssertionError(f"{where}: {exc.format_message()}") from exc


def test_the_docs_show_commands():
    commands = shown_commands()
    assert len(commands) > 60, commands     # the collector works: the pages show many
    assert ("README.md", ["render", "examples/worldmodel/cluster.yaml", "-b", "kubernetes"], True) in commands
    assert sum(whole for _, _, whole in commands) > 20


def _id(value: object) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


@pytest.mark.parametrize("where,argv,whole", shown_commands(), ids=_id)
def test_every_shown_command_parses_with_the_cli(where, argv, whole):
    check_command(argv, whole)


@pytest.mark.parametrize("argv,problem", [
    (["submit", "job.yaml", "--no-such-flag"], "has no option --no-such-flag"),
    (["logs", "RUN", "[--nodes", "I]"], "has no option --nodes"),
    (["render", "job.yaml", "--backend", "kubernetes|lsf"], "takes no 'lsf'"),
    (["submit", "job.yaml", "-b", "lsf"], "lsf"),
    (["sumbit", "job.yaml"], "no such command"),
    (["cancel"], "Missing argument"),
    (["status/lst", "RUN"], "no such command"),
    (["list", "-o", "jsn"], "-o takes no 'jsn'"),
])
def test_a_command_the_cli_lacks_fails_the_check(argv, problem):
    with pytest.raises(AssertionError, match=re.escape(problem)):
        check_command(argv)


def test_a_mention_is_checked_for_flags_not_arity():
    check_command(["plot", "-o", "FILE"], whole=False)
    with pytest.raises(AssertionError, match="has no option --outptu"):
        check_command(["plot", "--outptu", "FILE"], whole=False)
    with pytest.raises(AssertionError, match="takes no 'jsn'"):
        check_command(["list", "-o", "jsn"], whole=False)


def test_a_page_showing_a_flag_that_does_not_exist_fails(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("Run it:\n\n```bash\nwmctl submit job.yaml --auto-resum\n```\n\nor `wmctl logs RUN --folow`.\n")
    monkeypatch.setattr(f"{__name__}.DOCS", [page])
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    shown = shown_commands()
    assert shown == [("page.md", ["submit", "job.yaml", "--auto-resum"], True),
                     ("page.md", ["logs", "RUN", "--folow"], False)]
    for _, argv, whole in shown:
        with pytest.raises(AssertionError, match="has no option"):
            check_command(argv, whole)


def spec_snippets() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, (lang, lines) in enumerate(_blocks(doc.read_text(encoding="utf-8"))):
            if lang != "yaml":
                continue
            text = "\n".join(lines) + "\n"
            data = yaml.safe_load(text)
            if isinstance(data, dict) and "command" in data:
                out.append((f"{doc.relative_to(REPO)}#{i}", text))
    return out


def test_the_docs_show_spec_snippets():
    where = [w for w, _ in spec_snippets()]
    assert any(w.startswith("README.md") for w in where) and any(w.startswith("docs/spec.md") for w in where)


@pytest.mark.parametrize("where,text", spec_snippets(), ids=lambda v: v if "\n" not in v else "")
def test_every_spec_snippet_loads_with_the_spec_loader(where, text, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    spec = load_spec(path, {})
    assert spec.name and spec.command, where


def _unwrap(tp: object) -> list[object]:
    """The member types of an Optional/Union, or the type itself."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _dataclass_of(tp: object) -> tuple[type | None, bool]:
    """(the dataclass a field holds, whether it is a list of them)."""
    for member in _unwrap(tp):
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            return member, False
        if typing.get_origin(member) is list:
            (item,) = typing.get_args(member)
            if isinstance(item, type) and dataclasses.is_dataclass(item):
                return item, True
    return None, False


def spec_fields(cls: type = JobSpec, prefix: str = "") -> set[str]:
    """Every field path of the spec types: `image.tag`, `volumes[].nfs.server`."""
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = f"{prefix}{f.name}"
        out.add(path)
        inner, is_list = _dataclass_of(hints[f.name])
        if inner is not None:
            out |= spec_fields(inner, f"{path}[]." if is_list else f"{path}.")
    return out


def documented_fields(data: object, cls: type = JobSpec, prefix: str = "") -> set[str]:
    """The field paths a reference block writes out, read against the spec types: a mapping is
    followed only where the spec has a dataclass (env, labels, ... are free-form maps)."""
    out: set[str] = set()
    if not isinstance(data, dict):
        return out
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        out.add(path)
        if key not in hints:
            continue
        inner, is_list = _dataclass_of(hints[key])
        if inner is None:
            continue
        items = value if is_list and isinstance(value, list) else [value]
        for item in items:
            out |= documented_fields(item, inner, f"{path}[]." if is_list else f"{path}.")
    return out


def reference() -> dict[str, object]:
    snippets = [t for w, t in spec_snippets() if w.startswith("docs/spec.md")]
    assert snippets, "docs/spec.md has no job spec reference block"
    data = yaml.safe_load(snippets[0])
    assert isinstance(data, dict)
    return data


def test_the_spec_reference_documents_only_fields_that_exist():
    extra = documented_fields(reference()) - spec_fields()
    assert not extra, f"docs/spec.md documents fields the spec types lack: {sorted(extra)}"


def test_every_spec_field_is_in_the_reference():
    missing = spec_fields() - documented_fields(reference())
    assert not missing, f"spec fields docs/spec.md does not document: {sorted(missing)}"


def test_the_field_check_sees_a_field_the_spec_lacks():
    doc = reference()
    doc["image"] = {**doc["image"], "tags": ["x"]}      # type: ignore[dict-item]
    assert "image.tags" in documented_fields(doc) - spec_fields()
    assert "volumes[].nfs.server" in spec_fields() and "kubernetes.secret_env" in spec_fields()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(page.read_text(encoding="utf-8")).splitlines()
            if line.startswith("#")}


def links() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text(encoding="utf-8"))):
            if not re.match(r"[a-z]+:", target):
                out.append((str(doc.relative_to(REPO)), target))
    return out


def test_the_pages_link_each_other():
    assert len(links()) > 20 and ("README.md", "docs/spec.md") in links()


@pytest.mark.parametrize("where,target", links())
def test_every_relative_link_leads_somewhere(where, target):
    file, _, fragment = target.partition("#")
    page = (REPO / where).parent / file if file else REPO / where
    assert page.exists(), f"{where} links to {target}: no such file"
    if fragment:
        assert fragment in anchors(page), f"{where} links to {target}: {page.name} has no such heading"


def test_a_link_to_a_missing_heading_fails():
    assert "exit-codes" in anchors(REPO / "README.md")
    assert "node-loss-seen-in-seconds-and-nodes-at-scale" in anchors(REPO / "docs" / "kubernetes.md")
    with pytest.raises(AssertionError, match="no such heading"):
        test_every_relative_link_leads_somewhere("README.md", "docs/spec.md#no-such-heading")


# --- the example specs ---------------------------------------------------------------------

ALL_BACKENDS = ("local", "docker", "kubernetes", "slurm")
# example -> the backends it renders for; job.yaml's checkpoint is a folder beside it (a
# relative host_path), which Kubernetes refuses by design: cluster.yaml is the one for clusters.
# On Slurm without a container that folder is one of the shared filesystem, as on this machine.
EXAMPLE_SPECS = {
    "worldmodel/cluster.yaml": ALL_BACKENDS,
    "worldmodel/job.yaml": ("local", "docker", "slurm"),
}


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_example_spec_is_listed():
    specs = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")
             if isinstance(yaml.safe_load(p.read_text(encoding="utf-8")), dict)
             and "command" in yaml.safe_load(p.read_text(encoding="utf-8"))}
    assert specs == set(EXAMPLE_SPECS)
    assert any(set(b) == set(ALL_BACKENDS) for b in EXAMPLE_SPECS.values())


@pytest.mark.parametrize("auto_resume", [False, True])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("example", list(EXAMPLE_SPECS))
def test_example_renders_for_its_backends(example, backend, auto_resume, capsys):
    args = ["render", str(EXAMPLES / example), "-b", backend] + (["--auto-resume"] if auto_resume else [])
    code, out, err = _cli(args, capsys)
    if backend not in EXAMPLE_SPECS[example]:
        assert code == 2 and "volumes[0].host_path" in err and "Traceback" not in err, err
        return
    assert code == 0, err
    if backend == "slurm":      # the sbatch script itself, which bash must parse
        import subprocess

        assert out.startswith("#!/bin/bash\n") and "# submitted as: sbatch --parsable" in out, out[:400]
        checked = subprocess.run(["bash", "-n"], input=out, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        return
    docs = [d for d in yaml.safe_load_all(out) if d]
    if backend != "kubernetes":
        assert docs[0]["backend"] == backend and docs[0]["run"] == "worldmodel"
        return
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    for obj in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    pod = docs[1]["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["wm-ckpt"] and docs[1]["metadata"]["namespace"] == "training"
