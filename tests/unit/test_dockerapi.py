"""The build's Engine API calls over a unix socket (orchestrator.adaptors.dockerapi), against a
real socket served by a thread here: requests as the engine reads them, chunked streams cut
anywhere, refusals in the engine's words, an engine that is not there. tests/docker/test_build.py
runs the same client against the real engine."""

from __future__ import annotations

import io
import json
import socket
import threading
from pathlib import Path

import pytest

from orchestrator.adaptors import dockerapi
from orchestrator.adaptors.dockerapi import EngineAPIError, SdkImages, SocketImages, json_stream, local_socket
from orchestrator.errors import EngineUnavailable


class Engine:
    """A unix-socket HTTP server answering each request with the next canned response; it keeps
    every request (head, body) it read."""

    def __init__(self, path: Path, responses: list[bytes], read_body: bool = True):
        self.responses = list(responses)
        self.requests: list[tuple[str, bytes]] = []
        self.read_body = read_body
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.responses:
            conn, _ = self.server.accept()
            with conn:
                fh = conn.makefile("rb")
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    head += fh.readline()
                text = head.decode("latin-1")
                length = next((int(line.split(":", 1)[1]) for line in text.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)
                body = fh.read(length) if self.read_body else b""
                self.requests.append((text, body))
                conn.sendall(self.responses.pop(0))
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


def http(status: int, body: bytes, *, chunks: list[bytes] | None = None) -> bytes:
    reason = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}[status]
    if chunks is None:
        return f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    out = f"HTTP/1.1 {status} {reason}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    for chunk in chunks:
        out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    return out + b"0\r\n\r\n"


@pytest.fixture
def engine(tmp_path):
    made: list[Engine] = []

    def make(*responses: bytes, read_body: bool = True) -> tuple[Engine, SocketImages]:
        path = tmp_path / f"engine{len(made)}.sock"
        made.append(Engine(path, list(responses), read_body))
        return made[-1], SocketImages(str(path))

    yield make
    for e in made:
        e.close()


def test_json_messages_cut_anywhere_come_out_whole():
    text = '{"stream": "Step 1/2 : FROM x\\n"}\r\n{"stream": "ünï ✓\\n"}\r\n{"aux": {"ID": "sha256:ab"}}\r\n'
    data = text.encode()
    for size in (1, 2, 3, 7, len(data)):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        assert list(json_stream(iter(chunks))) == [
            {"stream": "Step 1/2 : FROM x\n"}, {"stream": "ünï ✓\n"}, {"aux": {"ID": "sha256:ab"}}]


def test_build_sends_the_context_and_query_and_streams_the_messages(engine):
    messages = [b'{"stream":"Step 1/1 : FROM x\\n"}\r\n{"aux":', b'{"ID":"sha256:ab"}}\r\n',
                b'{"stream":"done\\n"}\r\n']
    server, api = engine(http(200, b"", chunks=messages))
    context = io.BytesIO(b"x" * 100_000)
    got = list(api.build(context, tag="team/wm:v1", no_cache=True, build_args={"A": "1 2"}, network_mode="none"))
    assert got == [{"stream": "Step 1/1 : FROM x\n"}, {"aux": {"ID": "sha256:ab"}}, {"stream": "done\n"}]
    head, body = server.requests[0]
    assert head.startswith("POST /build?") and "t=team%2Fwm%3Av1" in head and "nocache=1" in head
    assert "networkmode=none" in head and "buildargs=%7B%22A%22%3A+%221+2%22%7D" in head
    assert "Content-Type: application/x-tar" in head
    assert body == b"x" * 100_000


def test_a_build_from_a_real_file_is_sent_from_where_it_stands(engine, tmp_path):
    server, api = engine(http(200, b"", chunks=[b'{"stream":"ok\\n"}\r\n']))
    path = tmp_path / "ctx.tar"
    path.write_bytes(b"head" + b"y" * 70_000)
    with open(path, "rb") as fh:
        fh.seek(4)
        assert list(api.build(fh, tag="a:b")) == [{"stream": "ok\n"}]
    assert server.requests[0][1] == b"y" * 70_000


def test_a_refused_build_raises_the_engines_words_even_before_the_body_is_read(engine):
    server, api = engine(http(500, json.dumps({"message": "Cannot locate specified Dockerfile"}).encode()),
                         read_body=False)
    with pytest.raises(EngineAPIError) as info:
        list(api.build(io.BytesIO(b"z" * 4_000_000), tag="a:b"))
    assert info.value.status == 500 and info.value.explanation == "Cannot locate specified Dockerfile"


def test_image_id_tag_list_and_remove(engine):
    server, api = engine(
        http(200, json.dumps({"Id": "sha256:" + "c" * 64}).encode()),
        http(404, b'{"message":"No such image: a:b"}'),
        http(201, b""),
        http(200, json.dumps([{"Id": "sha256:1", "RepoTags": ["wmctl/wheelhouse:deps-1"]}]).encode()),
        http(200, b"[]"),
        http(500, b'{"message":"conflict: image is in use"}'),
    )
    assert api.image_id("team/wm@sha256:" + "d" * 64) == "sha256:" + "c" * 64
    assert api.image_id("a:b") is None
    api.tag("sha256:" + "c" * 64, "team/wm", "v2")
    assert api.list_images("io.wmctl.wheelhouse") == [{"Id": "sha256:1", "RepoTags": ["wmctl/wheelhouse:deps-1"]}]
    api.remove_image("wmctl/wheelhouse:deps-1")
    with pytest.raises(EngineAPIError, match="image is in use"):
        api.remove_image("wmctl/wheelhouse:deps-2")
    heads = [head.split("\r\n", 1)[0] for head, _ in server.requests]
    assert heads[0] == f"GET /images/team/wm%40sha256:{'d' * 64}/json HTTP/1.1"
    assert heads[2] == f"POST /images/sha256:{'c' * 64}/tag?repo=team%2Fwm&tag=v2 HTTP/1.1"
    assert heads[3].startswith("GET /images/json?filters=") and "io.wmctl.wheelhouse" in heads[3].replace("%2E", ".")
    assert heads[4] == "DELETE /images/wmctl/wheelhouse:deps-1?force=0&noprune=0 HTTP/1.1"


def test_no_engine_at_the_socket_is_engine_unavailable_with_the_hint(tmp_path):
    api = SocketImages(str(tmp_path / "nothing.sock"))
    with pytest.raises(EngineUnavailable) as info:
        api.image_id("a:b")
    assert "cannot reach the Docker engine" in info.value.message and "DOCKER_HOST" in (info.value.hint or "")


def test_a_malformed_chunk_is_engine_unavailable_not_a_traceback(engine):
    _server, api = engine(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    with pytest.raises(EngineUnavailable, match="malformed chunk"):
        list(api.build(io.BytesIO(b"x"), tag="a:b"))


def test_a_peer_that_does_not_speak_http_is_engine_unavailable(engine):
    _server, api = engine(b"SSH-2.0-OpenSSH_9.2\r\n")
    with pytest.raises(EngineUnavailable, match="not HTTP"):
        api.image_id("a:b")


@pytest.mark.parametrize("host, path", [
    ("", "/var/run/docker.sock"), ("unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock"),
    ("tcp://10.0.0.5:2376", None), ("ssh://me@builder", None)])
def test_only_the_local_socket_is_spoken_to_without_the_sdk(monkeypatch, host, path):
    monkeypatch.setenv("DOCKER_HOST", host)
    assert local_socket() == path


def test_a_base_the_engine_lacks_is_built_through_the_sdk(monkeypatch, tmp_path):
    from orchestrator.imagebuild import engine as build_engine

    from .test_dockerfile import plan_for, write_spec

    sdk_client = object()
    monkeypatch.setattr(build_engine, "get_client", lambda *a, **k: sdk_client)
    api = SocketImages(str(tmp_path / "engine.sock"))
    plan = plan_for(write_spec(tmp_path / "job"))
    assert plan.base_image_id is None
    chosen = build_engine.for_build(api, plan, pull=False)
    assert isinstance(chosen, SdkImages) and chosen.client is sdk_client
    plan.base_image_id = "sha256:" + "e" * 64
    assert build_engine.for_build(api, plan, pull=False) is api
    assert isinstance(build_engine.for_build(api, plan, pull=True), SdkImages)
    assert dockerapi.build_query(tag="a:b", pull=True)["pull"] == "1"
