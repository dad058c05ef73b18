"""`wmctl build-image` against the real engine, FROM the local base image (no registry, no index).

Requirements the base already satisfies (numpy) need no network; wheelhouse builds run with
``network_mode="none"``.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from orchestrator import __version__

from ..unit.test_dockerfile import make_wheel
from .conftest import REPO_ROOT, WHEELS_IMAGES, run_wmctl

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


def write_job(root: Path, base: str, *, requirements: str = "numpy\n", name: str = "tiny",
              extra_image: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "requirements.txt").write_text(requirements)
    (root / "train.py").write_text("print('train v1')\n")
    (root / "notes.tmp").write_text("excluded by .dockerignore\n")
    (root / ".dockerignore").write_text("*.tmp\n")
    (root / "job.yaml").write_text(
        f"name: {name}\n"
        "image:\n"
        "  vendor: cpu\n"
        f"  base: {base}\n"
        "  requirements: requirements.txt\n"
        f"{extra_image}"
        "command: [python, train.py]\n"
    )
    return root / "job.yaml"


@pytest.fixture
def tag(docker_client):
    """A unique tag per test; its images are removed afterwards (shared layers stay cached).

    noprune: the classic builder's cache is the untagged parent images of what it built, and
    another test's build may be using them at this moment (every write_job Dockerfile starts
    alike). Pruning them with the tag broke such a build: "image build failed at step 7/11 ...
    imagedb/content/sha256/...: no such file or directory"."""
    repo = f"wmctl-test/build-{uuid.uuid4().hex[:8]}"
    yield f"{repo}:v1"
    for image in docker_client.images.list(name=repo):
        for t in image.tags:
            docker_client.images.remove(t, force=True, noprune=True)


def steps_from_output(text: str) -> list[tuple[str, bool]]:
    """(instruction, used cache) per build step, from the plain progress lines."""
    steps: list[tuple[str, bool]] = []
    for line in text.splitlines():
        match = re.match(r"^Step \d+/\d+ : (.*)$", line)
        if match:
            steps.append((match.group(1), False))
        elif "Using cache" in line and steps:
            steps[-1] = (steps[-1][0], True)
    return steps


def run_in_image(client, image: str, script: str) -> str:
    out = client.containers.run(image, ["/bin/sh", "-c", script], remove=True, network_mode="none")
    return out.decode()


def test_build_image_carries_runtime_launcher_labels_and_torch(docker_client, base_image, tmp_path, tag):
    spec = write_job(tmp_path / "job", base_image)
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    result = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    out = run_in_image(docker_client, tag, (
        "python -c 'import orchestrator, torch, numpy; print(orchestrator.__version__); print(torch.__version__)'; "
        "command -v wmctl-bind; pwd; ls; echo PYTHONUNBUFFERED=$PYTHONUNBUFFERED"))
    lines = out.split()
    assert lines[0] == __version__
    assert lines[1].startswith("2.13.0")
    assert "/wmctl-bind" in out
    assert "/workspace" in lines
    assert "train.py" in lines and "job.yaml" in lines
    assert "notes.tmp" not in lines  # .dockerignore honoured
    assert "PYTHONUNBUFFERED=1" in lines

    labels = docker_client.images.get(tag).labels
    assert labels["io.wmctl.vendor"] == "cpu"
    assert labels["io.wmctl.version"] == __version__
    assert re.fullmatch(r"[0-9a-f]{12}", labels["io.wmctl.spec-hash"])
    assert labels["org.opencontainers.image.source"]
    # The build time is the image's own Created field, not a label: a label that changes with
    # every build would be a second step to run on every code change.
    assert "org.opencontainers.image.created" not in labels
    created = datetime.datetime.fromisoformat(docker_client.images.get(tag).attrs["Created"][:19] + "+00:00")
    assert started <= created <= datetime.datetime.now(datetime.timezone.utc)

    record = json.loads((spec.parent / ".wmctl" / "images.json").read_text())["tiny"]
    assert record["tag"] == tag
    assert record["image_id"] == docker_client.images.get(tag).id
    content = docker_client.images.get(record["content_tag"])
    assert content.id == record["image_id"]

    # Same context again: reported up to date, nothing rebuilt.
    again = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert "Step 1/" not in again.stdout
    assert docker_client.images.get(tag).id == record["image_id"]


def test_code_only_change_reuses_dependency_layers(docker_client, base_image, tmp_path, tag):
    spec = write_job(tmp_path / "job", base_image)
    first = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    built = steps_from_output(first.stdout)
    # Every layer that installs something went into the dependency image, before the code.
    kinds = {
        "torch": lambda i: i.startswith("RUN") and "torch==" in i,
        "requirements copy": lambda i: i.startswith("COPY") and "wmctl/req/" in i,
        "requirements install": lambda i: i.startswith("RUN") and "/tmp/wmctl/req/requirements.txt" in i,
        "runtime wheel copy": lambda i: i.startswith("COPY") and "wmctl/wheels/" in i,
        "runtime wheel install": lambda i: i.startswith("RUN") and "--no-deps" in i,
        "check": lambda i: i.startswith("RUN") and "wmctl-bind" in i,
    }
    code_from = next(i for i, (instr, _) in enumerate(built) if instr.startswith("FROM") and "wmctl-deps-" in instr)
    for kind, match in kinds.items():
        assert len([i for i, _ in built[:code_from] if match(i)]) == 1, (kind, built)
    deps_ref = built[code_from][0].split(None, 1)[1]
    deps_id = docker_client.images.get(deps_ref).id

    (spec.parent / "train.py").write_text("print('train v2')\n")
    second = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    steps = steps_from_output(second.stdout)
    # Only the job's own layers were built, FROM the same dependency image: no dependency step ran
    # or was even looked at; the labels were reused and the code's COPY is the one step that ran.
    assert [instr.split(None, 1)[0] for instr, _ in steps] == ["FROM", "LABEL", "COPY"], steps
    assert steps[0][0] == f"FROM {deps_ref}" and docker_client.images.get(deps_ref).id == deps_id
    assert steps[1][1] is True and steps[2][1] is False and '"src/"' in steps[2][0], steps
    assert not [instr for instr, _ in steps if any(match(instr) for match in kinds.values())]
    assert "train v2" in run_in_image(docker_client, tag, "python train.py")
    # The new image is the old one's dependency layers plus one: the code.
    old_layers = docker_client.images.get(deps_ref).attrs["RootFS"]["Layers"]
    new_layers = docker_client.images.get(tag).attrs["RootFS"]["Layers"]
    assert new_layers[:-1] == old_layers and len(new_layers) == len(old_layers) + 1


def test_spec_in_a_subfolder_with_nested_requirements_builds_and_stays_up_to_date(docker_client, base_image,
                                                                                   tmp_path, tag):
    # The spec (and so the build record) sits inside the context; requirements.txt names other files.
    project = tmp_path / "project"
    write_job(project, base_image, requirements="-r reqs/base.txt\n-c reqs/constraints.txt\n")
    (project / "reqs").mkdir()
    (project / "reqs" / "base.txt").write_text("numpy\n")
    (project / "reqs" / "constraints.txt").write_text("numpy>=1\n")
    (project / "deploy").mkdir()
    spec = project / "deploy" / "job.yaml"
    spec.write_text((project / "job.yaml").read_text().replace("  vendor: cpu\n", "  vendor: cpu\n  context: ..\n"))
    first = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (project / "deploy" / ".wmctl" / "images.json").is_file()
    out = run_in_image(docker_client, tag, "ls /tmp/wmctl/req/reqs; ls -a /workspace/deploy")
    assert "base.txt" in out and "constraints.txt" in out and ".wmctl" not in out

    again = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "up to date" in again.stdout and "Step 1/" not in again.stdout


def test_repointed_base_tag_is_not_up_to_date(docker_client, base_image, tmp_path, tag):
    # A tag of our own for the base, so re-pointing it touches neither the cached base nor its tags.
    alias_repo = f"wmctl-test/base-alias-{uuid.uuid4().hex[:8]}"
    alias = f"{alias_repo}:v1"
    docker_client.api.tag(base_image, alias_repo, "v1")
    try:
        spec = write_job(tmp_path / "job", alias)
        first = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        built = docker_client.images.get(tag).id
        # Same name, other bytes: the alias now means the image just built (it has python and torch).
        docker_client.api.tag(built, alias_repo, "v1")
        second = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "up to date" not in second.stdout
        assert docker_client.images.get(tag).id != built
    finally:
        docker_client.api.remove_image(alias, force=False, noprune=True)


def test_broken_requirement_fails_naming_the_step(docker_client, base_image, tmp_path, tag):
    spec = write_job(tmp_path / "job", base_image, requirements="numpy[\n")
    result = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "image build failed at step" in result.stderr
    assert "/tmp/wmctl/req/requirements.txt" in result.stderr
    assert "returned a non-zero code" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.xdist_group(WHEELS_IMAGES)
def test_wheelhouse_build_with_no_network(docker_client, base_image, tmp_path, tag):
    from orchestrator.imagebuild import engine, progress, wheel
    from orchestrator.commands.build_image import prepare

    spec = write_job(tmp_path / "job", base_image, requirements="six\n")
    wh = tmp_path / "wheelhouse"
    filled = run_wmctl("wheelhouse", str(spec), "--dir", str(wh), "--no-torch", cwd=tmp_path)
    assert filled.returncode == 0, filled.stderr
    assert any(p.name.startswith("six-") for p in wh.iterdir())

    _spec, plan = prepare(str(spec), tag=tag, wheelhouse=str(wh))
    assert plan.wheelhouse == wh.resolve()
    assert "--no-index" in plan.dockerfile
    reporter = progress.Reporter(quiet=True)
    result = engine.build_image(plan, wheel.build_wheel(), client=engine.connect(), reporter=reporter,
                                network_mode="none")
    assert not result.up_to_date
    assert run_in_image(docker_client, tag, "python -c 'import six; print(six.__version__)'").strip()


@pytest.mark.xdist_group(WHEELS_IMAGES)
def test_wheelhouse_build_names_the_missing_wheel(docker_client, base_image, tmp_path, tag):
    spec = write_job(tmp_path / "job", base_image, requirements="six\n")
    wh = tmp_path / "wheelhouse"
    assert run_wmctl("wheelhouse", str(spec), "--dir", str(wh), "--no-torch", cwd=tmp_path).returncode == 0
    # The requirements grow after the wheelhouse was filled: idna is not in it.
    (spec.parent / "requirements.txt").write_text("six\nidna\n")
    result = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), cwd=tmp_path)
    assert result.returncode == 3, result.stdout[-2000:]
    assert "the wheelhouse has no wheel for idna" in result.stderr
    assert "wmctl wheelhouse" in result.stderr
    assert "Traceback" not in result.stderr


def test_example_spec_builds_from_local_base(docker_client, base_image, tmp_path, tag):
    source = REPO_ROOT / "examples" / "worldmodel"
    if not (source / "job.yaml").is_file():
        pytest.fail(f"{source / 'job.yaml'} is missing: the example job must exist and build")
    # A copy, so the build record (.wmctl/images.json) lands in tmp, not in the repository.
    shutil.copytree(source, tmp_path / "worldmodel", ignore=shutil.ignore_patterns("__pycache__", ".wmctl"))
    example = tmp_path / "worldmodel" / "job.yaml"
    result = run_wmctl("build-image", str(example), "--tag", tag, "--set", f"image.base={base_image}",
                       cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = run_in_image(docker_client, tag, "python -c 'import orchestrator, torch; print(orchestrator.__version__)'; "
                                           "command -v wmctl-bind; ls")
    assert out.split()[0] == __version__
    assert "wmctl-bind" in out
    assert "train.py" in out.split()


class ContextRecorder:
    """The real engine's API (engine.connect()), with every build context it is sent kept (tar
    member names, bytes)."""

    def __init__(self, api):
        self._api = api
        self.sent: list[tuple[str, list[str], int]] = []   # (tag, member names, context bytes)

    def build(self, fileobj, **params):
        import io
        import tarfile

        data = fileobj.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.sent.append((params["tag"], tar.getnames(), len(data)))
        return self._api.build(io.BytesIO(data), **params)

    def __getattr__(self, name):
        return getattr(self._api, name)


@pytest.mark.xdist_group(WHEELS_IMAGES)
def test_code_only_rebuild_does_not_send_the_wheelhouse_again(docker_client, base_image, tmp_path, tag):
    from orchestrator.commands.build_image import prepare
    from orchestrator.imagebuild import engine, progress, wheel

    spec = write_job(tmp_path / "job", base_image, requirements="six\n")
    wh = tmp_path / "wheelhouse"
    filled = run_wmctl("wheelhouse", str(spec), "--dir", str(wh), "--no-torch", cwd=tmp_path)
    assert filled.returncode == 0, filled.stderr
    wheel_names = sorted(p.name for p in wh.iterdir())
    assert wheel_names
    recorder = ContextRecorder(engine.connect())
    runtime = wheel.build_wheel()

    def build():
        _spec, plan = prepare(str(spec), tag=tag, wheelhouse=str(wh), client=recorder)
        result = engine.build_image(plan, runtime, client=recorder, reporter=progress.Reporter(quiet=True),
                                    network_mode="none")
        assert not result.up_to_date
        return plan

    first = build()
    # The wheels went in a wheels image of their own (sent now, or by an earlier build of the same
    # wheels: the tag is their content), never in the job's context.
    wheels_tags = set(first.wheels_images.values())
    assert wheels_tags and all(engine.image_exists(recorder, ref) for ref in wheels_tags)
    for sent_tag, names, _ in recorder.sent:
        if sent_tag in wheels_tags:
            assert sorted(n.rsplit("/", 1)[-1] for n in names if n.endswith(".whl")) == wheel_names
    job_context = [names for t, names, _ in recorder.sent if t == tag]
    assert len(job_context) == 1 and not [n for n in job_context[0] if "wheelhouse" in n]

    recorder.sent.clear()
    (spec.parent / "train.py").write_text("print('train v2')\n")
    second = build()
    assert second.wheels_images == first.wheels_images
    # One context went to the engine: the job's, with the changed code and without a single wheel.
    assert [t for t, _, _ in recorder.sent] == [tag]
    names = recorder.sent[0][1]
    assert "src/train.py" in names and not [n for n in names if "wheelhouse" in n]
    # Not even the runtime wheel: it is in the dependency image, which the code is built FROM.
    assert set(names) == {"Dockerfile", "src"} | {n for n in names if n.startswith("src/")}
    assert run_in_image(docker_client, tag, "python train.py; python -c 'import six; print(six.__name__)'").split() \
        == ["train", "v2", "six"]


def _scratch_image(client, tag: str, labels: dict[str, str]) -> str:
    """A tiny image FROM scratch with ``labels``, tagged ``tag``: a stand-in for an old wheels image."""
    import io
    import tarfile

    dockerfile = "FROM scratch\n" + "".join(f'LABEL "{k}"="{v}"\n' for k, v in labels.items()) + \
        'COPY ["a.whl", "/wmctl/wheelhouse/a.whl"]\n'
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), ("a.whl", uuid.uuid4().bytes)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    image, _ = client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True)
    return image.id


@pytest.mark.xdist_group(WHEELS_IMAGES)
def test_stale_wheels_images_are_counted_and_pruned_only_when_wmctl_made_them(docker_client, base_image,
                                                                              tmp_path, tag):
    spec = write_job(tmp_path / "job", base_image, requirements="six\n")
    wh = tmp_path / "wheelhouse"
    assert run_wmctl("wheelhouse", str(spec), "--dir", str(wh), "--no-torch", cwd=tmp_path).returncode == 0
    first = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ours = [i for i in docker_client.images.list(name="wmctl/wheelhouse")
            if i.labels.get("io.wmctl.wheelhouse") == "wheels"]
    used = {t for i in ours for t in i.tags}
    assert used, "the build's wheels image carries no wmctl label"

    suffix = uuid.uuid4().hex[:12]
    old = f"wmctl/wheelhouse:deps-old{suffix}"                   # an earlier wheelhouse's, wmctl's label
    foreign = f"wmctl/wheelhouse:deps-foreign{suffix}"           # same repository, no wmctl label
    shared = f"wmctl-test/kept-{suffix}:v1"                      # wmctl's label, someone else's tag as well
    made = [_scratch_image(docker_client, old, {"io.wmctl.wheelhouse": "wheels"}),
            _scratch_image(docker_client, foreign, {"team": "x"})]
    shared_id = _scratch_image(docker_client, shared, {"io.wmctl.wheelhouse": "wheels"})
    docker_client.api.tag(shared_id, "wmctl/wheelhouse", f"deps-shared{suffix}")
    try:
        # Up to date: no image is listed (that walk costs the engine), so nothing is said.
        same = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), cwd=tmp_path)
        assert "up to date" in same.stdout and "note:" not in same.stdout, same.stdout
        # A dependency change makes a new wheels image and leaves the first build's behind: said.
        make_wheel(wh, f"extra{suffix}")
        changed = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), cwd=tmp_path)
        assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
        note = re.search(r"note: (\d+) wheels image\(s\) of other wheelhouses .* --prune-wheels", changed.stdout)
        assert note and int(note.group(1)) >= 3, changed.stdout
        current = {t for i in docker_client.images.list(name="wmctl/wheelhouse") for t in i.tags
                   if i.labels.get("io.wmctl.wheelhouse")} - used - {old, f"wmctl/wheelhouse:deps-shared{suffix}"}
        assert current, "the dependency change made no new wheels image"

        pruned = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), "--prune-wheels",
                           cwd=tmp_path)
        assert pruned.returncode == 0, pruned.stdout[-3000:] + pruned.stderr[-3000:]
        assert re.search(r"removed \d+ wheels image\(s\)", pruned.stdout), pruned.stdout
        tags = {t for i in docker_client.images.list() for t in i.tags}
        assert old not in tags and f"wmctl/wheelhouse:deps-shared{suffix}" not in tags
        assert not (used - current) & tags                 # the first build's deps image went too
        assert foreign in tags and shared in tags          # not wmctl's, or tagged by someone else too
        assert current <= tags                             # the build's own wheels images stay
        again = run_wmctl("build-image", str(spec), "--tag", tag, "--wheelhouse", str(wh), "--prune-wheels",
                          cwd=tmp_path)
        assert "removed 0 wheels image(s)" in again.stdout and "up to date" in again.stdout
    finally:
        for ref in (old, foreign, shared):
            if ref in {t for i in docker_client.images.list() for t in i.tags}:
                docker_client.images.remove(ref, force=True)
        import docker.errors

        for image_id in made:
            try:
                docker_client.images.remove(image_id, force=True)
            except docker.errors.ImageNotFound:       # already gone with its tag
                pass
