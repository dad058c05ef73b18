"""`wmctl logs` on a real Docker engine, while the containers run: --tail, --since, --timestamps
and --all-nodes reach the engine's own log API (its per-line times), and what comes back is what
`docker logs` holds."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone

import pytest

from tests.integration import harness as h

from .conftest import SWEPT_RUNS
from .test_docker_faults import leftovers
from .test_docker_lifecycle import job_spec, wmctl

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.xdist_group(f"{SWEPT_RUNS}-docker-logs"),
              pytest.mark.usefixtures("_no_stale_runs")]
RUN_PREFIX = "dkg-"     # this module's runs: the only ones its _no_stale_runs sweeps
LINE = re.compile(r"my own log: step (\d+) ")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) (.*)$")


def steps(text: str) -> list[int]:
    return [int(m.group(1)) for m in LINE.finditer(text)]


def test_docker_logs_flags_reach_the_engine(docker_client, image, home):
    run = "dkg-logs"
    spec = job_spec(home, run, image, "plain.py", steps=40, sleep=1.0, restart={"heartbeat_timeout": "30s"})
    w = h.Watch(spec, home, "--backend", "docker")
    try:
        def node0_lines() -> list[int]:
            listed = docker_client.containers.list(filters={"label": [f"wmctl.io/run={run}"]}, ignore_removed=True)
            found = [c for c in listed if c.labels.get("wmctl.io/node") == "0"]
            return steps(found[0].logs().decode(errors="replace")) if found else []
        h.wait_until(lambda: len(node0_lines()) >= 6, 180, "six lines from node 0", every=0.5)

        full = wmctl(home, "logs", run, "--node", "0")
        assert full.returncode == 0, full.stdout + full.stderr
        got = steps(full.stdout)
        assert got[:6] == [1, 2, 3, 4, 5, 6], full.stdout

        tail = wmctl(home, "logs", run, "--node", "0", "--tail", "2")
        last = steps(tail.stdout)
        assert tail.returncode == 0 and len(last) == 2 and last[1] == last[0] + 1 and last[0] >= 5, tail.stdout

        stamped = wmctl(home, "logs", run, "--node", "0", "--timestamps", "--tail", "1")
        m = STAMP.match(stamped.stdout.strip().splitlines()[-1])
        assert stamped.returncode == 0 and m and LINE.search(m.group(2)), stamped.stdout
        when = datetime.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
        assert abs(time.time() - when.timestamp()) < 60, m.group(1)

        # --since: only what the engine logged in the last 3 s (a line a second), never the start
        recent = wmctl(home, "logs", run, "--node", "0", "--since", "3s")
        few = steps(recent.stdout)
        assert recent.returncode == 0 and 1 <= len(few) <= 5 and 1 not in few, recent.stdout

        both = wmctl(home, "logs", run, "--all-nodes", "--tail", "1")
        prefixes = sorted(line.split("]")[0] + "]" for line in both.stdout.splitlines() if LINE.search(line))
        assert both.returncode == 0 and prefixes == ["[node 0]", "[node 1]"], both.stdout
    finally:
        cancel = wmctl(home, "cancel", run)
        w.wait(timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert not leftovers(docker_client, run)


INTERLEAVED = """
import sys
for i in range(40000):
    out = sys.stderr if i % 2 else sys.stdout
    out.write(f"line {i}\\n")
    out.flush()
"""


def test_log_follower_keeps_lines_the_engine_stamped_out_of_order(docker_client, image):
    """dockerd stamps a line when the copier of its stream reads it and only then logs it
    (moby daemon/logger/copier.go: a goroutine per stream), so a stdout line can follow a stderr
    line stamped after it. The follower behind progress events and `wmctl logs -f` must deliver
    it: it used to drop every line older than the newest it had read, and in CI a job's `resume`
    progress line, printed right after the runtime's stderr note, vanished."""
    from orchestrator.backends.docker.engine import DockerBackend
    from orchestrator.backends.logcursor import split_timestamp

    c = docker_client.containers.run(image, entrypoint=["python", "-c", INTERLEAVED], detach=True,
                                     name=f"dkg-stamp-order-{os.getpid()}")
    try:
        got = [line for _, line in DockerBackend(client=docker_client)._log_lines(c.name, follow=True)]
        assert c.wait(timeout=120)["StatusCode"] == 0
        stamped = [split_timestamp(raw) for raw in
                   docker_client.api.logs(c.name, timestamps=True).decode().splitlines()]
    finally:
        c.remove(force=True)
    behind, newest = 0, 0
    for stamp, _ in stamped:
        assert stamp is not None
        behind += stamp < newest
        newest = max(newest, stamp)
    # the premise: the engine did write some lines after one stamped later (26 of 20,000 here)
    assert behind > 0, "the engine kept every line in stamp order this time: nothing was tested"
    assert got == [line for _, line in stamped], f"{len(got)} of {len(stamped)} lines delivered"
    assert sorted(got) == sorted(f"line {i}" for i in range(40000))
