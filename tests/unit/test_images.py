"""orchestrator.imagebuild (engine, progress, record) without an engine: failure and push-error classification, the
build record, the digest pin used by render/submit, the context tar, and the reporter's life cycle."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.imagebuild import engine, progress, record
from orchestrator.errors import BuildError
from orchestrator.imagebuild.progress import Reporter, Step

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "b" * 64


# ---- build failures --------------------------------------------------------------------------------------

def test_missing_wheel_in_an_offline_step_points_at_the_wheelhouse():
    steps = [Step(5, 9,
                  'RUN ["python3", "-m", "pip", "install", "--no-index", "--find-links", "/tmp/wmctl/wheelhouse/"]')]
    err = engine._failure(steps, "The command returned a non-zero code: 1",
                          ["ERROR: No matching distribution found for idna"])
    assert "step 5/9" in err.message and "idna" in err.message
    assert err.hint is not None
    assert "wmctl wheelhouse" in err.hint and "idna" in err.hint


def test_missing_package_online_points_at_requirements_and_index():
    steps = [Step(4, 9, 'RUN ["python3", "-m", "pip", "install", "-r", "/tmp/wmctl/req/requirements.txt"]')]
    err = engine._failure(steps, "returned a non-zero code: 1",
                          ["ERROR: Could not find a version that satisfies the requirement nopkg==9 "
                           "(from versions: none)"])
    assert err.hint is not None
    assert "image.requirements" in err.hint and "nopkg==9" in err.hint


def test_failed_from_points_at_the_base_image():
    err = engine._failure([Step(1, 9, "FROM nowhere/base:x")], "pull access denied for nowhere/base", [])
    assert err.hint is not None
    assert "image.base" in err.hint


def test_failure_before_any_step_says_so():
    err = engine._failure([], "context canceled", [])
    assert "before the first step" in err.message and err.hint is None


# ---- push errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "unauthorized: authentication required", "denied: requested access to the resource is denied",
    "no basic auth credentials",
])
def test_push_refusals_say_log_in(text):
    err = engine._push_error("reg.example.com", text)
    assert err.hint is not None
    assert "was refused" in err.message and "docker login reg.example.com" in err.hint


@pytest.mark.parametrize("text", [
    'Get "https://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
    "dial tcp: lookup reg.invalid: no such host",
    "404 page not found",
    "http: server gave HTTP response to HTTPS client",
])
def test_unreachable_registry_says_check_the_address(text):
    err = engine._push_error("reg.example.com", text)
    assert err.message.startswith("cannot reach registry reg.example.com")
    assert err.hint is not None
    assert "reachable" in err.hint


@pytest.mark.parametrize("text", [
    "manifest unknown: manifest unknown", "repository name not known to registry",
    "blob upload unknown: not found", "name unknown: repository not found",
])
def test_registry_answers_with_not_found_are_not_called_unreachable(text):
    err = engine._push_error("reg.example.com", text)
    assert "cannot reach" not in err.message
    assert err.message.startswith("push to reg.example.com failed")


def test_push_of_a_tag_the_engine_lacks_says_build_first():
    err = engine._push_error("reg.example.com", "An image does not exist locally with the tag: reg.example.com/x")
    assert err.hint is not None
    assert "cannot reach" not in err.message and "build it first" in err.hint


# ---- the record -----------------------------------------------------------------------------------------------

def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tiny\ncommand: [python, train.py]\nimage: {vendor: cpu, tag: reg.example.com/t/tiny:v1}\n")
    return spec


def _recorded(spec, job: str) -> dict:
    entry = record.recorded_image(spec, job)
    assert entry is not None, job
    return entry


def _text(tar: tarfile.TarFile, name: str) -> str:
    member = tar.extractfile(name)
    assert member is not None, name
    return member.read().decode()


def _built(image_id: str, tag: str = "reg.example.com/t/tiny:v1", **extra) -> dict:
    return {"tag": tag, "content_tag": tag.rsplit(":", 1)[0] + ":wmctl-0123456789ab", "image_id": image_id, **extra}


def _pushed(image_id: str, digest: str = DIGEST, tag: str = "reg.example.com/t/tiny:v1") -> dict:
    return _built(image_id, tag, repo_digest=f"{tag.rsplit(':', 1)[0]}@{digest}", digest=digest,
                  pushed_at="2026-01-01T00:00:00Z")


def test_rebuild_without_push_drops_the_stale_digest(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:old"))
    record.record_image(spec, "tiny", _built("sha256:new"))
    entry = _recorded(spec, "tiny")
    assert entry["image_id"] == "sha256:new"
    assert not set(record.PUSH_FIELDS) & set(entry)


def test_up_to_date_rebuild_keeps_the_digest_of_the_same_image(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:same"))
    record.record_image(spec, "tiny", _built("sha256:same"))
    assert _recorded(spec, "tiny")["repo_digest"] == f"reg.example.com/t/tiny@{DIGEST}"


def test_same_image_under_another_tag_drops_the_digest(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:same"))
    record.record_image(spec, "tiny", _built("sha256:same", tag="other.example.com/t/tiny:v2"))
    assert "repo_digest" not in _recorded(spec, "tiny")


def test_records_of_other_jobs_are_kept(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "other", _pushed("sha256:x"))
    record.record_image(spec, "tiny", _built("sha256:y"))
    assert _recorded(spec, "other")["repo_digest"].endswith(DIGEST)


def test_unreadable_record_is_a_clear_error(tmp_path):
    spec = _spec(tmp_path)
    record.record_path(spec).parent.mkdir()
    record.record_path(spec).write_text("{not json")
    with pytest.raises(BuildError, match="delete it and build again"):
        record.load_records(spec)


@pytest.mark.parametrize("tag,expected", [
    ("reg.example.com/t/tiny:v1", f"reg.example.com/t/tiny@{DIGEST}"),
    ("reg.example.com/t/tiny:wmctl-0123456789ab", f"reg.example.com/t/tiny@{DIGEST}"),   # the content tag
    ("reg.example.com/t/tiny:v2", None),                 # the record is for another tag
    ("other.example.com/t/tiny:v1", None),               # another registry
    (f"reg.example.com/t/tiny@{OTHER_DIGEST}", None),    # already a digest: used as is
])
def test_pinned_ref_only_for_the_recorded_tag(tmp_path, tag, expected):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x"))
    assert record.pinned_ref(spec, "tiny", tag) == expected
    assert record.image_ref_for_submit(spec, "tiny", tag) == (expected or tag)


def test_pinned_ref_normalizes_an_implicit_latest(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x", tag="reg.example.com/t/tiny:latest"))
    assert record.pinned_ref(spec, "tiny", "reg.example.com/t/tiny") == f"reg.example.com/t/tiny@{DIGEST}"


def test_no_pin_without_a_push_or_with_a_malformed_digest(tmp_path):
    spec = _spec(tmp_path)
    record.record_image(spec, "tiny", _built("sha256:x"))
    assert record.pinned_ref(spec, "tiny", "reg.example.com/t/tiny:v1") is None
    record.record_image(spec, "tiny", {**_built("sha256:x"), "repo_digest": "reg.example.com/t/tiny@sha256:zz"})
    assert record.pinned_ref(spec, "tiny", "reg.example.com/t/tiny:v1") is None


# ---- the pin in render / submit --dry-run ---------------------------------------------------------------------

def _job(tmp_path: Path, tag: str = "reg.example.com/t/tiny:v1") -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: tiny\ncommand: [python, train.py]\nimage: {{vendor: cpu, tag: {tag}}}\n")
    return spec


def _render(spec: Path, *args: str):
    from orchestrator.cli import cli

    return CliRunner().invoke(cli, ["render", str(spec), "-o", "json", *args])


def _images_in(plan_json: str, backend: str) -> set[str]:
    data = json.loads(plan_json)
    if backend == "kubernetes":
        return {c["image"] for item in data["items"] if item["kind"] == "Job"
                for c in item["spec"]["template"]["spec"]["containers"]}
    return {r["create"]["image"] for r in data["resources"] if r.get("kind") == "container"}


@pytest.mark.parametrize("backend", ["docker", "kubernetes"])
def test_render_pins_the_pushed_digest_and_says_so(tmp_path, backend):
    spec = _job(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x"))
    result = _render(spec, "-b", backend)
    assert result.exit_code == 0, result.output + result.stderr
    assert _images_in(result.stdout, backend) == {f"reg.example.com/t/tiny@{DIGEST}"}
    assert "pinned to digest" in result.stderr and str(record.record_path(spec)) in result.stderr


def test_render_without_a_record_or_push_keeps_the_tag(tmp_path):
    spec = _job(tmp_path)
    result = _render(spec, "-b", "docker")
    assert _images_in(result.stdout, "docker") == {"reg.example.com/t/tiny:v1"} and not result.stderr
    record.record_image(spec, "tiny", _built("sha256:x"))
    result = _render(spec, "-b", "docker")
    assert _images_in(result.stdout, "docker") == {"reg.example.com/t/tiny:v1"} and not result.stderr


def test_a_digest_given_with_image_is_used_as_is(tmp_path):
    spec = _job(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x"))
    mine = f"reg.example.com/t/tiny@{OTHER_DIGEST}"
    result = _render(spec, "-b", "docker", "--image", mine)
    assert _images_in(result.stdout, "docker") == {mine} and "pinned" not in result.stderr


def test_another_tag_given_with_image_is_not_pinned(tmp_path):
    spec = _job(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x"))
    result = _render(spec, "-b", "docker", "--image", "reg.example.com/t/tiny:v2")
    assert _images_in(result.stdout, "docker") == {"reg.example.com/t/tiny:v2"}


def test_pinned_dry_run_imports_no_engine_sdk(tmp_path):
    spec = _job(tmp_path)
    record.record_image(spec, "tiny", _pushed("sha256:x"))
    code = ("import sys, json\nfrom orchestrator.cli import main\n"
            "try:\n    main(['submit', sys.argv[1], '--dry-run', '-b', 'kubernetes'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('HEAVY', json.dumps([m for m in ('docker', 'kubernetes', 'rich') if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert f"reg.example.com/t/tiny@{DIGEST}" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


# ---- the context tar ------------------------------------------------------------------------------------------

def test_context_carries_nested_requirements_and_both_wheel_groups(tmp_path):
    from .test_dockerfile import make_wheel, plan_for, write_spec

    spec = write_spec(tmp_path / "job")
    (tmp_path / "job" / "requirements.txt").write_text("-r reqs/base.txt\nsix\n")
    (tmp_path / "job" / "reqs").mkdir()
    (tmp_path / "job" / "reqs" / "base.txt").write_text("-c ../constraints.txt\nnumpy\n")
    (tmp_path / "job" / "constraints.txt").write_text("numpy<3\n")
    wh = tmp_path / "wh"
    wh.mkdir()
    make_wheel(wh, "torch", requires=["filelock"])
    make_wheel(wh, "filelock")
    make_wheel(wh, "six")
    plan = plan_for(spec, wheelhouse=wh)
    runtime = tmp_path / "wmctl-0.1.0-py3-none-any.whl"
    runtime.write_bytes(b"wheel")
    buf = io.BytesIO()
    engine.write_deps_context(plan, runtime, buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        names = set(tar.getnames())
        assert _text(tar, "Dockerfile") == plan.deps_dockerfile
    assert {"wmctl/req/requirements.txt", "wmctl/req/reqs/base.txt", "wmctl/req/constraints.txt"} <= names
    assert f"wmctl/wheels/{plan.wheel_name}" in names and "wmctl/requirements.txt" not in names
    assert not [n for n in names if n.startswith("src")]          # no code in the dependency image's context
    # The wheels travel in the wheels image's own context (sent once per wheelhouse), never in the job's.
    assert not [n for n in names if "wheelhouse" in n]
    # The job's own context: its Dockerfile FROM the dependency image, and the code; nothing else.
    buf = io.BytesIO()
    engine.write_code_context(plan, buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        code_names = set(tar.getnames())
        assert _text(tar, "Dockerfile").startswith(f"FROM {plan.deps_tag}\n")
    assert code_names == {"Dockerfile", "src"} | {f"src/{e.rel}" for e in plan.context.entries}
    wheels = set()
    for folder, count in (("wmctl/wheelhouse-torch", 2), ("wmctl/wheelhouse", 1)):
        buf = io.BytesIO()
        assert engine.write_wheels_context(plan, folder, buf) == count
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            wheels |= set(tar.getnames())
            dockerfile = _text(tar, "Dockerfile")
        assert dockerfile.splitlines()[1:] == ["FROM scratch", 'LABEL "io.wmctl.wheelhouse"="wheels"',
                                               'COPY ["wmctl/", "/wmctl/"]']
    assert {"wmctl/wheelhouse-torch/torch-1.0-py3-none-any.whl",
            "wmctl/wheelhouse-torch/filelock-1.0-py3-none-any.whl",
            "wmctl/wheelhouse/six-1.0-py3-none-any.whl"} <= wheels
    # The job's Dockerfile copies each group from its image, by a tag named after the wheels' contents.
    torch_image, deps_image = plan.wheels_images["wmctl/wheelhouse-torch"], plan.wheels_images["wmctl/wheelhouse"]
    assert torch_image.startswith("wmctl/wheelhouse:torch-") and deps_image.startswith("wmctl/wheelhouse:deps-")
    assert f'COPY --from={torch_image} ["/wmctl/wheelhouse-torch/", "/tmp/wmctl/wheelhouse/"]' in plan.dockerfile
    assert f'COPY --from={deps_image} ["/wmctl/wheelhouse/", "/tmp/wmctl/wheelhouse/"]' in plan.dockerfile


# ---- the reporter is closed on every way out -------------------------------------------------------------------

class RecordingReporter(Reporter):
    def __init__(self):
        super().__init__(stream=io.StringIO())
        self.closed = 0

    def close(self):
        self.closed += 1


class FakeClient:
    """Just enough of an engine: the build's ImageAPI (image_id, tag, build, list/remove) and the
    SDK's api.push for a push."""

    def __init__(self, have=(), build_chunks=(), push_chunks=()):
        self.have = dict(have)
        self.build_chunks = list(build_chunks)
        self.push_chunks = list(push_chunks)
        self.tagged = []
        self.api = self

    def image_id(self, ref):
        return self.have.get(ref)

    def tag(self, image, repo, tag):
        self.tagged.append((image, f"{repo}:{tag}"))

    def build(self, fileobj, **params):
        fileobj.read()
        return iter(self.build_chunks)

    def list_images(self, label):
        return []

    def remove_image(self, ref):
        raise AssertionError(f"nothing may be removed here: {ref}")

    def push(self, repo, tag=None, stream=True, decode=True):
        return iter(self.push_chunks)


def _plan(tmp_path):
    from .test_dockerfile import plan_for, write_spec

    return plan_for(write_spec(tmp_path / "job"), tag="reg.example.com/t/tiny:v1")


def test_up_to_date_build_closes_the_reporter(tmp_path):
    plan = _plan(tmp_path)
    client = FakeClient(have={plan.content_tag: "sha256:" + "c" * 64})
    reporter = RecordingReporter()
    result = engine.build_image(plan, tmp_path / "unused.whl", client=client, reporter=reporter)
    assert result.up_to_date and reporter.closed == 1
    assert client.tagged == [("sha256:" + "c" * 64, plan.tag)]


def test_failed_build_closes_the_reporter(tmp_path):
    plan = _plan(tmp_path)
    wheel = tmp_path / plan.wheel_name
    wheel.write_bytes(b"wheel")
    client = FakeClient(build_chunks=[{"stream": "Step 1/9 : FROM wmctl-test/base:x\n"},
                                      {"error": "boom", "errorDetail": {"message": "boom"}}])
    reporter = RecordingReporter()
    with pytest.raises(BuildError, match="step 1/9"):
        engine.build_image(plan, wheel, client=client, reporter=reporter)
    assert reporter.closed == 1


def test_push_refused_before_pushing_closes_the_reporter():
    reporter = RecordingReporter()
    with pytest.raises(BuildError, match="names no registry"):
        engine.push_image("team/tiny:v1", client=FakeClient(), reporter=reporter)
    assert reporter.closed == 1


def test_push_error_closes_the_reporter():
    reporter = RecordingReporter()
    client = FakeClient(push_chunks=[{"error": "x", "errorDetail": {"message": "dial tcp: connection refused"}}])
    with pytest.raises(BuildError, match="cannot reach registry"):
        engine.push_image("reg.example.com/t/tiny:v1", client=client, reporter=reporter)
    assert reporter.closed == 1


def test_wheel_build_failure_in_the_command_closes_the_reporter(tmp_path, monkeypatch):
    from orchestrator.imagebuild import wheel
    from orchestrator.cli import cli

    from .test_dockerfile import write_spec

    spec = write_spec(tmp_path / "job")
    reporters = []

    def make_reporter(quiet):
        reporters.append(RecordingReporter())
        return reporters[-1]

    def broken_wheel(*args, **kwargs):
        raise BuildError("cannot build the wmctl wheel")

    monkeypatch.setattr(engine, "connect", lambda *a, **k: FakeClient())
    monkeypatch.setattr(progress, "make_reporter", make_reporter)
    monkeypatch.setattr(wheel, "build_wheel", broken_wheel)
    monkeypatch.setattr(wheel, "fingerprint", lambda *a, **k: "f" * 64)
    result = CliRunner().invoke(cli, ["build-image", str(spec)])
    assert isinstance(result.exception, BuildError)
    assert [r.closed for r in reporters] == [1]


def test_rich_reporter_stops_its_spinner_once(monkeypatch):
    stops = []
    with progress.RichReporter() as reporter:
        assert isinstance(reporter, progress.RichReporter)
        real_stop = reporter._status.stop

        def stop() -> None:
            stops.append(1)
            real_stop()
        monkeypatch.setattr(reporter._status, "stop", stop)
        reporter.close()   # build_image closes it, then the command's `with` does
    assert stops == [1]


# ---- wheel hashes kept between builds ---------------------------------------------------------------------------

def test_wheel_hashes_are_kept_between_builds_and_redone_when_a_wheel_changes(tmp_path, monkeypatch):
    import hashlib
    import os
    import time

    from orchestrator.imagebuild import digest

    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    wh = tmp_path / "wh"
    wh.mkdir()
    wheel_file = wh / "six-1.0-py3-none-any.whl"
    wheel_file.write_bytes(b"a" * 100)
    files = [(wheel_file.name, 100)]

    def later() -> float:          # past the racy window: the file's stamps are settled
        return time.time() + 10 * digest.RACY_S

    first = digest.wheelhouse_hashes(wh, files, clock=later)
    assert first == {wheel_file.name: hashlib.sha256(b"a" * 100).hexdigest()}
    read = digest._file_sha256

    def no_read(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(digest, "_file_sha256", no_read)
    assert digest.wheelhouse_hashes(wh, files, clock=later) == first
    # Rebuilt in place: same name, same size; its stamps changed, so it is read again.
    wheel_file.write_bytes(b"b" * 100)
    os.utime(wheel_file, ns=(10**9, 10**9))
    monkeypatch.setattr(digest, "_file_sha256", read)
    assert digest.wheelhouse_hashes(wh, files, clock=later) == {wheel_file.name: hashlib.sha256(b"b" * 100).hexdigest()}


def test_a_wheel_written_just_now_is_hashed_but_not_kept(tmp_path, monkeypatch):
    from orchestrator.imagebuild import digest

    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "six-1.0-py3-none-any.whl").write_bytes(b"a")
    assert digest.wheelhouse_hashes(wh, [("six-1.0-py3-none-any.whl", 1)])   # the real clock: racy
    assert not (tmp_path / "cache" / digest.HASH_CACHE_FILE).exists()


def test_a_cache_folder_that_cannot_be_written_only_costs_the_hashing(tmp_path, monkeypatch):
    import time

    from orchestrator.imagebuild import digest

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(blocker))
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "six-1.0-py3-none-any.whl").write_bytes(b"a")
    got = digest.wheelhouse_hashes(wh, [("six-1.0-py3-none-any.whl", 1)], clock=lambda: time.time() + 100)
    assert list(got) == ["six-1.0-py3-none-any.whl"]


def test_a_wheels_requirements_are_read_once_then_kept(tmp_path, monkeypatch):
    from orchestrator.imagebuild import digest, wheelhouse

    from .test_dockerfile import make_wheel

    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "RACY_S", -1e9)     # as if the files had been written long ago
    wh = tmp_path / "wh"
    wh.mkdir()
    make_wheel(wh, "torch", requires=["filelock"])
    make_wheel(wh, "filelock")
    make_wheel(wh, "six")
    files = sorted((p.name, p.stat().st_size) for p in wh.iterdir())
    first = wheelhouse.torch_wheel_set(wh, files, ["torch"])
    assert first == {"torch-1.0-py3-none-any.whl", "filelock-1.0-py3-none-any.whl"}

    def no_read(path):
        raise AssertionError(f"{path} was opened again")

    monkeypatch.setattr(wheelhouse, "_wheel_requires", no_read)
    assert wheelhouse.torch_wheel_set(wh, files, ["torch"]) == first
