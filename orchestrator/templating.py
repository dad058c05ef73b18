"""The one Jinja environment wmctl renders with: sandboxed, strict, every value quoted.

Every ``{{ ... }}`` in wmctl's templates goes through ``yaml_value`` (the environment's
``finalize``), so a user's string can never become YAML structure, whatever it contains.
"""

from __future__ import annotations

import functools
import json
import os
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
    # Outside strings JSON is ASCII, so escaping every unsafe character is escaping in strings.
    return "".join(_safe_char(c) for c in text)


# Compiled templates are kept between processes (as Python keeps .pyc files): compiling the
# Kubernetes templates is most of a dry run's own work. Jinja checks each entry against the
# template's source and its own version; the folder name covers this environment's settings
# (finalize changes the generated code), so bump it when they change.
BYTECODE_FOLDER = "jinja-yaml-v1"


def _bytecode_cache():
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
    folder = os.path.join(root, BYTECODE_FOLDER)
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


def render_yaml_template(name: str, context: dict[str, Any], directory: Path | None = None) -> str:
    return environment(str(directory) if directory else None).get_template(name).render(**context)


def render_objects(name: str, context: dict[str, Any], directory: Path | None = None) -> list[dict[str, Any]]:
    """Render a YAML template and parse it back: the caller checks the objects, not text."""
    import yaml

    text = render_yaml_template(name, context, directory)
    # libyaml's loader where PyYAML has it: the same documents, parsed several times faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc is not None]
