"""Property-based fuzz of the spec loader and the renderers: no input produces a traceback; every
rejection names a field; every spec the loader accepts renders on all three backends (or is
refused there with a SpecError, as the CLI would)."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.backends import names
from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext
from orchestrator.spec import JobSpec
from orchestrator.specload import parse_spec
from orchestrator.vendors import available_profiles, load_profile

from .helpers import check_backend, render_plan, spec_from

BACKENDS = names()

IMAGE = "registry.local/fuzz:1"   # the container backends run an image; a spec may name none
CPUS = list(range(8))             # a fixed host, so a result does not depend on this machine

FIELDS = ["name", "command", "image", "nodes", "accelerators_per_node", "nproc_per_node", "resources",
          "volumes", "env", "affinity", "checkpoint", "restart", "kubernetes", "docker", "workdir"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(FIELDS + ["pvc", "mount", "cpu", "shm",
                                                                                    "vendor", "tag", "dir"]),
                                                          st.text(max_size=8)), inner, max_size=4)), max_leaves=12)
specs = st.dictionaries(st.sampled_from(FIELDS + ["bogus"]), values, max_size=8)


def _assert_names_fields(err: SpecError) -> None:
    assert err.problems, "a rejection must list problems"
    for path, message in err.problems:
        assert isinstance(path, str) and path, "every problem names a field"
        assert isinstance(message, str) and message


def _check(build):
    try:
        spec = build()
    except SpecError as err:
        _assert_names_fields(err)
        return
    assert isinstance(spec, JobSpec)
    spec.spec_hash()
    _render_everywhere(spec)


def _render_everywhere(spec: JobSpec) -> None:
    """What `wmctl render` does per backend, with and without --auto-resume: any exception but
    SpecError is a bug (it would reach the user as a traceback)."""
    profile = load_profile(spec.image.vendor)
    for backend in BACKENDS:
        for resume in (False, True):
            try:
                check_backend(spec, backend, auto_resume=resume)
            except SpecError as err:
                _assert_names_fields(err)
            # The container backends run an image (--image gives one where the spec names none).
            runs = dataclasses.replace(spec, image=dataclasses.replace(spec.image, tag=spec.image.tag or IMAGE))
            runs.source_dir = spec.source_dir
            try:
                plan = render_plan(runs if backend != "local" else spec, profile, backend,
                                   AttemptContext(attempt=1, resume=resume, parent=0), cpus=CPUS)
            except SpecError as err:
                _assert_names_fields(err)
                continue
            assert plan.backend == backend and plan.resources


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


# Numbers are where accepted input used to crash a renderer: int(inf), int(nan), 10**23 nodes.
numbers = st.one_of(st.integers(-2**70, 2**70), st.integers(-3, 70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["1e400", "inf", "nan", "0.4s", "1e-9", "99999999999h", "1" * 40 + "Ei"]))
NUMERIC_PATHS = ["nodes", "accelerators_per_node", "nproc_per_node", "resources.cpu", "resources.memory",
                 "resources.shm", "checkpoint.every_steps", "checkpoint.keep", "restart.max_attempts",
                 "restart.backoff", "restart.node_loss_timeout", "restart.heartbeat_timeout",
                 "rendezvous.port", "rendezvous.join_timeout", "kubernetes.ttl_seconds_after_finished",
                 "kubernetes.termination_grace_period", "local.master_port"]


# 120 examples: each renders every backend (~0.1 s of CPU); 300 made this CI's costliest unit test
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(available_profiles()), st.dictionaries(st.sampled_from(NUMERIC_PATHS), numbers, max_size=5))
def test_numeric_fields_render_or_reject(vendor, fields):
    data: dict = {"name": "fz", "command": ["python", "t.py"], "image": {"vendor": vendor},
                  "checkpoint": {"dir": "/ckpt"},
                  "volumes": [{"name": "ckpt", "mount": "/ckpt", "host_path": "/mnt/ckpt"}]}
    for dotted, value in fields.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    _check(lambda: spec_from(data))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(["key", "operator", "value", "effect", "tolerationSeconds"]),
                                st.one_of(values, st.sampled_from(["Exists", "Equal", "NoExecute", "NoSchedule",
                                                                   "", "a", 30, 2**40])), max_size=5),
                max_size=3))
def test_tolerations_render_or_reject(tolerations):
    _check(lambda: spec_from({"name": "x", "command": ["a"], "kubernetes": {"tolerations": tolerations}}))
