"""serialize.needs_quotes is the pattern it replaced (YAML 1.2 core and JSON schema numbers,
booleans and null, plus go-yaml v2's forms), on generated strings."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.serialize import needs_quotes

NUMBER_LIKE = re.compile(
    r"""^(?:
        [-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?   # 1, 1.5, .5, 1e-4, 1_000
      | [-+]?0[xX][0-9a-fA-F_]+ | [-+]?0[oO][0-7_]+ | [-+]?0[bB][01_]+      # 0x1F, 0o17, 0b101
      | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)                           # .inf, .nan
      | ~ | null | Null | NULL | true | True | TRUE | false | False | FALSE
      | y | Y | n | N | yes | Yes | YES | no | No | NO | on | On | ON | off | Off | OFF   # go-yaml v2's bools
    )$""", re.VERBOSE)

SAMPLES = st.sampled_from(["", "\n", "1", "1.", ".5", "1e-4", "1E+5", "1_000", "0x1F", "0X", "0x", "-0o17", "0b102",
                           "+.inf", ".Inf", "-.nan", ".nan", "~", "yes", "On", "oN", "1\n", "true\n", "1.5.5",
                           "1e", "e5", "._", "+", "-", "1.e5", "0e1", "0b1e5", "8Gi", "v1", "nvidia.com/gpu"])


@settings(max_examples=3000, deadline=None)
@given(SAMPLES | st.text(alphabet="0123456789_.eExXoObB+-aAfFinNtTrRuUlLsSyY~\n ", max_size=12))
def test_needs_quotes_is_the_pattern(text):
    assert needs_quotes(text) == (text == "" or bool(NUMBER_LIKE.match(text))), text
