"""`wmctl build-image --push` to a real local registry (Debian's docker-registry), pull by digest."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import free_port, run_wmctl, start_registry, stop_registry
from .test_build import write_job

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


def _remove_repo(client, repo: str) -> None:
    import docker.errors

    for image in client.images.list(name=repo):
        refs = list(image.tags) + [d for d in image.attrs.get("RepoDigests", []) if d.startswith(repo + "@")]
        for ref in refs:
            try:
                client.images.remove(ref, force=True, noprune=True)   # as test_build's tag fixture
            except docker.errors.ImageNotFound:
                pass  # removing the last tag already removed the image


def _rendered_images(spec, tag, tmp_path) -> tuple[set[str], str]:
    result = run_wmctl("submit", str(spec), "--dry-run", "-b", "docker", "-o", "json", "--image", tag, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    plan = json.loads(result.stdout)
    return {r["create"]["image"] for r in plan["resources"] if r.get("kind") == "container"}, result.stderr


def test_push_records_the_digest_submit_runs_it_pulled_back_by_it_until_a_rebuild_without_push(
        docker_client, base_image, registry, tmp_path):
    """One push (a push sends the whole torch base, about a gigabyte gzipped: CI's most expensive
    seconds, so every claim about a pushed image is checked on this one): the digest is recorded;
    submit runs that digest; the image, forgotten locally, pulls back by the digest alone and runs;
    new code built without --push no longer claims the old digest."""
    repo = f"{registry}/wmctl-test/pushed"
    tag = f"{repo}:v1"
    spec = write_job(tmp_path / "job", base_image)
    try:
        result = run_wmctl("build-image", str(spec), "--tag", tag, "--push", cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        match = re.search(r"^digest: (\S+@sha256:[0-9a-f]{64})$", result.stdout, re.M)
        assert match, result.stdout[-2000:]
        ref = match.group(1)
        assert ref.startswith(repo + "@")

        record = json.loads((spec.parent / ".wmctl" / "images.json").read_text())["tiny"]
        assert record["repo_digest"] == ref
        built_id = record["image_id"]

        from orchestrator.imagebuild.record import image_ref_for_submit

        assert image_ref_for_submit(spec, "tiny", tag) == ref
        used, note = _rendered_images(spec, tag, tmp_path)
        assert used == {ref}
        assert "pinned to digest" in note

        # Forget the image locally, then pull it back by digest alone.
        _remove_repo(docker_client, repo)
        pulled = docker_client.images.pull(ref)
        assert pulled.id == built_id
        out = docker_client.containers.run(ref, ["python", "-c", "import orchestrator; print('ok')"],
                                           remove=True, network_mode="none")
        assert out.decode().strip() == "ok"

        # New code, built but not pushed: the old digest no longer describes the tag.
        (spec.parent / "train.py").write_text("print('train v2')\n")
        rebuilt = run_wmctl("build-image", str(spec), "--tag", tag, cwd=tmp_path)
        assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr[-3000:]
        record = json.loads((spec.parent / ".wmctl" / "images.json").read_text())["tiny"]
        assert "repo_digest" not in record and "digest" not in record
        used, note = _rendered_images(spec, tag, tmp_path)
        assert used == {tag} and "pinned" not in note
    finally:
        _remove_repo(docker_client, repo)


def test_push_to_unreachable_registry_is_a_clear_error(docker_client, base_image, tmp_path):
    port = free_port()  # nothing listens there
    tag = f"127.0.0.1:{port}/wmctl-test/nowhere:v1"
    spec = write_job(tmp_path / "job", base_image)
    try:
        result = run_wmctl("build-image", str(spec), "--tag", tag, "--push", "-q", cwd=tmp_path)
        assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
        assert f"cannot reach registry 127.0.0.1:{port}" in result.stderr
        assert "hint:" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        _remove_repo(docker_client, f"127.0.0.1:{port}/wmctl-test/nowhere")


def test_push_refused_by_registry_auth_is_a_clear_error(docker_client, base_image, tmp_path):
    address, proc, _log = start_registry(tmp_path / "registry", auth="htpasswd")
    repo = f"{address}/wmctl-test/private"
    spec = write_job(tmp_path / "job", base_image)
    try:
        result = run_wmctl("build-image", str(spec), "--tag", f"{repo}:v1", "--push", "-q", cwd=tmp_path)
        assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
        assert f"push to {address} was refused" in result.stderr
        assert f"docker login {address}" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        stop_registry(proc)
        _remove_repo(docker_client, repo)


def test_push_without_registry_in_tag_is_refused_before_pushing(docker_client, base_image, tmp_path):
    spec = write_job(tmp_path / "job", base_image)
    try:
        result = run_wmctl("build-image", str(spec), "--tag", "wmctl-test/noregistry:v1", "--push", "-q",
                           cwd=tmp_path)
        assert result.returncode == 3
        assert "names no registry" in result.stderr
    finally:
        _remove_repo(docker_client, "wmctl-test/noregistry")


def test_the_registry_fixture_moves_on_when_its_port_is_taken(tmp_path):
    """The port free_port() found can be taken before docker-registry binds it. The fixture must
    not take the other server for the registry (it answers HTTP too) and must start the registry
    on another port. Needs only docker-registry, not the engine."""
    import http.server
    import threading

    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    offered = iter([taken, free_port()])
    try:
        address, proc, _log = start_registry(tmp_path / "registry", ports=lambda: next(offered))
    finally:
        squatter.shutdown()
        squatter.server_close()
    try:
        assert address != f"127.0.0.1:{taken}" and proc.poll() is None
    finally:
        stop_registry(proc)
