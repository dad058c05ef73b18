"""Numbers at and past their limits: rejected at load naming the field, never a traceback later.

Every value here once loaded and then crashed a renderer (int(inf), int(nan), a list of 10**23
agents) or rendered a manifest the API server refuses (completions past int32).
"""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext
from .helpers import render_plan
from orchestrator.vendors import load_profile

from .helpers import spec_from

BASE = {"name": "wm", "command": ["python", "train.py"]}


def problems_of(data):
    with pytest.raises(SpecError) as err:
        spec_from({**BASE, **data})
    return dict(err.value.problems)


@pytest.mark.parametrize("data,path", [
    ({"resources": {"cpu": float("inf")}}, "resources.cpu"),
    ({"resources": {"cpu": float("-inf")}}, "resources.cpu"),
    ({"resources": {"cpu": float("nan")}}, "resources.cpu"),
    ({"resources": {"cpu": "nan"}}, "resources.cpu"),
    ({"resources": {"cpu": "1e400"}}, "resources.cpu"),
    ({"resources": {"cpu": 10**400}}, "resources.cpu"),
    ({"resources": {"cpu": 5000}}, "resources.cpu"),
    ({"resources": {"shm": float("inf")}}, "resources.shm"),
    ({"resources": {"memory": "1" * 400}}, "resources.memory"),
    ({"resources": {"memory": "9Ei"}}, "resources.memory"),
    ({"resources": {"memory": 2**63}}, "resources.memory"),
    ({"volumes": [{"name": "s", "mount": "/s", "empty_dir": {"size_limit": "1" * 400 + "Ei"}}]},
     "volumes[0].empty_dir.size_limit"),
    ({"nodes": 99999999999999999999999}, "nodes"),
    ({"nodes": 100_001}, "nodes"),
    ({"nodes": "²"}, "nodes"),
    ({"accelerators_per_node": 257}, "accelerators_per_node"),
    ({"nproc_per_node": 4097}, "nproc_per_node"),
    ({"checkpoint": {"every_steps": 2**31}}, "checkpoint.every_steps"),
    ({"checkpoint": {"keep": 2**31}}, "checkpoint.keep"),
    ({"restart": {"max_attempts": 10**6}}, "restart.max_attempts"),
    ({"restart": {"backoff": float("inf")}}, "restart.backoff"),
    ({"restart": {"node_loss_timeout": 10**30}}, "restart.node_loss_timeout"),
    ({"restart": {"heartbeat_timeout": "99999999999h"}}, "restart.heartbeat_timeout"),
    ({"rendezvous": {"join_timeout": "1" * 400}}, "rendezvous.join_timeout"),
    ({"kubernetes": {"termination_grace_period": 2**31}}, "kubernetes.termination_grace_period"),
    ({"kubernetes": {"termination_grace_period": "0.4s"}}, "kubernetes.termination_grace_period"),
    ({"kubernetes": {"termination_grace_period": 0}}, "kubernetes.termination_grace_period"),
    ({"kubernetes": {"ttl_seconds_after_finished": 2**31}}, "kubernetes.ttl_seconds_after_finished"),
    ({"local": {"master_port": 70000}}, "local.master_port"),
    ({"local": {"master_port": 0}}, "local.master_port"),
])
def test_out_of_range_numbers_are_rejected_naming_the_field(data, path):
    p = problems_of(data)
    assert path in p, p


@pytest.mark.parametrize("backend", ["kubernetes", "docker", "local"])
def test_largest_accepted_values_render(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = spec_from({**BASE, "image": {"vendor": "cuda", "tag": "r/x:1"}, "nodes": 4,
                      "accelerators_per_node": 256, "nproc_per_node": 4096,
                      "resources": {"cpu": 4096, "memory": 2**63 - 1, "shm": "7Ei"},
                      "checkpoint": {"every_steps": 2**31 - 1, "keep": 2**31 - 1},
                      "restart": {"max_attempts": 10_000, "node_loss_timeout": 2**31 - 1},
                      "kubernetes": {"ttl_seconds_after_finished": 2**31 - 1,
                                     "termination_grace_period": 2**31 - 1},
                      "local": {"master_port": 65535}})
    plan = render_plan(spec, load_profile("cuda"), backend, AttemptContext(),
                       cpus=None if backend == "kubernetes" else list(range(8)))
    assert plan.resources


def test_most_nodes_kubernetes_accepts_render_as_completions():
    spec = spec_from({**BASE, "image": {"tag": "r/x:1"}, "nodes": 100_000})
    job = next(o for o in render_plan(spec, load_profile("cpu"), "kubernetes").resources if o["kind"] == "Job")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 100_000
