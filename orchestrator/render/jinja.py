"""The one Jinja environment wmctl renders with: sandboxed, strict, every value quoted."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from .safe import yaml_value


@functools.lru_cache(maxsize=4)
def environment(directory: str | None = None):
    from jinja2 import FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    from ..resources import templates_dir

    return SandboxedEnvironment(
        loader=FileSystemLoader(directory or str(templates_dir())),
        undefined=StrictUndefined,      # a typo in a template is an error, not an empty string
        autoescape=False,
        keep_trailing_newline=True,
        finalize=yaml_value,            # nothing reaches the output unquoted
    )


def render_yaml_template(name: str, context: dict[str, Any], directory: Path | None = None) -> str:
    return environment(str(directory) if directory else None).get_template(name).render(**context)


def render_objects(name: str, context: dict[str, Any], directory: Path | None = None) -> list[dict[str, Any]]:
    """Render a YAML template and parse it back: the caller checks the objects, not text."""
    import yaml

    text = render_yaml_template(name, context, directory)
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
