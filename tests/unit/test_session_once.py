"""What the suite builds once per session (tests/session_once.py) is built once across processes,
as pytest-xdist's workers are, and a failed build is built again by the next asker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.session_once import build_once_in

REPO = Path(__file__).resolve().parents[2]

# Each process asks for the same thing; the build appends its pid to a file, so the file says how
# many builds ran. The first build waits until every process has started and asked (it polls for
# their "asked" files), so the others really do ask while it is building.
ASKER = r"""
import os, sys
from pathlib import Path
from tests.session_once import build_once_in

root, count = Path(sys.argv[1]), int(sys.argv[2])
(root / f"asked-{os.getpid()}").touch()

def build(folder):
    while len(list(root.glob("asked-*"))) < count:
        pass
    with open(root / "builds", "a") as fh:
        fh.write(f"{os.getpid()}\n")
    (folder / "thing").write_text("built")
    return {"path": str(folder / "thing")}

print(build_once_in(root / "shared", "thing", build)["path"])
"""


def test_concurrent_processes_build_once_and_share_the_result(tmp_path):
    count = 3
    procs = [subprocess.Popen([sys.executable, "-c", ASKER, str(tmp_path), str(count)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * count, [err for _, err in outs]
    assert len((tmp_path / "builds").read_text().split()) == 1
    paths = {out.strip() for out, _ in outs}
    assert paths == {str(tmp_path / "shared" / "thing" / "thing")}
    assert Path(paths.pop()).read_text() == "built"


def test_a_build_that_raised_is_built_again_from_an_empty_folder(tmp_path):
    def broken(folder: Path) -> dict[str, str]:
        (folder / "half").write_text("half-written")
        raise RuntimeError("no space left")

    with pytest.raises(RuntimeError, match="no space left"):
        build_once_in(tmp_path, "thing", broken)

    seen: list[list[str]] = []

    def good(folder: Path) -> dict[str, str]:
        seen.append(sorted(p.name for p in folder.iterdir()))
        return {"n": "1"}

    assert build_once_in(tmp_path, "thing", good) == {"n": "1"}
    assert build_once_in(tmp_path, "thing", good) == {"n": "1"}
    assert seen == [[]]    # built once more, in an emptied folder, and then kept


def outside_xdist() -> dict[str, str]:
    """This environment less what an xdist worker sets (PYTEST_XDIST_WORKER, ...): a pytest
    started from a test run under -n is a controller of its own, not one of our workers."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}


def test_xdist_without_loadgroup_is_refused_naming_the_option(tmp_path):
    """Modules marked xdist_group run on several workers at once under any other --dist: the
    suite refuses to start, naming the fix, instead of failing later in a collision."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--collect-only", "-q",
                             "-p", "no:cacheprovider", "tests/unit/test_session_once.py"],
                            cwd=REPO, env=outside_xdist(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert "-n 2 with --dist load: modules marked xdist_group" in result.stderr
    assert "add --dist loadgroup" in result.stderr


def test_loadgroup_puts_a_group_on_one_worker(tmp_path):
    """With pytest 9.2, xdist's own rename of a grouped test is lost (tests/xdist_groups.py): the
    six tests of the grouped module must all report from one worker, the others from any."""
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\npytestmark = pytest.mark.xdist_group('g')\n"
        "@pytest.mark.parametrize('i', range(6))\ndef test_g(i):\n    pass\n")
    (tmp_path / "test_free.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(6))\ndef test_f(i):\n    pass\n")
    env = {**outside_xdist(), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v",
                             "-p", "no:cacheprovider", "-p", "tests.xdist_groups",
                             "--rootdir", str(tmp_path), str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    grouped = re.findall(r"\[(gw\d)\].*PASSED .*test_grouped\.py::test_g\[\d\]@g", result.stdout)
    assert len(grouped) == 6 and len(set(grouped)) == 1, result.stdout[-3000:]
    assert len(re.findall(r"PASSED .*test_free\.py::test_f\[\d\]\s", result.stdout)) == 6, result.stdout[-3000:]
