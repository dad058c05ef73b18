"""The log options each backend declares (log_options), checked in one place before any engine
is asked; the kept (archived) log of a torn-down attempt; the time format of --timestamps."""

from __future__ import annotations

from typing import Any

import click
import pytest

from orchestrator import backends
from orchestrator.backends import base as b
from orchestrator.backends.docker.engine import DockerBackend
from orchestrator.commands._params import Duration
from orchestrator.errors import OptionError
from orchestrator.state import open_store


def test_each_backend_declares_what_its_logs_serve():
    declared = {name: backends.backend_class(name).log_options for name in backends.names()}
    assert declared == {"local": {"tail"}, "docker": {"tail", "since", "timestamps"},
                        "kubernetes": {"tail", "since", "timestamps"}, "slurm": {"tail"}}


@pytest.mark.parametrize("query,flags", [
    (b.LogQuery(since=0.0), "--since"),
    (b.LogQuery(timestamps=True), "--timestamps"),
    (b.LogQuery(since=0.0, timestamps=True), "--since, --timestamps"),
])
def test_local_refuses_times_naming_the_flags_and_where_they_work(query, flags):
    with pytest.raises(OptionError) as err:
        backends.check_logs(backends.backend_class("local"), query)
    assert err.value.message.startswith(f"{flags}: the local backend") and "docker, kubernetes" in err.value.message
    assert err.value.hint is not None
    assert err.value.exit_code == 2 and f"drop {flags}" in err.value.hint
    backends.check_logs(backends.backend_class("local"), b.LogQuery(tail=5))      # tail is served
    for name in ("docker", "kubernetes"):
        backends.check_logs(backends.backend_class(name), query)


def test_a_backend_declaring_nothing_refuses_tail_too(monkeypatch):
    class Bare(DockerBackend):
        name = "bare"
        log_options = frozenset()

    with pytest.raises(OptionError) as err:
        backends.check_logs(Bare, b.LogQuery(tail=3))
    assert err.value.message.startswith("--tail: the bare backend's logs cannot serve this;")
    assert "per-line times" not in err.value.message       # the reason given fits the flag


def test_kept_lines_tail_and_no_times():
    lines = ["a", "b", "c"]
    assert b.kept_lines(lines, b.LogQuery(), what="r-a0") == lines
    assert b.kept_lines(lines, b.LogQuery(tail=2), what="r-a0") == ["b", "c"]
    assert b.kept_lines(lines, b.LogQuery(tail=0), what="r-a0") == []
    with pytest.raises(OptionError) as err:
        b.kept_lines(lines, b.LogQuery(timestamps=True), what="r-a0")
    assert "--timestamps: r-a0 was torn down" in err.value.message


def test_docker_serves_a_torn_down_attempt_from_its_kept_log_without_the_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    open_store("dk").archive_log(0, 1, b"one\ntwo\nthree\n")
    engine = DockerBackend()          # no client: the kept log needs no engine
    ref = b.AttemptRef("docker", "dk", 0)
    assert list(engine.logs(ref, 1, query=b.LogQuery(tail=2))) == ["two", "three"]
    with pytest.raises(OptionError):
        list(engine.logs(ref, 1, query=b.LogQuery(since=1.0)))


@pytest.mark.parametrize("ns,text", [
    (0, "1970-01-01T00:00:00Z"),
    (1_500_000_000, "1970-01-01T00:00:01.5Z"),
    (1_764_000_000_000_000_001, "2025-11-24T16:00:00.000000001Z"),
])
def test_timestamps_are_go_s_rfc3339nano(ns, text):
    assert b.rfc3339(ns) == text


@pytest.mark.parametrize("given,seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("1h30m", 5400), ("7d", 604800)])
def test_duration_option(given, seconds):
    assert Duration().convert(given, None, None) == seconds


def test_duration_option_refuses_naming_the_forms():
    with pytest.raises(click.BadParameter) as err:
        Duration().convert("ten minutes", None, None)
    assert "30s" in str(err.value) and "7d" in str(err.value)


def test_local_follow_never_cuts_a_line_a_node_is_writing_in_pieces(tmp_path, monkeypatch):
    """A job's stdout into its log file is block-buffered: a flush can end mid-line. A follower
    shows each line once its newline is there, and the unfinished last line once the node ended."""
    import threading
    import time

    from orchestrator import layout
    from orchestrator.backends.local.engine import LocalBackend

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    log = layout.node_log("pieces", 0, 0)
    log.parent.mkdir(parents=True)
    log.write_text("first line\nwmctl-bi")

    def write_on() -> None:
        time.sleep(0.5)                     # the follower has read "wmctl-bi" by now
        with open(log, "a") as fh:
            fh.write("nd: cpus 0-3\nlast, unfinished")
        time.sleep(0.5)
        layout.node_exit_file("pieces", 0, 0).write_text("{}")

    writer = threading.Thread(target=write_on)
    writer.start()
    ref = b.AttemptRef("local", "pieces", 0)
    assert list(LocalBackend().logs(ref, follow=True)) == ["first line", "wmctl-bind: cpus 0-3", "last, unfinished"]
    writer.join()
    assert list(LocalBackend().logs(ref)) == ["first line", "wmctl-bind: cpus 0-3", "last, unfinished"]
    assert list(LocalBackend().logs(ref, follow=True, query=b.LogQuery(tail=1))) == ["last, unfinished"]


def test_followed_nodes_asking_at_once_all_see_the_run():
    """`logs -f --all-nodes` asks "has the attempt ended?" from one thread per node. A node whose
    thread asked while another's first read of the record was under way was told the run was
    deleted, and its whole output was skipped (CI: node 1's lines missing before the banner)."""
    import threading
    import time

    from orchestrator.logview import _Run
    from orchestrator.state import RunRecord

    rec = RunRecord(run="r", backend="local", spec_path="", overrides={}, spec_hash="h", auto_resume=True)

    class SlowStore:
        def load(self):
            time.sleep(0.3)                 # a record read on a loaded machine
            return rec

        def lease(self):
            return object()                 # a watcher holds it: nothing to reconcile

    run = _Run(SlowStore(), engine=None)     # type: ignore[arg-type]
    seen: list = []
    threads = [threading.Thread(target=lambda: seen.append(run.record())) for _ in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=10)
    assert seen == [rec] * 4


def test_the_node_holding_global_rank_0_is_found_from_the_launcher_line():
    """`wmctl logs RUN` shows the node whose launcher line says rank=0 (the rendezvous placed
    it), node 0 when none says; a node whose log cannot be read is passed over."""
    from orchestrator.errors import RunNotFound
    from orchestrator.logview import rank0_node

    class Engine:
        def __init__(self, logs):
            self.logs_of = logs

        def logs(self, ref, *, node, follow, query):
            lines = self.logs_of[node]
            if lines is None:
                raise RunNotFound(f"no node {node} yet")
            return iter(lines)

    bind = "wmctl-bind: local_rank=0 cpus=0-1 numa=- mode=none threads=2 rank={}"
    engine: Any                         # the logs() that rank0_node reads, not a Backend
    engine = Engine({0: ["hello", bind.format(1)], 1: [bind.format(0), "step 1"]})
    assert rank0_node(engine, None, 2) == (1, "global rank 0")
    engine = Engine({0: [bind.format(0)], 1: [bind.format(1)]})
    assert rank0_node(engine, None, 2) == (0, "global rank 0")
    engine = Engine({0: None, 1: ["no launcher line: rank=0"]})
    assert rank0_node(engine, None, 2)[0] == 0 and "no node" in rank0_node(engine, None, 2)[1]
    engine = Engine({0: [bind.format(10)], 1: [bind.format(0)]})      # rank=10 is not rank 0
    assert rank0_node(engine, None, 2)[0] == 1


def test_a_huge_line_ended_by_a_progress_line_is_shown_without_raw(tmp_path, monkeypatch):
    """A job wrote 5 MB without a newline (a long line, a tqdm bar's \\r updates), then the runtime
    its progress line: in the log they are one line. `wmctl logs` hid the whole of it as a progress
    line (only --raw showed the job's 5 MB); the job's words are shown, the progress part hidden."""
    from orchestrator import layout
    from orchestrator.backends.local.engine import LocalBackend
    from orchestrator.logview import _node_lines
    from orchestrator.runtime.protocol import format_progress

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    big = "x" * (5 * 1024 * 1024)
    log = layout.node_log("huge", 0, 0)
    log.parent.mkdir(parents=True)
    progress = format_progress("step", step=3)
    log.write_text(f"before\n{big}{progress}\n{progress}\nafter\n")
    ref = b.AttemptRef("local", "huge", 0)
    shown = list(_node_lines(LocalBackend(), ref, 0, follow=False, query=b.LogQuery(), raw=False))
    assert shown == ["before", big, "after"]
    tailed = list(_node_lines(LocalBackend(), ref, 0, follow=False, query=b.LogQuery(tail=2), raw=False))
    assert tailed == [big, "after"]
    raw = list(_node_lines(LocalBackend(), ref, 0, follow=False, query=b.LogQuery(), raw=True))
    assert raw == ["before", big + progress, progress, "after"]
