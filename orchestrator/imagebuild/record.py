"""The build record ``.wmctl/images.json`` beside the spec: what was built and pushed, and the
digest a submit pins the image to."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import BuildError


RECORD_FILE = Path(".wmctl") / "images.json"


# ---- record -----------------------------------------------------------------------------------------------

# What a push adds to a record; it describes the pushed image, so it goes when the image does.
PUSH_FIELDS = ("repo_digest", "digest", "pushed_at")


def record_path(spec_path: Path) -> Path:
    return Path(spec_path).resolve().parent / RECORD_FILE


def load_records(spec_path: Path) -> dict[str, Any]:
    path = record_path(spec_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path} is not readable JSON ({exc}); delete it and build again") from None
    return data if isinstance(data, dict) else {}


def record_image(spec_path: Path, name: str, entry: dict[str, Any]) -> Path:
    """Merge ``entry`` into the record for job ``name`` (atomic write). A digest recorded by an
    earlier push survives only while the image id and the tag stay the same: after a rebuild
    without --push it would name other bytes than the tag now holds."""
    path = record_path(spec_path)
    data = load_records(spec_path)
    old = data.get(name)
    old = dict(old) if isinstance(old, dict) else {}
    if old.get("image_id") != entry.get("image_id") or old.get("tag") != entry.get("tag"):
        for key in PUSH_FIELDS:
            old.pop(key, None)
    data[name] = {**old, **entry}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def recorded_image(spec_path: Path, name: str) -> dict[str, Any] | None:
    """What build-image recorded for job ``name``: tag, content_tag, image_id, and after a push
    ``repo_digest`` (``registry/repo@sha256:...``), the reference ``submit`` should run."""
    entry = load_records(spec_path).get(name)
    return entry if isinstance(entry, dict) else None


def _with_tag(ref: str) -> str:
    return ref if ":" in ref.rsplit("/", 1)[-1] else ref + ":latest"


def pinned_ref(spec_path: Path, name: str, tag: str) -> str | None:
    """The pushed ``repo@sha256:...`` the build record holds for ``tag``, or None. Only a record
    made for this very tag (or its content tag) counts, and only a digest in the tag's own
    repository: a record for another tag or registry says nothing about what ``tag`` holds."""
    if "@" in tag:
        return None
    entry = recorded_image(spec_path, name) or {}
    ref = entry.get("repo_digest")
    if not isinstance(ref, str) or not re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", ref):
        return None
    wanted = _with_tag(tag)
    if wanted not in (entry.get("tag"), entry.get("content_tag")):
        return None
    if ref.split("@", 1)[0] != wanted.rsplit(":", 1)[0]:
        return None
    return ref


def image_ref_for_submit(spec_path: Path, name: str, tag: str) -> str:
    """The pushed digest reference for ``tag`` when one was recorded, else ``tag`` itself."""
    return pinned_ref(spec_path, name, tag) or tag
