"""A PEP 503 simple package index served over HTTP on 127.0.0.1, for tests that need pip to read
a real index (the PyTorch CPU index and PyPI cannot be reached from the test machines).

Layout, as PEP 503 describes it: ``/simple/`` lists every project, ``/simple/<normalized name>/``
lists that project's files, each link ending in ``#sha256=<digest>`` (which pip checks); the files
themselves are under ``/files/``. Every request path is recorded, so a test can tell which index
served which file.
"""

from __future__ import annotations

import hashlib
import html
import re
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Iterator
from urllib.parse import quote


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class SimpleIndex:
    url: str                           # http://127.0.0.1:PORT/simple/
    requests: list[str] = field(default_factory=list)

    def served(self, suffix: str) -> bool:
        """Whether a GET for a path ending in ``suffix`` (e.g. a wheel's file name) came in."""
        return any(path.split("#", 1)[0].endswith(quote(suffix)) or path.endswith(suffix)
                   for path in self.requests)


def _write_index(root: Path, wheels: Iterable[Path]) -> None:
    files = root / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        shutil.copyfile(wheel, files / wheel.name)
        projects.setdefault(normalize(wheel.name.split("-", 1)[0]), []).append(files / wheel.name)
    simple = root / "simple"
    simple.mkdir()
    links = "".join(f'<a href="{quote(name)}/">{html.escape(name)}</a>\n' for name in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for name, paths in projects.items():
        (simple / name).mkdir()
        rows = "".join(
            f'<a href="../../files/{quote(p.name)}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">'
            f"{html.escape(p.name)}</a>\n" for p in sorted(paths))
        (simple / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{rows}</body></html>\n")


@contextmanager
def serve_index(root: Path, wheels: Iterable[Path]) -> Iterator[SimpleIndex]:
    """Copy ``wheels`` into a PEP 503 layout under ``root`` and serve it until the block ends."""
    _write_index(root, wheels)
    index = SimpleIndex(url="")

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            index.requests.append(self.path)
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    index.url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    thread = threading.Thread(target=server.serve_forever, name="simple-index", daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


PIP_SETTINGS_CLEARED = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX",
                        "PIP_TRUSTED_HOST", "PIP_REQUIREMENT")


def pip_env(monkeypatch, default_index: SimpleIndex) -> None:
    """Make ``default_index`` pip's own index (the stand-in for PyPI) for every pip this test
    starts, with no configuration file (this machine's finds torch on local disk) and no cache
    (every file is fetched from the servers, so their request logs tell where it came from)."""
    import os

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in PIP_SETTINGS_CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", default_index.url)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")


def _arch() -> str:
    from orchestrator.commands.wheelhouse import host_arch

    return host_arch()


CPU_TORCH = f"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_{_arch()}.whl"
CUDA_TORCH = f"torch-2.13.0-cp311-cp311-manylinux_2_28_{_arch()}.whl"


@contextmanager
def cpu_and_default_indexes(tmp_path: Path, monkeypatch) -> Iterator[tuple[SimpleIndex, SimpleIndex]]:
    """Two indexes on 127.0.0.1: "PyPI" (pip's own index, through ``pip_env``) with torch 2.13.0
    as PyPI has it, the CUDA build that pulls nvidia-* wheels, plus numpy, filelock and six; and
    the "CPU index" with only torch 2.13.0+cpu (whose ``__version__`` says so). The cpu profile (a
    copy of images/cpu.yaml, found first on WMCTL_VENDOR_PATH) names the second as its
    torch_index_url. Yields (pypi, cpu_index)."""
    from orchestrator.resources import images_dir
    from orchestrator.runtime.protocol import ENV_VENDOR_PATH

    from .test_dockerfile import make_wheel

    wheels = tmp_path / "built"
    (wheels / "cpu").mkdir(parents=True)
    tag = f"cp311-cp311-manylinux_2_28_{_arch()}"
    cuda = make_wheel(wheels, "torch", "2.13.0", requires=["filelock", "nvidia-cublas"], tag=tag,
                      init="__version__ = '2.13.0'\n")
    cpu = make_wheel(wheels / "cpu", "torch", "2.13.0+cpu", requires=["filelock"], tag=tag,
                     init="__version__ = '2.13.0+cpu'\n")
    default_wheels = [cuda, make_wheel(wheels, "nvidia_cublas", "13.0"), make_wheel(wheels, "numpy", "2.0.0"),
                      make_wheel(wheels, "filelock", "3.0"), make_wheel(wheels, "six", "1.16.0")]
    with serve_index(tmp_path / "pypi", default_wheels) as pypi, \
            serve_index(tmp_path / "cpuindex", [cpu]) as cpu_index:
        profiles = tmp_path / "profiles"
        profiles.mkdir()
        text = (images_dir() / "cpu.yaml").read_text()
        assert "torch_index_url: https://download.pytorch.org/whl/cpu\n" in text
        (profiles / "cpu.yaml").write_text(text.replace("https://download.pytorch.org/whl/cpu", cpu_index.url))
        monkeypatch.setenv(ENV_VENDOR_PATH, str(profiles))
        pip_env(monkeypatch, pypi)
        yield pypi, cpu_index
