"""The Docker backend's pure pieces: container state -> node phase -> events, timestamps, plan keys.

No engine needed (they sit here, beside the engine tests, because they test the same module).
"""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator import failures
from orchestrator.backends import base as b
from orchestrator.backends.docker.classify import node_status, parse_docker_time, transition_events
from orchestrator.backends.docker.engine import DockerBackend, container_kwargs
from orchestrator.backends.kubernetes.render import KubernetesRequest
from orchestrator.backends.logcursor import parse_rfc3339_ns as parse_docker_ns
from orchestrator.errors import BackendError
from orchestrator.plan import Plan


def _failure_kind(ev: b.Event) -> str:
    failure = failures.classify_event(ev)
    assert failure is not None, ev
    return failure.kind


def _ns(text: str) -> int:
    ns = parse_docker_ns(text)
    assert ns is not None, text
    return ns


def test_parse_docker_ns_is_exact_to_the_nanosecond():
    assert _ns("2024-05-01T10:00:00.000000001Z") - _ns("2024-05-01T10:00:00Z") == 1
    assert _ns("2024-05-01T10:00:00.1Z") > _ns("2024-05-01T10:00:00.012Z")
    assert parse_docker_ns("2024-05-01T12:00:00.5+02:00") == parse_docker_ns("2024-05-01T10:00:00.5Z")
    assert parse_docker_ns("not a time") is None
    assert parse_docker_time("0001-01-01T00:00:00Z") is None
    assert parse_docker_time("1970-01-01T00:00:01.25Z") == pytest.approx(1.25)


def _state(status, code=0, oom=False):
    return {"Status": status, "ExitCode": code, "OOMKilled": oom}


@pytest.mark.parametrize("state, signal, phase, code, reason", [
    (_state("created"), None, b.PENDING, None, None),
    (_state("running"), None, b.RUNNING, None, None),
    (_state("paused"), None, b.PAUSED, None, "paused"),
    (_state("exited", 0), None, b.SUCCEEDED, 0, None),
    (_state("exited", 1), None, b.FAILED, 1, None),
    (_state("exited", 137), 9, b.FAILED, 137, "SIGKILL"),
    (_state("exited", 137), None, b.FAILED, 137, "SIGKILL"),     # kill event dropped: the code says it
    (_state("exited", 143), 15, b.FAILED, 143, "SIGTERM"),
    (_state("exited", 137, oom=True), None, b.FAILED, 137, "OOMKilled"),
    (_state("exited", 1, oom=True), None, b.FAILED, 1, "OOMKilled"),  # a worker OOMed, torchrun exited 1
    (_state("dead", 0), None, b.FAILED, 0, "dead"),
    (None, None, b.LOST, None, "ContainerRemoved"),
    (_state("removing"), None, b.LOST, None, "ContainerRemoved"),
])
def test_node_status_table(state, signal, phase, code, reason):
    got = node_status(1, "c-1", state, signal=signal, cancelled=False, previous=None)
    assert (got.phase, got.exit_code, got.reason, got.host) == (phase, code, reason, "c-1")


def test_a_terminal_phase_sticks_and_our_own_cancel_is_not_a_failure():
    done = node_status(0, "c-0", _state("exited", 0), signal=None, cancelled=False, previous=None)
    assert node_status(0, "c-0", None, signal=None, cancelled=False, previous=done) == done
    running = b.NodeStatus(0, b.RUNNING, "c-0")
    gone = node_status(0, "c-0", None, signal=9, cancelled=True, previous=running)
    assert (gone.phase, gone.reason) == (b.FAILED, "cancelled")
    assert transition_events(running, gone, started_at=1.0, finished_at=None, event_time=None, name="c-0") == []


def test_transition_events_cover_a_missed_start_and_use_engine_times():
    cur = node_status(1, "c-1", _state("exited", 137), signal=9, cancelled=False, previous=None)
    evs = transition_events(None, cur, started_at=10.0, finished_at=12.5, event_time=12.4, name="c-1")
    assert [e.kind for e in evs] == [b.NODE_STARTED, b.NODE_EXITED]
    assert (evs[0].time, evs[1].time, evs[1].exit_code, evs[1].reason) == (10.0, 12.5, 137, "SIGKILL")
    # The classifier reads exit 137 with reason SIGKILL as a lost node, not an app error.
    assert _failure_kind(evs[1]) == failures.NODE_LOST
    assert transition_events(cur, cur, started_at=10.0, finished_at=12.5, event_time=None, name="c-1") == []


def test_transition_events_pause_unpause_oom_and_removal():
    running = b.NodeStatus(0, b.RUNNING, "c-0")
    paused = b.NodeStatus(0, b.PAUSED, "c-0", None, "paused")
    [ev] = transition_events(running, paused, started_at=1.0, finished_at=None, event_time=5.0, name="c-0")
    assert (ev.kind, ev.time) == (b.NODE_PAUSED, 5.0)
    assert _failure_kind(ev) == failures.HANG
    [ev] = transition_events(paused, running, started_at=1.0, finished_at=None, event_time=6.0, name="c-0")
    assert (ev.kind, ev.reason, ev.time) == (b.NODE_STARTED, "unpaused", 6.0)
    oom = node_status(0, "c-0", _state("exited", 137, oom=True), signal=None, cancelled=False, previous=running)
    [ev] = transition_events(running, oom, started_at=1.0, finished_at=7.0, event_time=None, name="c-0")
    assert (ev.kind, ev.exit_code, ev.reason) == (b.OOM_KILLED, 137, "OOMKilled")
    assert _failure_kind(ev) == failures.OOM
    lost = node_status(0, "c-0", None, signal=None, cancelled=False, previous=running)
    [ev] = transition_events(running, lost, started_at=1.0, finished_at=None, event_time=8.0, name="c-0")
    assert (ev.kind, ev.reason, ev.time) == (b.NODE_LOST, "ContainerRemoved", 8.0)


def test_container_kwargs_split_and_unknown_keys_are_refused():
    config, host, net = container_kwargs({"name": "n", "image": "i", "command": ["x"], "shm_size": 1,
                                          "cpuset_cpus": "0", "network": "net", "stop_timeout": 9})
    assert config == {"name": "n", "image": "i", "command": ["x"], "stop_timeout": 9}
    assert host == {"shm_size": 1, "cpuset_cpus": "0"} and net == "net"
    with pytest.raises(BackendError, match="gpus_magic"):
        container_kwargs({"name": "n", "image": "i", "gpus_magic": 1})


def test_submit_refuses_a_plan_for_another_backend_without_touching_the_engine():
    with pytest.raises(BackendError, match="kubernetes plan cannot be submitted to Docker"):
        DockerBackend(client=object()).submit(Plan(backend="kubernetes", run="r", attempt=0, spec_hash="h",
                                                          request=KubernetesRequest(namespace="default")))  # type: ignore[arg-type]  # another backend's, on purpose


def test_a_container_killed_while_nobody_watched_is_the_cause_however_late_anyone_looks():
    """Issue 22 item 2 on Docker: the engine keeps a killed container's exit (137) and its
    FinishedAt, so a first look long after the survivor died of the lost peer still orders the
    kill first."""
    killed_at, survivor_at = 1000.0, 1002.5
    events = []
    for node, state, finished in ((0, _state("exited", 1), survivor_at), (1, _state("exited", 137), killed_at)):
        status = node_status(node, f"c{node}", state, signal=None, cancelled=False, previous=None)
        events += transition_events(None, status, started_at=900.0, finished_at=finished, event_time=None,
                                    name=f"c{node}")
    found = failures.root_cause(events)    # nobody looked until now, minutes later
    assert found is not None and (found.kind, found.node, found.time) == (failures.NODE_LOST, 1, killed_at)


def test_a_follow_the_engine_ends_early_at_the_container_s_exit_still_delivers_every_line():
    """dockerd can end a `logs --follow` when the container stops, before its follower has read
    the whole log (in CI, under load, 15,350 of 40,000 lines came): the reader takes the rest
    with one plain read from where it was, each line once."""
    from orchestrator.backends.docker.engine import DockerBackend

    stamped = [f"2026-12-07T01:00:{i // 1000:02d}.{i % 1000:03d}000000Z line {i}\n" for i in range(3000)]

    class Api:
        def __init__(self):
            self.calls = []

        def logs(self, name, *, stream, follow, timestamps, tail, since):
            self.calls.append({"follow": follow, "since": since})
            if follow:          # the follow ends early, mid-log, as the container exits
                return iter(["".join(stamped[:1234]).encode()])
            return iter(["".join(stamped).encode()])     # the plain read: what the engine holds

        def inspect_container(self, name):
            return {"State": {"Status": "exited"}}

    class Client:
        api = Api()

    backend = DockerBackend(client=Client())
    got = [line for _, line in backend._log_lines("c", follow=True)]
    assert got == [f"line {i}" for i in range(3000)]
    assert [c["follow"] for c in Client.api.calls] == [True, False]


def test_a_container_the_engine_is_removing_has_no_log_to_keep_and_fails_no_teardown(tmp_path, monkeypatch):
    """`docker logs` of a container that is dead or being removed answers 409: the teardown keeps
    no log for it and goes on (it failed the whole teardown, and the run with it)."""
    import docker.errors

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))

    class Response:
        status_code = 409
        reason = "Conflict"

    class Api:
        def logs(self, cid, **kwargs):
            raise docker.errors.APIError("can not get logs from container which is dead or marked for removal",
                                         response=Response())

    class Client:
        api = Api()

    class Container:
        id = "c0"
        labels = {"wmctl.io/node": "0"}

    ref = b.AttemptRef("docker", "gone", 0, None)
    DockerBackend(client=Client())._archive_logs(ref, [Container()])      # no APIError
    assert not (tmp_path / "runs" / "gone" / "attempt-0" / "node-0.log").exists()


def test_a_follower_whose_container_the_engine_is_removing_ends_quietly():
    """The log follower's last plain read can meet a container being removed (`docker rm -f` by
    someone else): dockerd answers 409, and the follower ends with what it read instead of dying
    in its thread with a traceback (CI, test_a_container_removed_by_someone_else_reads_as_lost)."""
    import docker.errors

    class Response:
        status_code = 409
        reason = "Conflict"

    class Api:
        def __init__(self):
            self.calls = 0

        def logs(self, name, **kwargs):
            self.calls += 1
            if kwargs["follow"]:
                return iter([b"2026-12-07T01:00:00.000000000Z one\n"])
            raise docker.errors.APIError("can not get logs from container which is dead or marked for removal",
                                         response=Response())

        def inspect_container(self, name):
            return {"State": {"Status": "removing"}}

    class Client:
        api = Api()

    got = [line for _, line in DockerBackend(client=Client())._log_lines("c", follow=True)]
    assert got == ["one"] and Client.api.calls == 2


@pytest.mark.parametrize("gone_exit, signal, phase, code", [
    (None, None, b.LOST, None),        # no die event left: vanished without an exit status
    (137, 9, b.LOST, None),            # `docker rm -f` of a running container: killed, then removed
    (137, None, b.LOST, None),
    (1, None, b.FAILED, 1),            # it had exited 1 on its own; removed afterwards
    (0, None, b.SUCCEEDED, 0),
    (1, 9, b.LOST, None),              # a kill signal came first: its exit is the kill's
])
def test_a_container_gone_keeps_the_exit_status_its_die_event_gave(gone_exit, signal, phase, code):
    got = node_status(1, "c-1", None, signal=signal, cancelled=False, previous=None, gone_exit=gone_exit)
    assert (got.phase, got.exit_code) == (phase, code)


def test_a_container_removed_while_nobody_watched_is_the_cause_however_late_anyone_looks():
    """Issue 22 item 2, `docker rm -f`: the container and its exit status are gone. A reader that
    never saw it alive dates its loss from the attempt's start (last_alive) when the engine no
    longer holds its destroy event, and from that event when it does; either way before the
    survivor's exit 1 (gloo's "Connection closed by peer"), however late the look."""
    start, removed_at, survivor_at, looked = 900.0, 1000.0, 1002.5, 5000.0
    survivor = node_status(0, "c0", _state("exited", 1), signal=None, cancelled=False, previous=None)
    gone = node_status(1, "c1", None, signal=None, cancelled=False, previous=None)
    for event_time in (None, removed_at):
        events = transition_events(None, survivor, started_at=950.0, finished_at=survivor_at, event_time=None,
                                   name="c0")
        lost = transition_events(None, gone, started_at=None, finished_at=None, event_time=event_time, name="c1",
                                 last_alive=start)
        assert [e.kind for e in lost] == [b.NODE_LOST]
        found = failures.root_cause(events + [dataclasses.replace(e, time=e.time if event_time else looked)
                                              for e in lost])
        assert found is not None and (found.kind, found.node) == (failures.NODE_LOST, 1), (event_time, found)
        assert found.earliest == (removed_at if event_time else start)


def test_a_container_removed_long_after_the_survivors_own_error_does_not_take_the_blame():
    """The destroy event dates the removal: a container removed (cleaned up) long after its peer
    failed on its own is not moved back to the attempt's start."""
    survivor = node_status(0, "c0", _state("exited", 1), signal=None, cancelled=False, previous=None)
    gone = node_status(1, "c1", None, signal=None, cancelled=False, previous=None)
    events = (transition_events(None, survivor, started_at=950.0, finished_at=1000.0, event_time=None, name="c0")
              + transition_events(None, gone, started_at=None, finished_at=None, event_time=1300.0, name="c1",
                                  last_alive=900.0))
    found = failures.root_cause(events)
    assert found is not None and (found.kind, found.node) == (failures.APP_ERROR, 0)
