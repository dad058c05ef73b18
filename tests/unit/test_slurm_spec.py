"""The spec's slurm: section: what it accepts, what it refuses (naming the field and the fix), and
what each value becomes in the sbatch script. The script's quoting is tests/unit/test_slurm_script.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator import backends
from orchestrator.backends.slurm.check import format_minutes, time_limit_minutes
from orchestrator.cli import main
from orchestrator.errors import SpecError
from orchestrator.plan import AttemptContext, HostFacts
from orchestrator.validate import Invalid
from orchestrator.vendors import available_profiles, load_profile

from .helpers import DATA, check_backend, full_spec, spec_from

HOST = HostFacts(cpus=(0, 1), python="/usr/bin/python3", home=Path("/shared/wmctl"))


def _spec(vendor: str = "cpu", /, **fields: object):
    data: dict = {"name": "j", "command": ["python", "t.py"], "nodes": 2, "image": {"vendor": vendor}}
    for key, value in fields.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return spec_from(data)


def _problems(**fields: object) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as exc:
        check_backend(_spec(**fields), "slurm", auto_resume=False)
    return exc.value.problems


def _directives(spec, ctx: AttemptContext | None = None) -> list[str]:
    plan = backends.render_plan(spec, load_profile(spec.image.vendor), "slurm", ctx, HOST)
    return [line[len("#SBATCH "):] for line in plan.request.script.splitlines() if line.startswith("#SBATCH ")]


@pytest.mark.parametrize("value,minutes", [
    ("30:00", 30), ("1:30:00", 90), ("2-0", 2880), ("1-12", 2160), ("1-00:30", 1470), ("1-00:00:01", 1441),
    ("90m", 90), ("1h30m", 90), ("24h", 1440), ("61s", 2), ("UNLIMITED", 0), ("infinite", 0), (None, None),
])
def test_time_limit_reads_slurm_forms_and_durations_in_whole_minutes(value, minutes):
    assert time_limit_minutes(value) == minutes


def test_time_limit_rounds_up_to_whole_minutes_and_says_so():
    plan = backends.render_plan(_spec(**{"slurm.time_limit": "610s"}), load_profile("cpu"), "slurm", None, HOST)
    assert "#SBATCH --time=0-00:11:00" in plan.request.script
    assert any("rounded up to 0-00:11:00" in n for n in plan.notes)
    plan = backends.render_plan(_spec(**{"slurm.time_limit": "11m"}), load_profile("cpu"), "slurm", None, HOST)
    assert not any("rounded" in n for n in plan.notes)


def test_time_limit_renders_in_slurms_own_form():
    assert [format_minutes(m) for m in (1, 90, 1441, 2880, 0)] == [
        "0-00:01:00", "0-01:30:00", "1-00:01:00", "2-00:00:00", "UNLIMITED"]
    assert "--time=1-00:01:00" in _directives(_spec(**{"slurm.time_limit": "1-00:00:01"}))
    assert not [d for d in _directives(_spec()) if d.startswith("--time")]     # the partition's default


@pytest.mark.parametrize("value,says", [
    ("30", "bare number"), (30, "bare number"), (5400, "base 60"), ("0s", "no time at all"),
    ("0:00", "no time at all"), ("soon", "not a time limit"), ("1-25:00", "hours 0-23"),
    ("1:61:00", "0-59"), ("-1h", "not a time limit"),
])
def test_time_limit_refuses_what_it_cannot_read_for_sure(value, says):
    problems = _problems(**{"slurm.time_limit": value})
    assert problems[0][0] == "slurm.time_limit" and says in problems[0][1], problems
    if isinstance(value, int):
        with pytest.raises(Invalid):
            time_limit_minutes(str(value))


def test_signal_lead_leaves_room_for_slurms_slack_and_the_save():
    problems = _problems(**{"slurm.signal_lead": "100s"})       # under 60 s + the 90 s grace
    assert problems[0][0] == "slurm.signal_lead"
    assert "man sbatch" in problems[0][1] and "kubernetes.termination_grace_period" in problems[0][1]
    assert "at least 150s" in problems[0][1]
    # a longer save room asks for a longer lead; a shorter one allows a shorter lead
    assert _problems(**{"kubernetes.termination_grace_period": "10m"})[0][0] == "slurm.signal_lead"
    check_backend(_spec(**{"slurm.signal_lead": "100s", "kubernetes.termination_grace_period": "30s"}), "slurm",
                  auto_resume=False)
    assert "--signal=TERM@100" in _directives(_spec(**{"slurm.signal_lead": "100s",
                                                        "kubernetes.termination_grace_period": "30s"}))
    assert "65535" in _problems(**{"slurm.signal_lead": "19h"})[0][1]
    refused = _problems(**{"slurm.signal_lead": "10m", "slurm.time_limit": "10m"})
    assert refused[0][0] == "slurm.signal_lead" and "not shorter than slurm.time_limit" in refused[0][1]


def test_exclusive_by_default_only_for_several_nodes():
    assert "--exclusive" in _directives(_spec())
    assert "--exclusive" not in _directives(_spec(nodes=1))
    assert "--exclusive" not in _directives(_spec(**{"slurm.exclusive": False}))
    assert "--exclusive" in _directives(_spec(nodes=1, **{"slurm.exclusive": True}))


@pytest.mark.parametrize("vendor", available_profiles())
def test_each_vendor_profile_gives_its_gres_and_the_spec_overrides_it(vendor):
    profile = load_profile(vendor)
    spec = _spec(vendor, nodes=1)
    asked = [d for d in _directives(spec) if d.startswith("--gres=")]
    if not profile.accelerator:
        assert profile.slurm.gres is None and asked == []
        return
    assert asked == [f"--gres={profile.slurm.gres}:{profile.default_accelerators_per_node}"]
    assert [d for d in _directives(_spec(vendor, accelerators_per_node=4, **{"slurm.gres": "gpu:h100"}))
            if d.startswith("--gres=")] == ["--gres=gpu:h100:4"]
    assert not [d for d in _directives(_spec(vendor, **{"slurm.gres": "none"})) if d.startswith("--gres=")]


def test_gres_refuses_a_count_and_a_bad_name():
    counted = _problems(**{"slurm.gres": "gpu:a100:8"})
    assert counted[0][0] == "slurm.gres" and "accelerators_per_node" in counted[0][1]
    assert "not a GRES name" in _problems(**{"slurm.gres": "gpu a100"})[0][1]


def test_a_profile_without_a_gres_name_is_told_to_set_one(tmp_path, monkeypatch):
    text = (Path(__file__).parents[2] / "images" / "cuda.yaml").read_text().replace("name: cuda", "name: acme")
    text = re.sub(r"slurm:\n  gres: gpu\n", "slurm:\n", text)
    (tmp_path / "acme.yaml").write_text(text)
    monkeypatch.setenv("WMCTL_VENDOR_PATH", str(tmp_path))
    spec = _spec("acme")
    with pytest.raises(SpecError) as exc:
        _directives(spec)
    assert exc.value.problems[0][0] == "slurm.gres" and "scontrol show node" in exc.value.problems[0][1]


def test_resources_become_cpus_and_memory_per_node():
    d = _directives(_spec(resources={"cpu": 6.5, "memory": "64Gi", "shm": "1Gi"}))
    assert "--cpus-per-task=7" in d and "--mem=64G" in d
    assert "--mem=1536M" in _directives(_spec(resources={"memory": "1536Mi", "shm": "1Gi"}))
    assert "--mem=1537M" in _directives(_spec(resources={"memory": 1536 * 2**20 + 1, "shm": "1Gi"}))   # rounded up


@pytest.mark.parametrize("option,says", [
    ("--nodes=4", "set nodes"), ("--time=10", "slurm.time_limit"), ("--gres=gpu:2", "slurm.gres"),
    ("--mem=10G", "resources.memory"), ("--requeue", "owns retries"), ("--output=x", "names the job"),
    ("--wait", "changes what wmctl submits"), ("--partition=x", "slurm.partition"),
    ("--mail-typ=END", "did you mean 'mail-type'"), ("-p gpu", "--name=value"), ("--mail-type", "takes a value"),
    ("--reboot=yes", "takes no value"),
])
def test_extra_options_are_checked_one_by_one(option, says):
    problems = _problems(**{"slurm.extra_options": ["--mail-type=END", option]})
    assert problems[0][0] == "slurm.extra_options[1]" and says in problems[0][1], problems


def test_accepted_extra_options_follow_wmctls_own():
    d = _directives(_spec(**{"slurm.extra_options": ["--mail-type=END,FAIL", "--mail-user=me@example.com",
                                                      "--reboot", "--dependency=afterok:123"]}))
    assert d[-4:] == ["--mail-type=END,FAIL", "--mail-user=me@example.com", "--reboot", "--dependency=afterok:123"]
    assert d.index("--no-requeue") < d.index("--mail-type=END,FAIL")


def test_a_container_needs_an_image_and_host_path_volumes():
    problems = dict(_problems(**{"slurm.container": "pyxis", "checkpoint.dir": "/workspace/ckpt",
                                 "volumes": [{"name": "ckpt", "mount": "/workspace/ckpt", "pvc": "c"}]}))
    assert "image.tag" in problems and "volumes[0]" in problems and "checkpoint.dir" in problems
    colon = _problems(**{"slurm.container": "apptainer", "image.tag": "r.example.com/x:1",
                         "volumes": [{"name": "d", "mount": "/d", "host_path": "/a:b"}]})
    assert colon[0][0] == "volumes[0].host_path" and "separators" in colon[0][1]


def test_the_run_folder_and_exclusions_reach_the_script():
    spec = _spec()
    d = _directives(spec, AttemptContext(attempt=2, excluded_nodes=("gpu-node-7", "gpu-node-9"), parent=1))
    assert "--exclude=gpu-node-7,gpu-node-9" in d and "--job-name=j-a2" in d and "--no-requeue" in d
    plan = backends.render_plan(spec, load_profile("cpu"), "slurm", AttemptContext(attempt=2), HOST)
    r = plan.request
    assert r.sbatch_argv == ["sbatch", "--parsable", "--output=/shared/wmctl/runs/j/attempt-2/batch.log",
                             "/shared/wmctl/runs/j/attempt-2/job.sbatch"]
    assert r.node_exit_records == ["/shared/wmctl/runs/j/attempt-2/node-0.exit.json",
                                   "/shared/wmctl/runs/j/attempt-2/node-1.exit.json"]
    assert f"# submitted as: {' '.join(r.sbatch_argv)}" in r.script


def test_a_percent_in_the_run_folder_is_not_a_filename_pattern():
    host = HostFacts(cpus=(0,), python="/usr/bin/python3", home=Path("/shared/100%"))
    plan = backends.render_plan(_spec(), load_profile("cpu"), "slurm", None, host)
    assert plan.request.sbatch_argv[2] == "--output=/shared/100%%/runs/j/attempt-0/batch.log"


def test_the_slurm_section_at_its_defaults_leaves_every_spec_hash_as_it_was():
    """Adding the section changed no existing spec's hash (the checkpoint marker's resume check);
    a value in it does change the hash."""
    assert full_spec("cuda").spec_hash() == "7ccc30366473"       # tests/golden/docker/cuda.yaml's specHash
    assert full_spec("cuda", **{"slurm.partition": "gpu"}).spec_hash() != "7ccc30366473"


def test_dry_run_prints_the_script_and_records_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path / "home"))
    spec = str(DATA / "tiny.yaml")
    main(["submit", spec, "-b", "slurm", "--dry-run"])
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n") and f"# submitted as: sbatch --parsable --output={tmp_path}" in out
    assert "\nsrun " in out
    assert not (tmp_path / "home" / "runs").exists()
