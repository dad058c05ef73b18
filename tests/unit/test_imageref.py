"""imageref's grammar checks are distribution/reference's patterns (regexp.go), written out: each
function against its pattern on generated strings."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import imageref

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[_.]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
PATTERNS = [
    (imageref.is_path_component, re.compile(rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*")),
    (imageref.is_domain,
     re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?")),
    (imageref.is_tag, re.compile(r"[\w][\w.-]{0,127}", re.ASCII)),
    (imageref.is_digest, re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")),
]
HEX32 = "0123456789abcdef" * 2
TEXT = st.text(alphabet="az09AF-_.:+[]/ é\n", max_size=40) | st.sampled_from([
    "a", "a.b", "a__b", "a___b", "a---b", "a.-b", "-a", "a-", "_a", "localhost:5000", "[::1]:80", "[::1]", "[]",
    "[::1]x", "a:", ":80", "registry.example.com", "my-registry", "-x.com", "x" * 128, "x" * 129, ".tag", "v1.0-rc",
    f"sha256:{HEX32}", f"sha256:{HEX32[:-1]}", f"a+b:{HEX32}", f"a++b:{HEX32}", f"a+:{HEX32}", f":{HEX32}",
    f"1a:{HEX32}", f"sha256:{HEX32}:", f"sha256:{HEX32}g"])


@settings(max_examples=3000, deadline=None)
@given(TEXT)
def test_each_grammar_check_is_its_pattern(text):
    for check, pattern in PATTERNS:
        assert check(text) == bool(pattern.fullmatch(text)), (check.__name__, text)


def _problem(ref: str) -> str:
    why = imageref.problem(ref)
    assert why is not None, ref
    return why


def test_references_still_read_as_before():
    assert imageref.problem("registry.example.com:5000/team/world_model__x:v3") is None
    assert imageref.problem(f"localhost/a@sha256:{'a' * 64}") is None
    assert "tag" in _problem("repo:.bad")
    assert "registry host" in _problem("bad_host.com/x")
    assert "lowercase" in _problem("team/World")
