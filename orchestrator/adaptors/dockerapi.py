"""The few Docker Engine API calls an image build makes, over the local unix socket, without the SDK.

Why: a code-only rebuild is one COPY step for the engine, a fraction of a second; importing the
Docker SDK (requests, urllib3, charset_normalizer, idna, email, ssl, ...: some 200 modules) was a
third of what the whole `wmctl build-image` process took around it. Here the calls are plain
HTTP/1.1 over ``socket`` with ``json``, one connection per call (``Connection: close``), paths
without an API version (the engine answers at its own).

Only for what needs no registry: inspect, tag, list and remove images, and a build whose base
image the engine already has (a missing base is pulled by the engine with the credentials the
SDK sends, so that build goes through the SDK). Remote engines (tcp://, ssh://, TLS) and pushes
keep the SDK. ``SdkImages`` offers the same calls through an SDK client, for those.
"""

from __future__ import annotations

import json
import os
import socket
from typing import IO, Any, Iterator, Protocol
from urllib.parse import quote, urlencode

from ..errors import EngineUnavailable
from .docker import ENGINE_HINT, where

DEFAULT_SOCKET = "/var/run/docker.sock"
CALL_TIMEOUT_S = 120          # inspect, tag, list, remove; a build's stream has no read timeout (as the SDK's)


class EngineAPIError(Exception):
    """The engine refused a call: its HTTP status and its own words."""

    def __init__(self, status: int, explanation: str):
        super().__init__(f"{status}: {explanation}")
        self.status = status
        self.explanation = explanation


class ImageAPI(Protocol):
    """What the image build needs from an engine: ``SocketImages`` or ``SdkImages``."""

    def image_id(self, ref: str) -> str | None: ...

    def tag(self, image: str, repo: str, tag: str) -> None: ...

    def build(self, fileobj: IO[bytes], **params: Any) -> Iterator[dict[str, Any]]: ...

    def list_images(self, label: str) -> list[dict[str, Any]]: ...

    def remove_image(self, ref: str) -> None: ...


def local_socket() -> str | None:
    """The socket path when the Docker environment names the local engine (DOCKER_HOST unset or
    unix://), else None: a remote engine goes through the SDK."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://"):] or DEFAULT_SOCKET
    return None


def build_query(*, tag: str, no_cache: bool = False, pull: bool = False, build_args: dict[str, str] | None = None,
                platform: str | None = None, network_mode: str | None = None) -> dict[str, str]:
    """POST /build's query, as the SDK's ``api.build`` sends it for the same arguments."""
    query = {"t": tag, "dockerfile": "Dockerfile", "rm": "1", "forcerm": "1",
             "nocache": "1" if no_cache else "0", "pull": "1" if pull else "0"}
    if build_args:
        query["buildargs"] = json.dumps(build_args)
    if platform:
        query["platform"] = platform
    if network_mode:
        query["networkmode"] = network_mode
    return query


class _Response:
    """Status, headers and a body reader over one connection's file."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fh = sock.makefile("rb")
        status_line = self.fh.readline(65537).decode("latin-1")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            self.close()
            raise EngineUnavailable(f"the Docker engine at {where()} answered something that is not HTTP: "
                                    f"{status_line[:200]!r}", hint=ENGINE_HINT)
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        while True:
            line = self.fh.readline(65537).decode("latin-1").rstrip("\r\n")
            if not line:
                break
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (chunked, sized, or up to the close)."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = self.fh.readline(65537)
                if not size_line:
                    return
                try:
                    size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    raise EngineUnavailable(f"the Docker engine at {where()} sent a malformed chunk: "
                                            f"{size_line[:80]!r}", hint=ENGINE_HINT) from None
                if size == 0:
                    return
                data = self.fh.read(size)
                self.fh.readline()                    # the CRLF after each chunk
                if data:
                    yield data
        elif "content-length" in self.headers:
            data = self.fh.read(int(self.headers["content-length"]))
            if data:
                yield data
        else:
            while True:
                data = self.fh.read1(65536)
                if not data:
                    return
                yield data

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def close(self) -> None:
        self.fh.close()
        self.sock.close()


def _explanation(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return message if isinstance(message, str) and message else text[:2000]


def json_stream(chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """The engine's stream of JSON messages, whatever the chunk boundaries."""
    decoder = json.JSONDecoder()
    buf = ""
    tail = b""
    for chunk in chunks:
        data = tail + chunk
        try:
            buf += data.decode("utf-8")
            tail = b""
        except UnicodeDecodeError as exc:         # a character cut by the chunk boundary
            buf += data[:exc.start].decode("utf-8")
            tail = data[exc.start:]
        while True:
            start = len(buf) - len(buf.lstrip())
            if start == len(buf):
                buf = ""
                break
            try:
                obj, end = decoder.raw_decode(buf, start)
            except ValueError:
                buf = buf[start:]
                break                                 # the rest of this message is still coming
            buf = buf[end:]
            if isinstance(obj, dict):
                yield obj


class SocketImages:
    """``ImageAPI`` over the local unix socket (``local_socket()``)."""

    def __init__(self, path: str, timeout: float = CALL_TIMEOUT_S):
        self.path = path
        self.timeout = timeout

    def _open(self, method: str, path: str, query: dict[str, str] | None = None,
              body: IO[bytes] | bytes | None = None, content_type: str | None = None,
              timeout: float | None = CALL_TIMEOUT_S) -> _Response:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout if timeout is not None else None)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"cannot reach the Docker engine at {where()}: {exc}", hint=ENGINE_HINT) from None
        target = path + ("?" + urlencode(query) if query else "")
        size = 0
        if isinstance(body, bytes):
            size = len(body)
        elif body is not None:
            start = body.tell()
            size = body.seek(0, os.SEEK_END) - start
            body.seek(start)
        head = [f"{method} {target} HTTP/1.1", "Host: docker", "User-Agent: wmctl", "Connection: close",
                f"Content-Length: {size}"]
        if content_type:
            head.append(f"Content-Type: {content_type}")
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if isinstance(body, bytes):
                sock.sendall(body)
            elif body is not None:
                sock.sendfile(body, offset=body.tell())
        except (BrokenPipeError, ConnectionResetError):
            pass                                      # the engine answered early (an error): read it below
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"the Docker engine at {where()} failed while receiving a request: {exc}",
                                    hint=ENGINE_HINT) from None
        try:
            return _Response(sock)
        except OSError as exc:
            sock.close()
            raise EngineUnavailable(f"the Docker engine at {where()} did not answer: {exc}", hint=ENGINE_HINT) from None

    def _call(self, method: str, path: str, query: dict[str, str] | None = None) -> tuple[int, bytes]:
        response = self._open(method, path, query)
        try:
            return response.status, response.read()
        except OSError as exc:
            raise EngineUnavailable(f"the Docker engine at {where()} stopped answering: {exc}",
                                    hint=ENGINE_HINT) from None
        finally:
            response.close()

    def image_id(self, ref: str) -> str | None:
        status, body = self._call("GET", f"/images/{quote(ref, safe='/:')}/json")
        if status == 404:
            return None
        if status != 200:
            raise EngineAPIError(status, _explanation(body))
        found = json.loads(body).get("Id")
        return found if isinstance(found, str) else None

    def tag(self, image: str, repo: str, tag: str) -> None:
        status, body = self._call("POST", f"/images/{quote(image, safe='/:')}/tag", {"repo": repo, "tag": tag})
        if status not in (200, 201):
            raise EngineAPIError(status, _explanation(body))

    def list_images(self, label: str) -> list[dict[str, Any]]:
        status, body = self._call("GET", "/images/json", {"filters": json.dumps({"label": [label]})})
        if status != 200:
            raise EngineAPIError(status, _explanation(body))
        found = json.loads(body)
        return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []

    def remove_image(self, ref: str) -> None:
        status, body = self._call("DELETE", f"/images/{quote(ref, safe='/:')}", {"force": "0", "noprune": "0"})
        if status not in (200, 404):
            raise EngineAPIError(status, _explanation(body))

    def build(self, fileobj: IO[bytes], **params: Any) -> Iterator[dict[str, Any]]:
        """POST /build of the context tar ``fileobj``; ``params`` as ``build_query`` takes them.
        The engine's messages, as they come."""
        response = self._open("POST", "/build", build_query(**params), body=fileobj,
                              content_type="application/x-tar", timeout=None)
        try:
            if response.status != 200:
                raise EngineAPIError(response.status, _explanation(response.read()))
            yield from json_stream(response.chunks())
        except OSError as exc:
            raise EngineUnavailable(f"the Docker engine at {where()} stopped answering during the build: {exc}",
                                    hint=ENGINE_HINT) from None
        finally:
            response.close()


class SdkImages:
    """``ImageAPI`` through a Docker SDK client (remote engines, builds that may pull)."""

    def __init__(self, client: Any):
        self.client = client

    def _errors(self) -> tuple[Any, Any]:
        from .docker import errors

        return errors()

    def image_id(self, ref: str) -> str | None:
        docker_errors, _ = self._errors()
        try:
            return str(self.client.images.get(ref).id)
        except docker_errors.ImageNotFound:
            return None
        except docker_errors.APIError as exc:
            raise EngineAPIError(exc.status_code or 500, exc.explanation or str(exc)) from None

    def tag(self, image: str, repo: str, tag: str) -> None:
        docker_errors, _ = self._errors()
        try:
            self.client.api.tag(image, repo, tag)
        except docker_errors.APIError as exc:
            raise EngineAPIError(exc.status_code or 500, exc.explanation or str(exc)) from None

    def list_images(self, label: str) -> list[dict[str, Any]]:
        return list(self.client.api.images(filters={"label": label}))

    def remove_image(self, ref: str) -> None:
        docker_errors, _ = self._errors()
        try:
            self.client.api.remove_image(ref, force=False, noprune=False)
        except docker_errors.ImageNotFound:
            pass

    def build(self, fileobj: IO[bytes], **params: Any) -> Iterator[dict[str, Any]]:
        docker_errors, rexc = self._errors()
        try:
            yield from self.client.api.build(
                fileobj=fileobj, custom_context=True, dockerfile="Dockerfile", tag=params["tag"], rm=True,
                forcerm=True, nocache=params.get("no_cache", False), pull=params.get("pull", False),
                buildargs=params.get("build_args") or None, platform=params.get("platform"),
                network_mode=params.get("network_mode"), decode=True)
        except docker_errors.APIError as exc:
            raise EngineAPIError(exc.status_code or 500, exc.explanation or str(exc)) from None
        except (docker_errors.DockerException, rexc.ConnectionError) as exc:
            raise EngineUnavailable(f"the Docker engine failed during the build: {exc}", hint=ENGINE_HINT) from None
