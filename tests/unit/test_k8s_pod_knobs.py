"""kubernetes.pod_annotations, extra_resources, host_network, capabilities and secret_env: what
they render, what they refuse (naming the field and the fix), and the QoS class the plan states."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from ruamel.yaml import YAML

from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.backends.kubernetes.render import render_kubernetes
from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext
from orchestrator.vendors import load_profile

from .helpers import full_spec

KNOBS = {"kubernetes.pod_annotations": {"sidecar.istio.io/inject": "false",
                                        "k8s.v1.cni.cncf.io/networks": "rdma-net@ib0"},
         "kubernetes.extra_resources": {"rdma/hca_shared_devices_a": "1", "hugepages-1Gi": "8Gi"},
         "kubernetes.host_network": True, "kubernetes.capabilities": ["IPC_LOCK", "CAP_IPC_LOCK", "SYS_NICE"],
         "kubernetes.secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"},
                                   "WANDB_API_KEY": {"secret": "wandb", "key": "api.key", "optional": True}}}


def _render(**overrides):
    plan = render_kubernetes(full_spec("cuda", **overrides), load_profile("cuda"), AttemptContext())
    job = next(o for o in plan.resources if o["kind"] == "Job")
    return plan, job["spec"]["template"]


def test_knobs_render_into_the_pod():
    plan, template = _render(**KNOBS)
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net@ib0"
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container["securityContext"] == {     # full.yaml's security_context, the capabilities added
        "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
        "seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"add": ["IPC_LOCK", "SYS_NICE"]}}
    for side in ("limits", "requests"):
        assert container["resources"][side]["rdma/hca_shared_devices_a"] == "1"
        assert container["resources"][side]["hugepages-1Gi"] == "8Gi"
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert any("IPC_LOCK" in n and "privileged" in n for n in plan.notes)
    assert any("host_network" in n for n in plan.notes)


def test_knob_strings_stay_strings_for_yaml_1_1_and_1_2_readers():
    """"false" and "1" are the user's strings: a reader that turns them into a bool or an int
    would give Istio a non-string annotation and the API server a number where it wants a string."""
    plan, _ = _render(**KNOBS)
    text = KubernetesBackend.document(plan, "yaml")
    for docs in (list(yaml.safe_load_all(text)), list(YAML(typ="safe").load_all(text))):
        job = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]
        assert job["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert job["spec"]["containers"][0]["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"


def test_unquoted_yaml_scalars_are_taken_as_written():
    plan, template = _render(**{"kubernetes.pod_annotations": {"sidecar.istio.io/inject": False},
                                "kubernetes.extra_resources": {"rdma/hca": 1}})
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert template["spec"]["containers"][0]["resources"]["limits"]["rdma/hca"] == "1"


def test_no_knobs_no_change():
    _, template = _render(**{"kubernetes.security_context": {}, "kubernetes.runtime_class": None})
    pod = template["spec"]
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod and "runtimeClassName" not in pod
    assert "securityContext" not in pod["containers"][0]


def test_security_context_and_runtime_class_at_their_defaults_leave_every_spec_hash_as_it_was():
    """A run submitted before the fields existed resumes with the same spec hash (the checkpoint
    marker's check): 82bd288c585f is full.yaml's hash before it set them."""
    unset: dict[str, object] = {"kubernetes.security_context": {}, "kubernetes.runtime_class": None}
    assert full_spec("cuda", **unset).spec_hash() == "82bd288c585f"
    assert full_spec("cuda").spec_hash() != "82bd288c585f"          # set, they count


def test_security_context_and_runtime_class_render_into_the_pod_and_a_vendor_may_name_the_runtime_class():
    sc = {"runAsUser": 1000, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
          "appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-train"}}
    _, template = _render(**{"kubernetes.security_context": sc, "kubernetes.capabilities": ["IPC_LOCK"],
                             "kubernetes.runtime_class": None})
    container = template["spec"]["containers"][0]
    assert container["securityContext"] == {**sc, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    assert "runtimeClassName" not in template["spec"]
    profile = load_profile("musa")
    vendor = dataclasses.replace(profile, kubernetes=dataclasses.replace(profile.kubernetes, runtime_class="mthreads"))
    spec = full_spec("musa", **{"kubernetes.runtime_class": None})
    job = next(o for o in render_kubernetes(spec, vendor, AttemptContext()).resources if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["runtimeClassName"] == "mthreads"
    spec = full_spec("musa", **{"kubernetes.runtime_class": "kata"})       # the spec's own wins
    job = next(o for o in render_kubernetes(spec, vendor, AttemptContext()).resources if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["runtimeClassName"] == "kata"


@pytest.mark.parametrize("overrides,field,words", [
    ({"kubernetes.pod_annotations": {"bad key!": "x"}}, "kubernetes.pod_annotations.bad key!", "annotation key"),
    ({"kubernetes.pod_annotations": {"wmctl.io/spec-hash": "x"}}, "kubernetes.pod_annotations.wmctl.io/spec-hash",
     "wmctl's own"),
    ({"kubernetes.extra_resources": {"memory": "8Gi"}}, "kubernetes.extra_resources.memory", "resources.memory"),
    ({"kubernetes.extra_resources": {"nvidia.com/gpu": "8"}}, "kubernetes.extra_resources.nvidia.com/gpu",
     "accelerators_per_node"),
    ({"kubernetes.extra_resources": {"rdma": "1"}}, "kubernetes.extra_resources.rdma", "has a domain"),
    ({"kubernetes.extra_resources": {"rdma/hca": "1.5"}}, "kubernetes.extra_resources.rdma/hca", "whole units"),
    ({"kubernetes.extra_resources": {"hugepages-2Mi": "lots"}}, "kubernetes.extra_resources.hugepages-2Mi",
     "not a quantity"),
    ({"kubernetes.extra_resources": {"hugepages-2Mi": "1Gi"}, "resources.cpu": None, "resources.memory": None},
     "kubernetes.extra_resources", "hugepages need resources.memory"),
    ({"kubernetes.capabilities": ["ipc lock"]}, "kubernetes.capabilities[0]", "capability"),
    ({"kubernetes.secret_env": {"1BAD": {"secret": "hf", "key": "t"}}}, "kubernetes.secret_env.1BAD", "variable"),
    ({"kubernetes.secret_env": {"T": {"secret": "Not_A_Name", "key": "t"}}}, "kubernetes.secret_env.T.secret",
     "Secret name"),
    ({"kubernetes.secret_env": {"T": {"secret": "hf", "key": "a/b"}}}, "kubernetes.secret_env.T.key", "Secret key"),
    ({"kubernetes.secret_env": {"NCCL_DEBUG": {"secret": "hf", "key": "t"}}}, "kubernetes.secret_env.NCCL_DEBUG",
     "env.NCCL_DEBUG"),
    ({"kubernetes.runtime_class": "Kata_GPU"}, "kubernetes.runtime_class", "RuntimeClass name"),
    ({"kubernetes.security_context": {"runAsUsr": 1000}}, "kubernetes.security_context.runAsUsr", "runAsUser"),
    ({"kubernetes.security_context": {"runAsUser": -1}}, "kubernetes.security_context.runAsUser", "user or group id"),
    ({"kubernetes.security_context": {"runAsNonRoot": "yes"}}, "kubernetes.security_context.runAsNonRoot",
     "true or false"),
    ({"kubernetes.security_context": {"capabilities": {"add": ["NET_ADMIN"]}}},
     "kubernetes.security_context.capabilities.add", "kubernetes.capabilities"),
    ({"kubernetes.security_context": {"seccompProfile": {"type": "Localhost"}}},
     "kubernetes.security_context.seccompProfile.localhostProfile", "Localhost"),
    ({"kubernetes.security_context": {"seccompProfile": {"type": "runtime/default"}}},
     "kubernetes.security_context.seccompProfile", "RuntimeDefault"),
    ({"kubernetes.security_context": {"privileged": True, "allowPrivilegeEscalation": False}},
     "kubernetes.security_context", "refused by the API server"),
    ({"kubernetes.security_context": {"runAsNonRoot": True, "runAsUser": 0}}, "kubernetes.security_context",
     "never starts"),
])
def test_bad_knobs_name_the_field_and_the_fix(overrides, field, words):
    spec = full_spec("cuda", **overrides)
    with pytest.raises(SpecError) as err:
        render_kubernetes(spec, load_profile("cuda"), AttemptContext())
    assert any(f == field and words in msg for f, msg in err.value.problems), err.value.problems


@pytest.mark.parametrize("cpu,memory,qos", [("4", "64Gi", "Guaranteed"), ("4", None, "Burstable"),
                                            (None, None, "BestEffort")])
def test_the_plan_states_the_pods_qos_class(cpu, memory, qos):
    plan, _ = _render(**{"resources.cpu": cpu, "resources.memory": memory})
    assert [n for n in plan.notes if n.startswith("pod QoS class: ")][0].startswith(f"pod QoS class: {qos}")


def test_the_plan_says_c10d_ranks_follow_sorted_host_names_from_eleven_nodes():
    many, _ = _render(nodes=12)
    few, _ = _render(nodes=2)
    assert any("worldmodel-a0-10 ranks before worldmodel-a0-2" in n for n in many.notes)
    assert not any("PET_NODE_RANK" in n for n in few.notes)


@pytest.mark.parametrize("index, is_host", [("0", "true"), ("1", "false"), ("12", "false")])
def test_host_network_pods_host_the_store_by_index_not_by_name(tmp_path, index, is_host):
    """hostNetwork pods get their node's /etc/hosts (kubelet_pods.go ensureHostsFile), so pod 0
    cannot recognise the endpoint's FQDN as its own and no agent would host the c10d store: the
    rendered command, run by a real /bin/sh with PET_NODE_RANK as the downward API sets it, gives
    torchrun is_host by the completion index, and leaves the user's own words (a `--rdzv-conf=`
    after `--`, quotes, `$(...)`) exactly as written."""
    import json
    import os
    import subprocess

    user = ["python", "train.py", "--rdzv-conf=mine", "it's $(rm -rf /) `x` *", "--"]
    _, template = _render(**{"kubernetes.host_network": True, "command": user})
    container = template["spec"]["containers"][0]
    from .test_injection import kubelet_expand

    # what the container gets: the kubelet's $(VAR) expansion of the manifest's words
    argv = [kubelet_expand(a, {}) for a in container["command"] + container.get("args", [])]
    probe = tmp_path / "torchrun"
    probe.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    probe.chmod(0o755)
    argv = [str(probe) if a == "torchrun" else a for a in argv]
    out = subprocess.run(argv, env={**os.environ, "PET_NODE_RANK": index}, capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out)
    conf = [a for a in got if a.startswith("--rdzv-conf=")]
    assert conf[0].endswith(f",is_host={is_host}") and conf[1:] == ["--rdzv-conf=mine"]
    assert got[got.index("--") + 1:][-len(user):] == user


def test_without_host_network_the_command_is_torchrun_itself():
    _, template = _render()
    assert template["spec"]["containers"][0]["command"][0] != "/bin/sh"
