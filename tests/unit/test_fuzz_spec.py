"""Property-based fuzz of the spec loader: no input produces a traceback; every rejection names a field."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec import JobSpec, parse_spec

from .helpers import spec_from

FIELDS = ["name", "command", "image", "nodes", "accelerators_per_node", "nproc_per_node", "resources",
          "volumes", "env", "affinity", "checkpoint", "restart", "kubernetes", "docker", "workdir"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(FIELDS + ["pvc", "mount", "cpu", "shm",
                                                                                    "vendor", "tag", "dir"]),
                                                          st.text(max_size=8)), inner, max_size=4)), max_leaves=12)
specs = st.dictionaries(st.sampled_from(FIELDS + ["bogus"]), values, max_size=8)


def _check(build):
    try:
        spec = build()
    except SpecError as err:
        assert err.problems, "a rejection must list problems"
        for path, message in err.problems:
            assert isinstance(path, str) and path, "every problem names a field"
            assert isinstance(message, str) and message
        return
    assert isinstance(spec, JobSpec)
    spec.spec_hash()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_random_mappings_never_traceback(data):
    _check(lambda: spec_from(data))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text_never_tracebacks(text):
    _check(lambda: parse_spec(text))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["cpu", "memory", "shm"]), values, max_size=3),
       st.lists(st.dictionaries(st.sampled_from(["name", "mount", "pvc", "host_path", "nfs", "empty_dir",
                                                 "read_only", "secret"]), values, max_size=4), max_size=3))
def test_resources_and_volumes_never_traceback(resources, volumes):
    _check(lambda: spec_from({"name": "x", "command": ["a"], "resources": resources, "volumes": volumes}))
