"""orchestrator.names: each check is exactly the regular expression it replaced, on generated
strings drawn from the characters that matter to it (and a few that never belong)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import names

ALPHABET = "abcz09AZ-_./:[]\n é"
TEXT = st.text(alphabet=ALPHABET, max_size=70) | st.sampled_from([
    "a", "a-", "-a", "a.b", "a..b", ".a", "a.", "a/b", "/a", "a/", "example.com/x", "x" * 63, "x" * 64,
    "10.0.0.5", "[::1]", "[]", "[", ".", "fe80::1", "nfs.example.com.", "a" * 64 + ".com", "MY_TOKEN", "KEY",
    "AWS_SECRET_ACCESS_KEY", "api_key", "CREDENTIAL", "X_CREDENTIALS_Y", "TOKENS", "MY_TOKEN\n", "_KEY"])

CASES = [
    (names.is_rfc1035_label, r"^[a-z]([-a-z0-9]*[a-z0-9])?$"),
    (names.is_rfc1123_label, r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
    (names.is_dns_subdomain_form, r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"),
    (names.is_object_name, r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"),
    (names.is_label_value, r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"),
    (names.is_label_key, r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                         r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"),
    (names.is_env_name, r"^[A-Za-z_][A-Za-z0-9_]*$"),
    (names.is_host_or_address, r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                               r"[A-Za-z0-9])?)*\.?|[0-9A-Fa-f:.]+|\[[0-9A-Fa-f:.]+\])$"),
]


@settings(max_examples=1500, deadline=None)
@given(TEXT)
def test_each_name_check_is_its_pattern(text):
    for check, pattern in CASES:
        assert check(text) == bool(re.fullmatch(pattern, text)), (check.__name__, text)
    assert names.is_dns_subdomain(text) == (len(text) <= 253 and names.is_dns_subdomain_form(text))


SECRET = r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)($|_)|_KEY$"


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet="AEKNOTYSCRDIPLWab_\n", max_size=30) | TEXT.filter(str.isascii))
def test_secret_names_are_found_as_the_pattern_finds_them(name):
    assert names.looks_like_secret(name) == bool(re.search(SECRET, name)), name


def test_a_few_names_by_hand():
    assert names.looks_like_secret("AWS_SECRET_ACCESS_KEY") and names.looks_like_secret("hf_token")
    assert not names.looks_like_secret("TOKENIZERS_PARALLELISM") and not names.looks_like_secret("KEY")
    assert names.is_label_key("example.com/x") and not names.is_label_key("Example.com/x")
    assert names.is_host_or_address("[fe80::1]") and not names.is_host_or_address("nfs,rw")
