"""Rendered Dockerfiles are kept between processes: a rebuild with the same inputs reads the text
back instead of importing Jinja and compiling the template, and anything that decides the text
(the template, an input, the filters' code) renders it anew."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.imagebuild import dockerfile
from orchestrator.imagebuild.dockerfile import DockerfileInputs, render_dockerfile

INPUTS = DockerfileInputs(job_name="tiny", vendor="cpu", base="wmctl-test/base:x", python="python3",
                          workdir="/workspace", wheel_name="wmctl-0.1.0-py3-none-any.whl", wmctl_version="0.1.0",
                          labels=(("io.wmctl.job", "tiny"),))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / dockerfile.RENDER_CACHE_DIR


def _no_compile(monkeypatch):
    def compiled(template_text):
        raise AssertionError("the template was rendered again")

    monkeypatch.setattr(dockerfile, "_compiled", compiled)


def test_the_same_inputs_read_the_kept_text_without_rendering(cache, monkeypatch):
    first = render_dockerfile(INPUTS)
    assert len(list(cache.glob("*.Dockerfile"))) == 1
    _no_compile(monkeypatch)
    assert render_dockerfile(INPUTS) == first


def test_another_input_template_or_filter_code_renders_anew(cache, monkeypatch):
    first = render_dockerfile(INPUTS)
    other = render_dockerfile(dataclasses.replace(INPUTS, workdir="/srv/job"))
    assert "WORKDIR /srv/job" in other and other != first
    template = (dockerfile.Path(dockerfile.__file__).parents[2] / "templates" / "Dockerfile.j2").read_text()
    assert render_dockerfile(INPUTS, template + "# one more line\n").endswith("# one more line\n")
    monkeypatch.setattr(dockerfile, "_renderer_identity", lambda: "the filters changed")
    calls = []
    real = dockerfile._compiled
    def counted(text):
        calls.append(1)
        return real(text)
    monkeypatch.setattr(dockerfile, "_compiled", counted)
    assert render_dockerfile(INPUTS) == first and calls == [1]


def test_a_cache_folder_that_cannot_be_written_renders_the_same(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(tmp_path / "ok"))
    expected = render_dockerfile(INPUTS)
    monkeypatch.setenv("WMCTL_CACHE_DIR", str(blocker))       # mkdir under a file fails
    assert render_dockerfile(INPUTS) == expected


def test_old_texts_are_dropped_past_the_limit(cache, monkeypatch):
    monkeypatch.setattr(dockerfile, "RENDER_CACHE_KEEP", 3)
    for n in range(5):
        render_dockerfile(dataclasses.replace(INPUTS, labels=(("org.opencontainers.image.revision", f"r{n}"),)))
    assert len(list(cache.glob("*.Dockerfile"))) == 3
