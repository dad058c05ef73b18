"""The Jinja environments wmctl renders with: sandboxed, strict, every value quoted.

Every ``{{ ... }}`` in wmctl's YAML templates goes through ``yaml_value`` (the environment's
``finalize``), so a user's string can never become YAML structure, whatever it contains. In its
shell templates (an sbatch script) every ``{{ ... }}`` goes through ``shell_word``: one shell word,
quoted, that bash reads back as exactly the value; only text the renderer built and checked itself
passes as it is (``Verbatim``).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
from pathlib import Path
from typing import Any

from .resources import templates_dir


def _safe_char(c: str) -> str:
    o = ord(c)
    # Printable in YAML's double-quoted style and not a YAML line break (NEL, LS, PS, BOM).
    if 0x20 <= o < 0x7F or (0xA0 <= o <= 0xD7FF and o not in (0x2028, 0x2029)) or \
            (0xE000 <= o <= 0xFFFD and o != 0xFEFF):
        return c
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def yaml_value(value: Any) -> str:
    """A YAML flow scalar/collection (valid JSON too, except for \\U escapes of astral chars)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=False, default=str)
    if text.isascii() and "\x7f" not in text:  # JSON escaped every other control character
        return text
    # Outside strings JSON is ASCII, so escaping every unsafe character is escaping in strings.
    return "".join(_safe_char(c) for c in text)


class Verbatim(str):
    """Text a renderer built from checked values (an ``#SBATCH`` line, a word holding a shell
    variable of its own): ``shell_word`` passes it as it is. Never made from a user's string alone."""


def shell_word(value: Any) -> str:
    """One shell word that bash reads back as exactly ``value`` (a list: the words, space-separated)."""
    if isinstance(value, Verbatim):
        return str(value)
    if isinstance(value, (list, tuple)):
        return " ".join(shell_word(v) for v in value)
    if isinstance(value, bool) or value is None:
        raise TypeError(f"a shell template was given {value!r}; pass the text it should hold")
    return shlex.quote(str(value))


# Compiled templates are kept between processes (as Python keeps .pyc files): compiling the
# Kubernetes templates is most of a dry run's own work. Jinja checks each entry against the
# template's source and its own version; the folder name covers this environment's settings
# (finalize changes the generated code), so bump it when they change.
BYTECODE_FOLDER = "jinja-yaml-v1"
SHELL_BYTECODE_FOLDER = "jinja-shell-v1"


def _bytecode_cache(name: str = BYTECODE_FOLDER):
    """A best-effort FileSystemBytecodeCache under wmctl's cache folder (``WMCTL_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/wmctl`` or ``~/.cache/wmctl``), or None when that folder cannot be
    made: a read-only home renders as before, only slower."""
    from jinja2 import FileSystemBytecodeCache

    class BestEffortCache(FileSystemBytecodeCache):
        def dump_bytecode(self, bucket) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:     # a full disk or a folder that went read-only: skip the entry
                pass

    root = os.environ.get("WMCTL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "wmctl")
    folder = os.path.join(root, name)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return BestEffortCache(folder)


@functools.lru_cache(maxsize=4)
def environment(directory: str | None = None):
    from jinja2 import FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(
        loader=FileSystemLoader(directory or str(templates_dir())),
        undefined=StrictUndefined,      # a typo in a template is an error, not an empty string
        autoescape=False,
        keep_trailing_newline=True,
        finalize=yaml_value,            # nothing reaches the output unquoted
        bytecode_cache=_bytecode_cache(),
    )


@functools.lru_cache(maxsize=4)
def shell_environment(directory: str | None = None):
    """The environment of shell templates: as ``environment``, every value a quoted shell word."""
    from jinja2 import FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(
        loader=FileSystemLoader(directory or str(templates_dir())),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        finalize=shell_word,            # nothing reaches the script unquoted
        bytecode_cache=_bytecode_cache(SHELL_BYTECODE_FOLDER),
    )


def render_shell_template(name: str, context: dict[str, Any], directory: Path | None = None) -> str:
    return shell_environment(str(directory) if directory else None).get_template(name).render(**context)


def render_yaml_template(name: str, context: dict[str, Any], directory: Path | None = None) -> str:
    return environment(str(directory) if directory else None).get_template(name).render(**context)


def render_objects(name: str, context: dict[str, Any], directory: Path | None = None) -> list[dict[str, Any]]:
    """Render a YAML template and parse it back: the caller checks the objects, not text."""
    import yaml

    text = render_yaml_template(name, context, directory)
    # libyaml's loader where PyYAML has it: the same documents, parsed several times faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc is not None]
