"""The c10d store's read timeout, with real torchrun: a node that starts before node 0's store
listens waits rendezvous.read_timeout (torch's own default is 60 s, separate from
join_timeout), and its agent's failure to reach the store is classified as infrastructure
(retried), not as the job's error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import failures as F
from orchestrator.launch import torchrun_args
from orchestrator.vendors import load_profile

from ..unit.helpers import spec_from

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_read_timeout_follows_the_spec_and_defaults_to_join_timeout():
    profile = load_profile("cpu")
    for rdzv, conf in (({"join_timeout": "10m"}, "join_timeout=600,read_timeout=600"),
                       ({"join_timeout": "10m", "read_timeout": "90s"}, "join_timeout=600,read_timeout=90"),
                       ({"join_timeout": 30, "read_timeout": 1.5}, "join_timeout=30,read_timeout=2")):
        spec = spec_from({"name": "r", "command": ["python", "t.py"], "rendezvous": rdzv})
        argv = torchrun_args(spec, profile, endpoint="h:1", rdzv_id="r-a0", node_rank=None)
        assert f"--rdzv-conf={conf}" in argv


def test_a_read_timeout_under_a_second_is_refused_naming_the_field():
    from orchestrator.errors import SpecError
    with pytest.raises(SpecError) as err:
        spec_from({"name": "r", "command": ["true"], "rendezvous": {"read_timeout": "500ms"}})
    assert "rendezvous.read_timeout" in str(err.value)


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is installed with torch")
def test_a_node_whose_store_host_is_late_waits_read_timeout_and_its_failure_is_a_rendezvous_failure(tmp_path):
    """Real torchrun, as the non-host node of a 2-node c10d rendezvous whose host never comes:
    it gives up after read_timeout (not the 60 s default), and its output classifies as a
    rendezvous failure (retry), not an app_error."""
    port = _free_port()
    spec = spec_from({"name": "late", "nodes": 2, "command": ["true"],
                      "rendezvous": {"join_timeout": "90s", "read_timeout": "2s"}})
    argv = torchrun_args(spec, load_profile("cpu"), endpoint=f"127.0.0.1:{port}", rdzv_id="late-a0",
                         node_rank=1, torchrun=[str(TORCHRUN)], launcher=[], command=["true"])
    # this machine would host the store for 127.0.0.1; a node on another machine would not
    argv = [a + ",is_host=false" if a.startswith("--rdzv-conf=") else a for a in argv]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": f"{TORCHRUN.parent}:{os.environ['PATH']}"})
    took = time.monotonic() - started
    assert out.returncode != 0
    lines = (out.stdout + out.stderr).splitlines()
    evidence = F.rendezvous_failure(lines)
    assert evidence and "RendezvousConnectionError" in evidence, "\n".join(lines[-20:])
    assert (err := F.job_error(lines)) is None or "RendezvousConnectionError" not in err.summary
    assert took < 45, f"gave up after {took:.0f} s: torch's 60 s default, not read_timeout, applied"
