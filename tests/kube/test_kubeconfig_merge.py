"""$KUBECONFIG with several files is merged as kubectl merges them (client-go clientcmd
loader.go; "Merging kubeconfig files" in the kubeconfig documentation): the first file to name a
cluster, user or context wins, and so does the first current-context."""

from __future__ import annotations

import os

import pytest
import yaml

from orchestrator.adaptors.kubernetes import load_api_client
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import EngineUnavailable


def _write(path, *, current, clusters, contexts):
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", **({"current-context": current} if current else {}),
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in clusters.items()],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": c, "user": "u"}} for n, c in contexts.items()]}))
    return str(path)


@pytest.fixture
def two_files(fake_api, tmp_path):
    good, dead = fake_api.server.url, "http://127.0.0.1:9"
    # first: current-context "first" on the fake; a cluster "shared" that is the fake
    a = _write(tmp_path / "a", current="first", clusters={"fake": good, "shared": good},
               contexts={"first": "fake", "via-shared": "shared"})
    # second: its own current-context (dead), a context only it has, and a "shared" that is dead
    b = _write(tmp_path / "b", current="second", clusters={"dead": dead, "shared": dead, "fake2": good},
               contexts={"second": "dead", "only-in-b": "fake2"})
    return a, b


def test_the_first_files_current_context_wins(two_files, fake_api, monkeypatch):
    """The Python client's own merger lets the last file's current-context win (here: a dead
    server); kubectl takes the first."""
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(two_files))
    assert load_api_client().configuration.host == fake_api.server.url


def test_a_context_of_the_second_file_is_found(two_files, fake_api, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(two_files))
    b = KubernetesBackend(context="only-in-b", watch_timeout=2)
    try:
        assert b.attempts("nothing") == []          # reached the fake through the second file
    finally:
        b.close()


def test_the_first_definition_of_a_name_wins(two_files, fake_api, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(two_files))
    assert load_api_client("via-shared").configuration.host == fake_api.server.url


def test_missing_files_are_skipped_and_none_at_all_is_a_clear_error(two_files, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), two_files[1]]))
    assert load_api_client("only-in-b").configuration.host.startswith("http://127.0.0.1:")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(EngineUnavailable) as err:
        load_api_client()
    assert "KUBECONFIG" in str(err.value)


def test_an_explicit_kubeconfig_may_list_several_files_too(two_files, fake_api, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert load_api_client("only-in-b", os.pathsep.join(two_files)).configuration.host == fake_api.server.url
