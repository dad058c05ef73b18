"""Emit any value so that YAML (and JSON) parse it back to exactly that value.

Every ``{{ ... }}`` in wmctl's templates goes through ``yaml_value`` (the Jinja environment's
``finalize``), so a user's string can never become YAML structure, whatever it contains.
"""

from __future__ import annotations

import json
from typing import Any


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
