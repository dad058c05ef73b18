"""Where the shipped data files (templates, vendor profiles, manifests) live.

An installed wheel carries them under ``orchestrator/_data``; a source checkout (or an
editable install) keeps them at the repository's top level, as the product card fixes.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the folder ``name`` (``templates``, ``images`` or ``manifests``)."""
    installed = _PACKAGE_DIR / "_data" / name
    if installed.is_dir():
        return installed
    source = _PACKAGE_DIR.parent / name
    if source.is_dir():
        return source
    raise FileNotFoundError(f"wmctl data folder {name!r} not found (looked in {installed} and {source})")


def templates_dir() -> Path:
    return data_dir("templates")


def images_dir() -> Path:
    return data_dir("images")


def manifests_dir() -> Path:
    return data_dir("manifests")


def rbac_manifest() -> str:
    """The watcher's RBAC manifest as installed with wmctl (a path on this machine, not in a
    checkout), for hints that tell a user what to grant."""
    try:
        return str(manifests_dir() / "rbac-watcher.yaml")
    except FileNotFoundError:
        return "the watcher Role in wmctl's docs/kubernetes.md (permissions)"
