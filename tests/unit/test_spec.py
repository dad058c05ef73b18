"""Job spec loading: defaults, overrides, and the cross-field checks that catch real mistakes."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.launch import nproc_per_node
from orchestrator.specload import apply_overrides, load_spec, parse_set_flags, parse_spec
from orchestrator.vendors import load_profile

from .helpers import DATA, check_backend, full_spec, spec_from

BASE = {"name": "wm", "command": ["python", "train.py"]}


def problems_of(data, **kw):
    with pytest.raises(SpecError) as err:
        spec_from({**BASE, **data}, **kw)
    return dict(err.value.problems)


def test_minimal_spec_gets_defaults():
    spec = load_spec(DATA / "tiny.yaml")
    assert spec.nodes == 1 and spec.image.vendor == "cpu" and spec.resources.shm_bytes == 16 * 2**30
    assert spec.restart.max_attempts == 3 and spec.checkpoint.every_steps == 200
    assert len(spec.spec_hash()) == 12


def test_nproc_defaults_from_vendor():
    cuda = full_spec("cuda", accelerators_per_node=None)
    assert nproc_per_node(cuda, load_profile("cuda")) == 8           # profile default: one rank per card
    four = full_spec("musa", accelerators_per_node=4)
    assert nproc_per_node(four, load_profile("musa")) == 4
    cpu = spec_from({**BASE, "resources": {"cpu": 6}})
    assert nproc_per_node(cpu, load_profile("cpu")) == 6
    assert nproc_per_node(spec_from(BASE), load_profile("cpu")) == 1
    explicit = spec_from({**BASE, "nproc_per_node": 3})
    assert nproc_per_node(explicit, load_profile("cpu")) == 3


def test_unknown_key_suggests_the_right_one():
    p = problems_of({"resources": {"shm_size": "1Gi"}, "checkpont": {}})
    assert "did you mean 'shm'" in p["resources.shm_size"]
    assert "did you mean 'checkpoint'" in p["checkpont"]


def test_shm_larger_than_memory_is_rejected():
    p = problems_of({"resources": {"memory": "8Gi", "shm": "16Gi"}})
    assert "counts toward the memory limit" in p["resources.shm"]


def test_tiny_shm_is_rejected():
    assert "64Mi" in problems_of({"resources": {"shm": "1Mi"}})["resources.shm"]


def test_bad_quantity_and_duration_name_their_field():
    p = problems_of({"resources": {"memory": "lots"}, "restart": {"backoff": "soon"}})
    assert "16Gi" in p["resources.memory"] and "30s" in p["restart.backoff"]


@pytest.mark.parametrize("text,size", [
    # whole numbers, read as int: exact at any length
    ("16Gi", 16 * 2**30), ("0016Gi", 16 * 2**30), ("9223372036854775807", 2**63 - 1), ("7Ei", 7 * 2**60),
    (" 64 M ", 64 * 10**6),
    # fractions, read as Decimal: exact where a float is not
    ("1.5Gi", 3 * 2**29), ("0.000000001Ei", 1152921504), ("1.000000000000000001Ei", 2**60 + 1),
    ("2.5", 2),
])
def test_sizes_are_read_exactly(text, size):
    from orchestrator.validate import parse_quantity

    assert parse_quantity(text) == size


@pytest.mark.parametrize("text", ["8Ei", "9223372036854775808", "9" * 40, "9" * 40 + ".5Ki"])
def test_sizes_past_int64_are_refused(text):
    assert "too large" in problems_of({"resources": {"memory": text, "shm": "64Mi"}})["resources.memory"]


@pytest.mark.parametrize("text,seconds", [
    # Go/Kubernetes forms, parsed by durationpy
    ("1m30s", 90.0), ("1h", 3600.0), ("250ms", 0.25), ("1h2m3.5s", 3723.5), ("+90s", 90.0), ("2h0m0s", 7200.0),
    ("500us", 0.0005),
    # what was accepted before stays accepted: seconds as a number or a bare string, one term with spaces
    (30, 30.0), (2.5, 2.5), ("30", 30.0), ("30s", 30.0), ("10m", 600.0), (" 30 s ", 30.0), ("1.5m", 90.0),
    ("0", 0.0),
])
def test_durations_accept_go_forms_and_todays(text, seconds):
    spec = spec_from({**BASE, "restart": {"backoff": text, "node_loss_timeout": text}})
    assert spec.restart.backoff_s == seconds and spec.restart.node_loss_timeout_s == seconds


@pytest.mark.parametrize("text", ["0s", "0", "500ms", 0.9])
def test_a_heartbeat_timeout_under_a_second_is_refused(text):
    # Every attempt would be a hang before its first step (it was accepted, and retried to the end).
    p = problems_of({"restart": {"heartbeat_timeout": text}})
    assert "at least 1s" in p["restart.heartbeat_timeout"]


@pytest.mark.parametrize("text", ["0s", "2s", 2.5, "-1s", "soon"])
def test_a_node_silence_timeout_under_three_seconds_or_garbled_is_refused(text):
    p = problems_of({"restart": {"node_silence_timeout": text}})
    assert "restart.node_silence_timeout" in p


@pytest.mark.parametrize("text", ["0s", "500ms", "soon"])
def test_an_image_pull_timeout_under_a_second_or_garbled_is_refused(text):
    assert "restart.image_pull_timeout" in problems_of({"restart": {"image_pull_timeout": text}})


def test_image_pull_timeout_defaults_to_30_minutes_and_leaves_the_hash_as_it_was_until_set():
    assert spec_from(BASE).restart.image_pull_timeout_s == 1800.0
    base = spec_from(BASE).spec_hash()
    assert spec_from({**BASE, "restart": {"image_pull_timeout": "30m"}}).spec_hash() == base
    assert spec_from({**BASE, "restart": {"image_pull_timeout": "1h"}}).spec_hash() != base


def test_node_silence_timeout_defaults_to_15_seconds():
    assert spec_from(BASE).restart.node_silence_timeout_s == 15.0
    assert spec_from({**BASE, "restart": {"node_silence_timeout": "1m"}}).restart.node_silence_timeout_s == 60.0


@pytest.mark.parametrize("text,says", [
    ("-1s", "cannot be negative"), ("-1m30s", "cannot be negative"), (-3, "cannot be negative"),
    ("", "write it like 30s, 1m30s"), ("1x", "unknown unit 'x'"), ("1d", "unknown unit 'd'"),
    ("1m30", "a number without its unit"), ("1.2.3s", "is not a duration"), ("soon", "is not a duration"),
    ("99999999999999h", "is too long"),
])
def test_bad_durations_name_their_field(text, says):
    p = problems_of({"restart": {"node_loss_timeout": text}, "rendezvous": {"join_timeout": text}})
    assert says in p["restart.node_loss_timeout"] and says in p["rendezvous.join_timeout"]


def test_name_too_long_with_attempt_suffix():
    p = problems_of({"name": "a" * 60, "restart": {"max_attempts": 10}, "nodes": 16})
    assert "shorten it to at most" in p["name"]


def test_two_volumes_on_one_mount_path():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data", "pvc": "x"},
                                 {"name": "b", "mount": "/data/", "host_path": "/mnt"}]})
    assert "two volumes on one mount path" in p["volumes[1].mount"]


def test_volume_needs_exactly_one_source():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data", "pvc": "x", "host_path": "/y"},
                                 {"name": "b", "mount": "/b"}]})
    assert "exactly one source" in p["volumes[0]"] and "none" in p["volumes[1]"]


def test_auto_resume_needs_checkpoint_on_persistent_volume():
    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/ckpt"},
                      "volumes": [{"name": "scratch", "mount": "/ckpt", "empty_dir": {}}]})
    with pytest.raises(SpecError) as err:
        check_backend(spec, "kubernetes", auto_resume=True)
    assert "lost with the container" in dict(err.value.problems)["checkpoint.dir"]
    check_backend(spec, "kubernetes", auto_resume=False)      # fine without auto-resume
    check_backend(spec, "local", auto_resume=True)            # local disk persists
    ok = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/ckpt/run1"},
                    "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}]})
    check_backend(ok, "kubernetes", auto_resume=True)


def test_checkpoint_dir_is_matched_to_volumes_as_the_container_resolves_it():
    """A relative dir is relative to the working directory, and '..' leaves the mount."""
    vols = [{"name": "ckpt", "mount": "/workspace/ckpt", "pvc": "wm-ckpt"}]
    relative = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "ckpt/run1"}, "volumes": vols})
    assert relative.container_checkpoint_dir() == "/workspace/ckpt/run1"
    check_backend(relative, "kubernetes", auto_resume=True)
    escaping = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/workspace/ckpt/../tmp"},
                          "volumes": vols})
    with pytest.raises(SpecError) as err:
        check_backend(escaping, "kubernetes", auto_resume=True)
    assert "(/workspace/tmp) is on no volume" in dict(err.value.problems)["checkpoint.dir"]


def test_fractional_grace_period_rounds_up_never_to_zero():
    from orchestrator.plan import AttemptContext
    from .helpers import render_plan

    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "kubernetes": {"termination_grace_period": "1.5s"}})
    plan = render_plan(spec, load_profile("cpu"), "kubernetes", AttemptContext())
    job = next(r for r in plan.resources if r["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 2


def test_image_required_for_container_backends():
    with pytest.raises(SpecError) as err:
        check_backend(spec_from(BASE), "docker", auto_resume=False)
    assert "image.tag" in dict(err.value.problems)


def test_secret_volume_rejected_on_docker():
    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "volumes": [{"name": "s", "mount": "/s", "secret": "x"}]})
    with pytest.raises(SpecError):
        check_backend(spec, "docker", auto_resume=False)


def test_unknown_vendor_suggests():
    p = problems_of({"image": {"vendor": "cudaa"}})
    assert "did you mean 'cuda'" in p["image.vendor"]


def test_explicit_affinity_map():
    spec = spec_from({**BASE, "affinity": {0: "0-15", 1: "16-31"}})
    assert spec.affinity == {0: "0-15", 1: "16-31"}
    p = problems_of({"affinity": {0: "zero"}})
    assert "affinity.0" in p
    p = problems_of({"affinity": "numaa"})
    assert "affinity" in p


def test_overrides_and_set_flags():
    flags = parse_set_flags(["nodes=4", "resources.shm=32Gi", "env.FOO=bar baz", "restart.auto_resume=true"])
    assert flags == {"nodes": 4, "resources.shm": "32Gi", "env.FOO": "bar baz", "restart.auto_resume": True}
    spec = load_spec(DATA / "tiny.yaml", flags)
    assert spec.nodes == 4 and spec.resources.shm == "32Gi" and spec.env["FOO"] == "bar baz"
    with pytest.raises(SpecError):
        parse_set_flags(["novalue"])
    with pytest.raises(SpecError):
        apply_overrides({"nodes": 2}, {"nodes.x": 1})


def test_env_values_are_strings_and_reserved_names_rejected():
    spec = spec_from({**BASE, "env": {"PORT": 8080, "DEBUG": True}})
    assert spec.env == {"PORT": "8080", "DEBUG": "true"}
    assert "WMCTL_" in problems_of({"env": {"WMCTL_RUN": "x"}})["env.WMCTL_RUN"]


def test_unquoted_env_and_label_values_keep_the_text_the_user_wrote():
    """YAML 1.1 reads 010 as 8, yes as true, 1.50 as 1.5 and 0x1F as 31: a program reading its env
    got a value that is not in the spec. String maps take what was written; quoted stays quoted."""
    text = ("name: t\ncommand: [python, t.py]\n"
            "env: {A: 3, B: yes, C: 1.50, D: 010, E: '010', F: 0x1F, G: true, H: 1e3}\n"
            "kubernetes: {labels: {team: 007}, node_selector: {gen: 5.10}}\n"
            "image: {build_args: {CUDA: 12.10}}\n")
    spec = parse_spec(text)
    assert spec.env == {"A": "3", "B": "yes", "C": "1.50", "D": "010", "E": "010", "F": "0x1F", "G": "true",
                        "H": "1e3"}
    assert spec.kubernetes.labels == {"team": "007"} and spec.kubernetes.node_selector == {"gen": "5.10"}
    assert spec.image.build_args == {"CUDA": "12.10"}
    # --set gives a map's value as typed, and other fields as YAML reads them
    flags = parse_set_flags(["env.MODE=010", "nodes=2"])
    assert flags == {"env.MODE": "010", "nodes": 2}
    assert parse_spec(text, flags).env["MODE"] == "010"


def test_yaml_syntax_error_reports_line():
    with pytest.raises(SpecError) as err:
        parse_spec("name: x\ncommand: [python\n")
    assert "line" in str(err.value)


def test_missing_file():
    with pytest.raises(SpecError) as err:
        load_spec(DATA / "nope.yaml")
    assert "does not exist" in str(err.value)


@pytest.mark.parametrize("name", ["full.yaml", "tiny.yaml"])
def test_spec_hash_is_the_digest_of_the_specs_asdict_form(name):
    """spec_hash walks the spec without asdict's copies (the dry run hashes it three times); the
    digest must stay what asdict gave, or every existing run's record reads as a changed spec."""
    import dataclasses
    import hashlib
    import json

    from orchestrator.spec import HASHED_WHEN_SET

    spec = load_spec(DATA / name)
    data = spec.to_dict()
    for f in dataclasses.fields(spec):
        section = getattr(spec, f.name)
        if f.metadata.get(HASHED_WHEN_SET) and section == type(section)():
            del data[f.name]
        if dataclasses.is_dataclass(section) and isinstance(data.get(f.name), dict):
            for g in dataclasses.fields(section):
                default = g.default_factory() if g.default_factory is not dataclasses.MISSING else g.default
                if g.metadata.get(HASHED_WHEN_SET) and getattr(section, g.name) == default:
                    data[f.name].pop(g.name, None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    assert spec.spec_hash() == hashlib.sha256(canonical.encode()).hexdigest()[:12]


def test_spec_hash_changes_with_content():
    a = spec_from(BASE).spec_hash()
    b = spec_from({**BASE, "nodes": 2}).spec_hash()
    assert a != b and a == spec_from(BASE).spec_hash()


# ---- backend-specific volume checks ------------------------------------------------------------

def test_relative_host_path_rejected_only_on_kubernetes():
    spec = spec_from({**BASE, "image": {"tag": "x:1"},
                      "volumes": [{"name": "ckpt", "mount": "/ckpt", "host_path": "ckpt"}]})
    with pytest.raises(SpecError) as err:
        check_backend(spec, "kubernetes", auto_resume=False)
    message = dict(err.value.problems)["volumes[0].host_path"]
    assert "absolute" in message and "/mnt/ckpt" in message
    # Docker resolves it against the spec folder and local maps it: both keep accepting it.
    check_backend(spec, "docker", auto_resume=False)
    check_backend(spec, "local", auto_resume=False)
    absolute = spec_from({**BASE, "image": {"tag": "x:1"},
                          "volumes": [{"name": "ckpt", "mount": "/ckpt", "host_path": "/mnt/ckpt"}]})
    check_backend(absolute, "kubernetes", auto_resume=False)


def test_kubernetes_renderer_refuses_relative_host_path_itself():
    # The supervisor renders later attempts without the CLI's check_backend in between.
    from .helpers import render_plan
    spec = spec_from({**BASE, "image": {"tag": "x:1"},
                      "volumes": [{"name": "ckpt", "mount": "/ckpt", "host_path": "./ckpt"}]})
    with pytest.raises(SpecError) as err:
        render_plan(spec, load_profile("cpu"), "kubernetes")
    assert "volumes[0].host_path" in dict(err.value.problems)


def _kubernetes_notes(data, resume=True):
    from orchestrator.plan import AttemptContext
    from .helpers import render_plan
    spec = spec_from({**BASE, "image": {"tag": "x:1"}, "checkpoint": {"dir": "/ckpt/run"}, **data})
    check_backend(spec, "kubernetes", auto_resume=resume)     # accepted: a note, not an error
    return render_plan(spec, load_profile("cpu"), "kubernetes", AttemptContext(resume=resume)).notes


HOST_CKPT = [{"name": "ckpt", "mount": "/ckpt", "host_path": "/mnt/ckpt"}]


@pytest.mark.parametrize("data", [
    {"nodes": 2, "restart": {"exclude_failed_nodes": False}},
    {"nodes": 1, "restart": {"exclude_failed_nodes": True}},
])
def test_node_local_checkpoint_gets_a_plan_note(data):
    notes = _kubernetes_notes({**data, "volumes": HOST_CKPT})
    [note] = [n for n in notes if "host_path" in n]
    assert "/ckpt/run" in note and "pvc" in note and "nfs" in note and "from scratch" in note


def test_no_node_local_note_when_it_cannot_matter():
    single = {"nodes": 1, "restart": {"exclude_failed_nodes": False}, "volumes": HOST_CKPT}
    assert not [n for n in _kubernetes_notes(single) if "host_path" in n]
    pvc = {"nodes": 2, "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}]}
    assert not [n for n in _kubernetes_notes(pvc) if "host_path" in n]
    no_resume = {"nodes": 2, "volumes": HOST_CKPT}
    assert not [n for n in _kubernetes_notes(no_resume, resume=False) if "host_path" in n]
    # auto_resume in the spec counts as much as the --auto-resume flag.
    in_spec = {"nodes": 2, "volumes": HOST_CKPT, "restart": {"auto_resume": True}}
    assert [n for n in _kubernetes_notes(in_spec, resume=False) if "host_path" in n]


@pytest.mark.parametrize("name", ["wmctl-dshm", "wmctl-driver-0", "wmctl-anything"])
def test_volume_names_with_the_wmctl_prefix_are_reserved(name):
    p = problems_of({"volumes": [{"name": name, "mount": "/data", "pvc": "x"}]})
    assert "reserved" in p["volumes[0].name"] and "rename" in p["volumes[0].name"]


def test_ascend_driver_mounts_survive_any_user_volume_name():
    from .helpers import render_plan
    spec = spec_from({**BASE, "image": {"vendor": "ascend", "tag": "x:1"},
                      "volumes": [{"name": "driver-0", "mount": "/data", "pvc": "x"}]})
    job = next(o for o in render_plan(spec, load_profile("ascend"), "kubernetes").resources if o["kind"] == "Job")
    mounts = {m["mountPath"] for m in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/usr/local/Ascend/driver", "/dev/shm", "/data"} <= mounts


# ---- tolerations --------------------------------------------------------------------------------

@pytest.mark.parametrize("toleration,path,words", [
    ({"key": "a", "operator": "Exist"}, "operator", "Exists, Equal"),
    ({"key": "a", "operator": "Exists", "effect": "NoSchedul"}, "effect", "NoSchedule"),
    ({"key": "a", "operator": "Exists", "value": "v"}, "value", "drop value"),
    ({"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}, "tolerationSeconds",
     "NoExecute"),
    ({"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "30s"}, "tolerationSeconds",
     "integer"),
    ({"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**31}, "tolerationSeconds",
     "2147483647"),
    ({"key": "a", "operator": "Equal", "value": 5}, "value", "quote it"),
    ({"key": "a", "value": "bad value!"}, "value", "taint value"),
    ({"value": "x"}, "key", "Exists"),
    ({"key": "bad key!", "operator": "Exists"}, "key", "taint key"),
])
def test_tolerations_are_validated_like_the_api_server(toleration, path, words):
    p = problems_of({"kubernetes": {"tolerations": [{"key": "ok", "operator": "Exists"}, toleration]}})
    assert words in p[f"kubernetes.tolerations[1].{path}"], p


def test_valid_tolerations_pass():
    spec = spec_from({**BASE, "kubernetes": {"tolerations": [
        {"operator": "Exists"},
        {"key": "a", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "b", "value": "v", "effect": "PreferNoSchedule"},        # operator defaults to Equal
        {"key": "c", "operator": "Equal", "value": "", "effect": ""},
        {"key": "d", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0},
        {"key": "e", "operator": "Exists", "value": None},
    ]}})
    assert len(spec.kubernetes.tolerations) == 6


# ---- smaller checks ---------------------------------------------------------------------------

def test_affinity_error_names_the_bad_key():
    p = problems_of({"affinity": {0: "0-3", "x": "1"}})
    assert "affinity.x" in p and "integer" in p["affinity.x"]
    assert "affinity" not in p, "the whole mapping is not at fault, one key is"
    assert "affinity.1" in problems_of({"affinity": {0: "0-3", 1: "zero"}})
    # The bad key is dropped, not kept as None, so the checks after it still run and report.
    p = problems_of({"affinity": {0: "0-3", "x": "1"}, "kubernetes": {"cluster_domain": "Bad"}})
    assert "affinity.x" in p and "kubernetes.cluster_domain" in p


def test_cpu_below_one_millicore_is_rejected():
    assert "1m" in problems_of({"resources": {"cpu": 1e-9}})["resources.cpu"]
    assert spec_from({**BASE, "resources": {"cpu": 0.001}}).resources.cpu == 0.001


@pytest.mark.parametrize("workdir", ["/work space", "/work\nRUN x", "/w/../etc", "relative", "/w$x", "/w\u2028"])
def test_image_workdir_checked_at_load_like_build_image(workdir):
    from orchestrator.imagebuild.quoting import check_image_path
    from orchestrator.errors import BuildError
    assert "image.workdir" in problems_of({"image": {"workdir": workdir}})
    with pytest.raises(BuildError):   # the build-time rule agrees, so a spec that loads also builds
        check_image_path(workdir, "image.workdir")


@pytest.mark.parametrize("workdir", ["/workspace", "/opt/my-app_1.0/src", "/"])
def test_image_workdir_accepted_at_load_is_accepted_by_build_image(workdir):
    from orchestrator.imagebuild.quoting import check_image_path
    assert spec_from({**BASE, "image": {"workdir": workdir}}).image.workdir == workdir
    check_image_path(workdir, "image.workdir")


def test_mount_paths_are_normalised_so_duplicates_are_caught():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data", "pvc": "x"},
                                 {"name": "b", "mount": "//data//", "pvc": "y"},
                                 {"name": "c", "mount": "/data/./", "pvc": "z"}]})
    assert "two volumes on one mount path" in p["volumes[1].mount"]
    assert "two volumes on one mount path" in p["volumes[2].mount"]
    spec = spec_from({**BASE, "volumes": [{"name": "a", "mount": "//srv//data/./", "pvc": "x"}]})
    assert spec.volumes[0].mount == "/srv/data"
    assert "/dev/shm" in problems_of({"volumes": [{"name": "a", "mount": "/dev//shm/", "pvc": "x"}]})[
        "volumes[0].mount"]


def test_mount_path_with_dotdot_is_rejected():
    p = problems_of({"volumes": [{"name": "a", "mount": "/data/../etc", "pvc": "x"}]})
    assert "'..'" in p["volumes[0].mount"]


@pytest.mark.parametrize("data,path", [
    ({"name": "ok\n"}, "name"),
    ({"env": {"A\n": "x"}}, "env.A\n"),
    ({"kubernetes": {"labels": {"team": "a\n"}}}, "kubernetes.labels.team"),
    ({"kubernetes": {"namespace": "ns\n"}}, "kubernetes.namespace"),
])
def test_trailing_newline_does_not_slip_past_a_pattern(data, path):
    # re.match's '$' also matches before a final newline; Kubernetes would refuse the value.
    assert path in problems_of(data)
