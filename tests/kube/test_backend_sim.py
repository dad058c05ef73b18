"""Simulations of the Kubernetes backend against the fake API server (tests/kube/fakeapi)
with a scripted cluster: the real `kubernetes` client, real HTTP, real watches. No real
cluster is involved; Kubernetes durations are scaled (40 s grace period -> 0.2 s)."""

from __future__ import annotations

import time


import kubernetes_validate
import pytest
from .sdk import client

from orchestrator.backends import base
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.errors import BackendError
from orchestrator.runtime.protocol import format_progress as progress_line

from .manifests import attempt_manifests, manifest_plan, rendered_plan
from .simhelpers import Collector

pytestmark = pytest.mark.timeout(90)


def _submit(fake_api, backend, run="sim", attempt=0, **kw):
    fake_api.cluster.start()
    ref = backend.submit(rendered_plan(run, attempt, **kw))
    return ref, Collector(backend, ref)


def test_sim_submit_creates_service_then_job_and_second_submit_adopts(fake_api, backend):
    """Simulation: Service is created before the Job; resubmitting the same attempt (a
    retry, a second watcher) adopts both, creating nothing twice."""
    plan = rendered_plan("sim", 0)
    ref = backend.submit(plan)
    posts = [r["path"].rsplit("/", 1)[-1] for r in fake_api.api.sent("POST")]
    assert posts == ["services", "jobs"]
    again = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        ref2 = again.submit(plan)
    finally:
        again.close()
    assert ref2 == ref and ref.attempt_name == "sim-a0"
    assert len(fake_api.store.list("jobs")[0]) == 1 and len(fake_api.store.list("services")[0]) == 1
    svc = fake_api.store.get("services", "default", "sim-a0")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"wmctl.io/run": "sim", "wmctl.io/attempt": "0"}


def test_sim_adoption_refuses_a_foreign_object(fake_api, backend):
    """Simulation: a Job with the attempt's name but another run's labels is an error."""
    svc, job = attempt_manifests("sim", 0)
    job["metadata"]["labels"]["wmctl.io/run"] = "someone-else"
    client.BatchV1Api(fake_api.client).create_namespaced_job("default", job)
    with pytest.raises(BackendError) as err:
        backend.submit(rendered_plan("sim", 0))
    assert "already exists" in str(err.value) and "kubectl" in str(err.value)


def test_sim_pods_succeed_and_progress_lines_arrive(fake_api, backend):
    """Simulation: both pods run and exit 0 -> Observation finished, every node SUCCEEDED;
    rank 0's WMCTL-PROGRESS lines come back as PROGRESS events, in order, once each."""
    lines = [(0.0, "torchrun noise"), (0.02, 'WMCTL-PROGRESS {"event":"start","step":0}'),
             (0.1, 'WMCTL-PROGRESS {"event":"step","step":10}'),
             (0.2, 'WMCTL-PROGRESS {"event":"checkpoint","step":20}')]
    fake_api.cluster.script(job="sim-a0", index=0, run_seconds=0.4, logs=lines)
    fake_api.cluster.script(job="sim-a0", index=1, run_seconds=0.3,
                            logs=[(0.0, 'WMCTL-PROGRESS {"event":"start","step":0}')])
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda c: c.last.finished and len(c.kinds(base.PROGRESS)) == 3)
    assert [n.phase for n in col.last.nodes] == [base.SUCCEEDED, base.SUCCEEDED]
    assert [e.progress["event"] for e in col.kinds(base.PROGRESS)] == ["start", "step", "checkpoint"]
    assert all(e.node == 0 for e in col.kinds(base.PROGRESS))      # only rank 0's log
    exits = col.kinds(base.NODE_EXITED)
    assert sorted(e.node for e in exits) == [0, 1] and {e.exit_code for e in exits} == {0}
    assert len(col.kinds(base.NODE_STARTED)) == 2
    assert list(backend.logs(ref, 0))[0] == "torchrun noise"


def test_sim_the_witness_log_gives_only_its_reports_about_group_rank_0(fake_api, backend):
    """Simulation: index 1's log is followed as rank 0's witness (base.witness_progress). Its
    ordinary output, its own step line and a node_silent about another group rank give no event
    (no OUTPUT heartbeat either: that stays rank 0's); its node_silent / node_beat about group
    rank 0 arrive as PROGRESS of node 1 on pod 1's host. A 1-node attempt opens no second
    stream; an attempt adopted without its Job's shape opens it once the Job tells 2 nodes."""
    def witness(event, group_rank, **kw):
        return progress_line(event, group_rank=group_rank, host="node-x", witness=1, **kw)
    fake_api.cluster.script(job="sim-a0", index=0, run_seconds=None,
                            logs=[(0.0, 'WMCTL-PROGRESS {"event":"start","step":0}')])
    fake_api.cluster.script(job="sim-a0", index=1, run_seconds=None,
                            logs=[(0.0, "rank 1 says hello"), (0.02, 'WMCTL-PROGRESS {"event":"step","step":3}'),
                                  (0.04, witness("node_silent", 2, silent_s=3.0)),
                                  (0.06, witness("node_silent", 0, silent_s=3.0)),
                                  (0.08, witness("node_beat", 0))])
    ref, col = _submit(fake_api, backend)
    # each index's log is its own stream: wait for rank 0's start too, not only the witness's last line
    assert col.until(lambda c: {(e.node, e.progress["event"]) for e in c.kinds(base.PROGRESS)}
                     >= {(1, "node_beat"), (0, "start")})
    host1 = next(n.host for n in col.last.nodes if n.node == 1)
    from_witness = [(e.kind, (e.progress or {}).get("event"), (e.progress or {}).get("group_rank"), e.host)
                    for e in col.events if e.node == 1 and e.kind in (base.PROGRESS, base.OUTPUT)]
    assert from_witness == [(base.PROGRESS, "node_silent", 0, host1), (base.PROGRESS, "node_beat", 0, host1)]
    assert [e.progress["event"] for e in col.kinds(base.PROGRESS) if e.node == 0] == ["start"]
    assert sorted(backend._state(ref).log_threads) == [0, 1]

    one = backend.submit(rendered_plan("one", 0, nodes=1))
    assert sorted(backend._state(one).log_threads) == [0]
    adopter = KubernetesBackend(fake_api.client, watch_timeout=2)     # a watcher that did not submit
    try:
        st = adopter._state(ref)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(st.log_threads) < 2:
            time.sleep(0.02)
        assert sorted(st.log_threads) == [0, 1]
    finally:
        adopter.close()


def test_sim_an_adopted_attempt_listed_while_watched_still_follows_its_witness(fake_api, backend):
    """Simulation: a watcher that did not submit starts watching an attempt (its shape unknown),
    then lists the run's attempts (which read each Job's shape into the same record). The
    listing leaves the node count to the Job watch, which starts the witness's follower."""
    fake_api.cluster.script(job="sim-a0", index=0, run_seconds=None, logs=[(0.0, "rank 0")])
    fake_api.cluster.script(job="sim-a0", index=1, run_seconds=None, logs=[(0.0, "rank 1")])
    ref, _ = _submit(fake_api, backend)
    adopter = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        st = adopter._state(ref)
        assert [r.attempt for r in adopter.attempts(ref.run)] == [0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(st.log_threads) < 2:
            time.sleep(0.02)
        assert sorted(st.log_threads) == [0, 1] and st.completions == 2
    finally:
        adopter.close()


def test_a_watched_attempts_node_count_is_left_to_its_job_watch():
    """The record behind the test above, without the race: a Job's shape read while the attempt
    is watched leaves the node count to the Job watch (which starts the witness's follower when
    it sets it); an attempt not watched yet takes it at once (its followers start with it)."""
    from orchestrator.backends.kubernetes.record import Attempt

    job = {"spec": {"completions": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}}}
    watched = Attempt(base.AttemptRef("kubernetes", "r", 0, "default"), watching=True)
    watched.learn(job)
    assert (watched.completions, watched.container) == (0, "trainer")
    fresh = Attempt(base.AttemptRef("kubernetes", "r", 0, "default"))
    fresh.learn(job)
    assert (fresh.completions, fresh.container) == (2, "trainer")


@pytest.mark.parametrize("script,kind,code,reason", [
    ({"exit_code": 1}, base.NODE_EXITED, 1, "Error"),
    ({"exit_code": 137, "reason": "OOMKilled"}, base.OOM_KILLED, 137, "OOMKilled"),
    ({"exit_code": 83}, base.NODE_EXITED, 83, "Error"),
])
def test_sim_container_failures_are_classified(fake_api, backend, script, kind, code, reason):
    """Simulation: node 1's container fails; the event names the kind, exit code and node,
    and the survivor the Job controller then deletes is not reported as lost."""
    fake_api.cluster.script(job="sim-a0", index=0, run_seconds=None)
    fake_api.cluster.script(job="sim-a0", index=1, run_seconds=0.1, **script)
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda c: c.kinds(kind))
    ev = c_first(col.kinds(kind))
    assert (ev.node, ev.exit_code, ev.reason) == (1, code, reason)
    assert ev.host in ("node-a", "node-b", "node-c")
    assert col.until(lambda c: c.last.nodes[1].phase == base.FAILED)
    # the Job fails (backoffLimit 0) and its controller deletes node 0's pod: a consequence
    assert fake_api.cluster.run_until(lambda: len(fake_api.store.list("pods")[0]) == 1)
    col.until(lambda c: False, timeout=0.3)
    assert not col.kinds(base.NODE_LOST)


def test_sim_cancel_keeps_each_nodes_log_after_the_pods_are_gone(fake_api, backend):
    """Simulation: node 1 fails with a traceback; teardown copies its log tail into the run
    folder before the Job goes (a terminal pod is removed at once, its log with it), so `wmctl
    logs` of the failed attempt still shows the traceback. A cancelled running attempt keeps
    every node's log the same way."""
    fake_api.cluster.script(job="sim-a0", index=1, run_seconds=0.1, exit_code=1,
                            logs=[(0.0, "Traceback (most recent call last):"),
                                  (0.05, "ValueError: bad batch shape")])
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda c: c.kinds(base.NODE_EXITED))
    backend.cancel(ref)
    assert fake_api.cluster.run_until(lambda: not fake_api.store.list("pods")[0])
    assert list(backend.logs(ref, 1)) == ["Traceback (most recent call last):", "ValueError: bad batch shape"]

    for index in (0, 1):
        fake_api.cluster.script(job="sim-a1", index=index, run_seconds=None,
                                logs=[(0.0, f"rank {index} training")])
    ref1 = backend.submit(rendered_plan("sim", 1, parent=0))
    col1 = Collector(backend, ref1)
    assert col1.until(lambda c: [n.phase for n in c.last.nodes] == [base.RUNNING] * 2)
    backend.cancel(ref1)
    assert fake_api.cluster.run_until(lambda: not fake_api.store.list("pods")[0])
    assert [list(backend.logs(ref1, i)) for i in (0, 1)] == [["rank 0 training"], ["rank 1 training"]]


def c_first(events):
    assert events, "no such event"
    return events[0]


def test_sim_bad_image_reports_image_pull_failed(fake_api, backend):
    """Simulation: an image the registry does not have -> IMAGE_PULL_FAILED (ErrImagePull)."""
    fake_api.cluster.bad_images.add("registry.example.com/team/missing:v1")
    ref, col = _submit(fake_api, backend, image="registry.example.com/team/missing:v1")
    assert col.until(lambda c: len(c.kinds(base.IMAGE_PULL_FAILED)) == 2)
    assert {e.reason for e in col.kinds(base.IMAGE_PULL_FAILED)} == {"ErrImagePull"}
    assert [n.phase for n in col.last.nodes] == [base.PENDING, base.PENDING]
    assert not col.kinds(base.NODE_STARTED)


def test_sim_node_lost_from_node_conditions_before_taint_manager(fake_api, backend):
    """Simulation: kill node 1's machine -> NODE_LOST (host = that node) as soon as the API
    reports Ready=Unknown after the scaled grace period, before the taint manager's
    DisruptionTarget; exactly one loss event although three signals follow."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    host = col.last.nodes[1].host
    c.kill_node(host)
    assert col.until(lambda col: col.kinds(base.NODE_LOST))
    lost = col.kinds(base.NODE_LOST)[0]
    assert (lost.node, lost.host, lost.reason) == (1, host, "NodeStatusUnknown")
    # the taint manager acts later: still one loss. Its deletion counts as a pod failure,
    # so the Job (backoffLimit 0) fails and the controller terminates node 0: a consequence,
    # reported after the loss, as on a real cluster.
    assert c.run_until(lambda: any(w == "taint_evicted" for _, w, _ in c.timeline))
    assert col.until(lambda col: col.last.nodes[0].phase == base.FAILED)
    assert len(col.kinds(base.NODE_LOST)) == 1
    assert col.last.nodes[1].phase == base.LOST
    (term,) = [e for e in col.kinds(base.NODE_EXITED) if e.node == 0]
    assert term.exit_code == 143 and term.time > lost.time
    when = {w: t for t, w, _ in c.timeline}
    assert lost.time < when["taint_evicted"]


def test_sim_node_not_ready_reported_by_kubelet(fake_api, backend):
    """Simulation: a live kubelet posts Ready=False and keeps it: the node is lost once its
    not-ready taint outlasts the pods' toleration (restart.node_loss_timeout, rendered as
    tolerationSeconds; the taint manager then evicts), not at the first report."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    host = col.last.nodes[0].host
    c.set_node_ready(host, False, reason="KubeletNotReady")
    assert col.until(lambda col: col.kinds(base.NODE_LOST))
    (lost,) = col.kinds(base.NODE_LOST)
    assert (lost.node, lost.reason) == (0, "DeletionByTaintManager")
    when = {w: t for t, w, _ in c.timeline}
    assert lost.time - when["node_not_ready"] >= c.timings.real(30) * 0.9


@pytest.mark.fake_api(scale=0.05)        # the 30 s toleration plays out in 1.5 s
def test_sim_a_not_ready_blip_shorter_than_node_loss_timeout_is_no_loss(fake_api, backend):
    """Simulation: a kubelet reports Ready=False (a container runtime restart) and Ready=True
    again within restart.node_loss_timeout: nothing is lost, nothing torn down or excluded."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    host = col.last.nodes[0].host
    c.set_node_ready(host, False, reason="KubeletNotReady")
    assert not col.until(lambda col: col.kinds(base.NODE_LOST), timeout=0.5)
    c.set_node_ready(host, True)
    assert not col.until(lambda col: col.kinds(base.NODE_LOST), timeout=1.5)
    assert [n.phase for n in col.last.nodes] == [base.RUNNING] * 2


def test_sim_cancel_force_deletes_pod_stuck_terminating_and_next_attempt_runs(fake_api, backend):
    """Simulation: a pod left Terminating on a dead node (taint manager deleted it, no
    kubelet to confirm) is force-deleted by cancel; the Job and Service go (Foreground);
    the next attempt, excluding the node, lands on the other nodes and runs."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    host = col.last.nodes[1].host
    c.kill_node(host)
    def stuck() -> list:
        return [p for p in fake_api.store.list("pods")[0]
                if p["spec"].get("nodeName") == host and p["metadata"].get("deletionTimestamp")]
    assert c.run_until(lambda: stuck())
    for _ in range(10):
        c.tick()
    assert stuck(), "the pod should be stuck Terminating without a kubelet"
    assert col.until(lambda col: col.kinds(base.NODE_LOST))
    col.until(lambda col: False, timeout=0.2)
    seen = len(col.events)
    backend.cancel(ref)
    deletes = fake_api.api.sent("DELETE", "/pods/")
    assert any(str((r["body"] or {}).get("gracePeriodSeconds", r["query"].get("gracePeriodSeconds"))) == "0"
               and host_of(fake_api, r) == host for r in deletes)
    assert c.run_until(lambda: not fake_api.store.list("pods")[0] and not fake_api.store.list("jobs")[0])
    assert not fake_api.store.list("services")[0]
    log_reads = [host_of(fake_api, r) for r in fake_api.api.sent("GET", "/log")
                 if r["query"].get("tailLines")]
    assert host not in log_reads, "teardown asked a dead kubelet for a log"
    backend.cancel(ref)                        # idempotent: everything is 404 now
    col.poll()
    assert [e.kind for e in col.events[seen:]] == [base.CANCELLED]   # teardown is not a failure
    ref1 = backend.submit(rendered_plan("sim", 1, excluded_nodes=(host,), parent=0))
    col1 = Collector(backend, ref1)
    assert col1.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    assert host not in {n.host for n in col1.last.nodes}
    assert [r.attempt for r in backend.attempts("sim")] == [1]


def host_of(fake_api, request) -> str | None:
    """The node of the pod a recorded DELETE addressed (from the store's history)."""
    name = request["path"].rsplit("/", 1)[-1]
    with fake_api.store.cond:
        hosts = [ch.obj["spec"].get("nodeName") for ch in fake_api.store._history
                 if ch.resource == "pods" and ch.obj["metadata"]["name"] == name]
    return next((h for h in reversed(hosts) if h), None)


def test_sim_watch_drop_and_410_lose_and_duplicate_nothing(fake_api, backend):
    """Simulation: watch streams cut mid-run and history compacted (410 Gone) while pods
    change -> the backend reconnects / re-lists; every fact arrives exactly once."""
    c = fake_api.cluster
    c.script(job="sim-a0", index=0, run_seconds=1.2,
             logs=[(0.05 * i, f'WMCTL-PROGRESS {{"event":"step","step":{i}}}') for i in range(20)])
    c.script(job="sim-a0", index=1, run_seconds=0.8)
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: col.kinds(base.NODE_STARTED))
    fake_api.faults.drop_watches()
    col.until(lambda col: len(col.kinds(base.PROGRESS)) >= 8)
    c.stop()                      # freeze the cluster, change things while watches are down
    fake_api.faults.fail_next(3, code=503, verb="GET", watch=True)
    fake_api.faults.drop_watches()
    c.tick()
    fake_api.store.compact()
    c.start()
    assert col.until(lambda col: col.last.finished, timeout=20)
    assert col.until(lambda col: len(col.kinds(base.PROGRESS)) == 20)
    stats = backend.watch_stats(ref)
    assert sum(s["reconnects"] for s in stats.values()) >= 3
    assert sum(s["relists"] for s in stats.values()) >= 1
    steps = [e.progress["step"] for e in col.kinds(base.PROGRESS)]
    assert steps == list(range(20))
    assert sorted((e.node, e.exit_code) for e in col.kinds(base.NODE_EXITED)) == [(0, 0), (1, 0)]
    assert len(col.kinds(base.NODE_STARTED)) == 2
    assert not col.kinds(base.NODE_LOST)


def test_sim_lost_create_response_then_409_is_adopted(fake_api, backend):
    """Simulation: the Job create succeeds on the server but its response is lost; the
    backend's retry gets 409 AlreadyExists and adopts the Job: one Job, no error."""
    fake_api.faults.lose_response_next(1, verb="POST", path="/jobs")
    ref = backend.submit(rendered_plan("sim", 0))
    assert len(fake_api.api.sent("POST", "/jobs")) == 2
    assert [j["metadata"]["name"] for j in fake_api.store.list("jobs")[0]] == ["sim-a0"]
    assert ref.attempt == 0


def test_sim_5xx_on_create_is_retried_then_gives_up_clearly(fake_api, backend):
    """Simulation: two 503s on create are retried inside the API helper; a persistent 500
    ends in a BackendError naming the operation, not a traceback from the client."""
    fake_api.faults.fail_next(2, code=503, verb="POST", path="/services")
    backend.submit(rendered_plan("sim", 0))
    assert len(fake_api.api.sent("POST", "/services")) == 3
    fake_api.faults.fail_next(100, code=500, verb="POST", path="/services")
    with pytest.raises(BackendError) as err:
        backend.submit(rendered_plan("sim", 1))
    assert "create Service default/sim-a1" in str(err.value)


def test_sim_pod_deleted_by_someone_else_is_node_lost(fake_api, backend):
    """Simulation: a pod force-deleted behind our back (not by cancel) -> NODE_LOST."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    pod = next(p for p in fake_api.store.list("pods")[0]
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    client.CoreV1Api(fake_api.client).delete_namespaced_pod(pod["metadata"]["name"], "default",
                                                            grace_period_seconds=0)
    assert col.until(lambda col: col.kinds(base.NODE_LOST))
    assert (col.kinds(base.NODE_LOST)[0].node, col.kinds(base.NODE_LOST)[0].reason) == (1, "PodDeleted")


def test_sim_pod_deleted_while_the_pod_watch_is_down_is_still_the_root_cause(fake_api, backend):
    """Simulation: the pod watch drops and cannot re-list while a pod is deleted by hand; the
    Job watch reports the Job Failed (the deletion counts against backoffLimit 0) before the
    pod watch learns of the deletion. The deletion is still the root cause (NODE_LOST on node
    1), not hidden as a consequence of the Job's failure; the survivor the Job controller
    then deletes is not reported as a second loss."""
    c = fake_api.cluster
    c.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    fake_api.server.faults.fail_next(10_000, code=503, verb="GET", path=r"/pods$", watch=False)
    fake_api.server.faults.fail_next(10_000, code=503, verb="GET", path=r"/pods$", watch=True)
    fake_api.server.faults.drop_watches()
    pod = next(p for p in fake_api.store.list("pods")[0]
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    client.CoreV1Api(fake_api.client).delete_namespaced_pod(pod["metadata"]["name"], "default",
                                                            grace_period_seconds=0)
    state = next(iter(backend._attempts.values()))    # peek: the Job watch has seen the failure
    assert c.run_until(lambda: any(cd.get("type") == "Failed" for cd in
                                   ((state.job or {}).get("status") or {}).get("conditions") or []))
    assert not col.kinds(base.NODE_LOST)
    fake_api.server.faults.clear()
    assert col.until(lambda col: col.kinds(base.NODE_LOST) and not fake_api.store.list("pods")[0])
    col.until(lambda col: False, timeout=0.3)
    lost = col.kinds(base.NODE_LOST)
    assert [(e.node, e.reason) for e in lost] == [(1, "PodDeleted")]


VERSIONS = ["1.30", "1.34"]


def test_sim_every_manifest_sent_passes_strict_schema(fake_api, backend):
    """Simulation: every object body the backend POSTed (submit of two attempts, with an
    excluded node) validates strictly against the official 1.30 and 1.34 schemas."""
    fake_api.faults.lose_response_next(1, verb="POST", path="/jobs")
    backend.submit(rendered_plan("sim", 0))
    backend.submit(rendered_plan("sim", 1, excluded_nodes=("node-a",), parent=0))
    backend.submit(manifest_plan(attempt_manifests("other", 0, excluded_nodes=["node-b"])))
    bodies = [r["body"] for r in fake_api.api.sent("POST")]
    assert len(bodies) == 7 and {b["kind"] for b in bodies} == {"Service", "Job"}
    for body in bodies:
        for version in VERSIONS:
            kubernetes_validate.validate(body, version, strict=True)


def test_sim_watcher_restart_picks_up_a_running_attempt(fake_api, backend):
    """Simulation: a fresh backend (a restarted watcher) finds the attempt by its labels
    and observes its nodes without submitting anything."""
    fake_api.cluster.default_script.run_seconds = None
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    fresh = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        (found,) = fresh.attempts("sim")
        assert found == ref
        col2 = Collector(fresh, found)
        assert col2.until(lambda c: [n.phase for n in c.last.nodes] == [base.RUNNING] * 2)
        assert len(col2.kinds(base.NODE_STARTED)) == 2
    finally:
        fresh.close()
    assert len(fake_api.api.sent("POST")) == 2


@pytest.mark.fake_api(crds=["podgroups.scheduling.volcano.sh"])
def test_sim_volcano_podgroup_is_created_before_the_job_and_cancelled(fake_api, backend):
    """Simulation: a Volcano-scheduled plan creates Service, PodGroup (custom object), then
    the Job; cancel deletes the PodGroup too."""
    plan = rendered_plan("sim", 0, kube={"scheduler": "volcano", "queue": "research"},
                         namespace="team")
    ref = backend.submit(plan)
    posts = [r["path"].rsplit("/", 1)[-1] for r in fake_api.api.sent("POST")]
    assert posts == ["services", "podgroups", "jobs"]
    assert ref.namespace == "team"
    pg = fake_api.store.get("podgroups", "team", "sim-a0")
    assert pg["spec"]["minMember"] == 2
    backend.submit(plan)                       # adopts all three
    assert len(fake_api.api.sent("POST")) == 6 and len(fake_api.store.list("podgroups")[0]) == 1
    # `wmctl cancel` from elsewhere: a fresh backend learns from the Job that its pods joined a
    # PodGroup, and deletes that
    other = KubernetesBackend(fake_api.client, watch_timeout=2, namespace="team")
    try:
        (found,) = other.attempts("sim")
        other.cancel(found)
    finally:
        other.close()
    assert not fake_api.store.exists("podgroups", "team", "sim-a0")


def test_sim_namespace_only_user_sees_the_loss_and_tears_down_every_step(fake_api):
    """Simulation: a user with the built-in `edit` role (no Node access). A dead machine is seen
    from the pod's own Ready condition; cancel still archives, deletes the Job and Service and
    force-deletes the pod stuck on the dead node (no Node read: the pod's evidence decides), and
    notes only what it could not do; the next attempt runs."""
    alice = fake_api.as_user("alice-token", role="edit", namespace="default")
    backend = KubernetesBackend(alice, watch_timeout=2)
    try:
        c = fake_api.cluster
        c.default_script.run_seconds = None
        ref, col = _submit(fake_api, backend)
        assert col.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
        host = col.last.nodes[1].host
        c.kill_node(host)
        assert col.until(lambda col: col.kinds(base.NODE_LOST))
        lost = col.kinds(base.NODE_LOST)[0]
        assert (lost.node, lost.host, lost.reason) == (1, host, "NodeNotReady")
        stuck = lambda: [p for p in fake_api.store.list("pods")[0]  # noqa: E731
                         if p["spec"].get("nodeName") == host and p["metadata"].get("deletionTimestamp")]
        assert c.run_until(lambda: stuck())
        backend.cancel(ref)
        assert c.run_until(lambda: not fake_api.store.list("pods")[0] and not fake_api.store.list("jobs")[0])
        assert not fake_api.store.list("services")[0]
        graces = {str((r["body"] or {}).get("gracePeriodSeconds", r["query"].get("gracePeriodSeconds")))
                  for r in fake_api.api.sent("DELETE", "/pods/") if host_of(fake_api, r) == host}
        assert graces == {"0"}, graces
        assert backend.teardown_notes(ref) == []        # nothing it needed was refused
        # no Volcano asked for, none installed: no PodGroup is touched (it would be a 403 here)
        assert not fake_api.api.sent(None, "/podgroups")
        ref1 = backend.submit(rendered_plan("sim", 1, excluded_nodes=(host,), parent=0))
        col1 = Collector(backend, ref1)
        assert col1.until(lambda col: [n.phase for n in col.last.nodes] == [base.RUNNING] * 2)
    finally:
        backend.close()


def test_sim_a_forbidden_job_delete_fails_the_teardown_after_every_other_step(fake_api):
    """Simulation: a `view`-only user cannot delete the Job: every other step is still tried,
    then the teardown fails naming what was refused and how to finish it by hand."""
    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        ref, col = _submit(fake_api, backend)
        assert col.until(lambda col: col.kinds(base.NODE_STARTED))
    finally:
        backend.close()
    viewer = KubernetesBackend(fake_api.as_user("v-token", role="view", namespace="default"), watch_timeout=2)
    try:
        with pytest.raises(BackendError) as err:
            viewer.cancel(ref)
    finally:
        viewer.close()
    text = str(err.value)
    assert "cannot delete Job default/sim-a0: 403" in text and "cannot delete Service default/sim-a0: 403" in text
    assert "kubectl -n default delete job sim-a0" in text
    assert fake_api.api.sent("DELETE", "/services/sim-a0") and fake_api.api.sent("GET", "/pods")


def test_sim_cancel_intent_is_written_under_the_watcher_rbac(fake_api, backend):
    """Simulation: under exactly manifests/rbac-watcher.yaml, another machine's cancel can write
    its intent on the Job (a patch): the watcher elsewhere reads it from there."""
    from .fakeapi.rbac import User
    from .manifests import watcher_rbac

    fake_api.cluster.start()
    ref = backend.submit(rendered_plan("sim", 0, namespace="training"))
    who = User.service_account("training", "wmctl-watcher")
    sa = KubernetesBackend(fake_api.as_user("sa-token", who, manifests=watcher_rbac()), watch_timeout=2,
                           namespace="training")
    try:
        sa.note_cancel(ref, {"by": "elsewhere"})
    finally:
        sa.close()
    job = fake_api.store.get("jobs", "training", "sim-a0")
    assert "elsewhere" in job["metadata"]["annotations"].get("wmctl.io/cancel-requested", "")
    assert not [r for r in fake_api.refused(403) if r.get("user") == who.name]


@pytest.mark.parametrize("events_kept", [True, False])
def test_sim_an_attempt_the_ttl_removed_unwatched_is_resolved_not_waited_for(fake_api, events_kept):
    """Simulation: a finished Job removed by ttlSecondsAfterFinished while nobody watched. A
    watcher adopting the attempt gets an end, not an eternal Pending: succeeded from the Job
    controller's "Completed" Event; once the Events have expired too (--event-ttl), a loss
    that says why (a watcher with --auto-resume then resumes from the newest checkpoint)."""
    c = fake_api.cluster
    c.start()
    first = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        ref = first.submit(rendered_plan("sim", 0, kube={"ttl_seconds_after_finished": 20}))
    finally:
        first.close()
    assert c.run_until(lambda: not fake_api.store.list("jobs")[0] and not fake_api.store.list("pods")[0])
    if not events_kept:
        for e in fake_api.store.list("events")[0]:
            fake_api.store.remove("events", e["metadata"]["namespace"], e["metadata"]["name"])
    later = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        col = Collector(later, ref)
        assert col.until(lambda col: col.last.finished)
        if events_kept:
            assert {n.phase for n in col.last.nodes} == {base.SUCCEEDED} and not col.kinds(base.NODE_LOST)
        else:
            (lost,) = col.kinds(base.NODE_LOST)
            assert lost.reason == "JobGone" and "no Event says how it ended" in lost.message
    finally:
        later.close()


def test_sim_log_rotation_during_a_dropped_stream_loses_no_progress(fake_api, backend):
    """Simulation: rank 0's log stream drops and the kubelet rotates the log before the watcher
    reconnects; the new file holds fewer lines than were already read. Every progress line
    written after the rotation still arrives, once (resumed by timestamp, not by line count: a
    count would skip them and the run would look hung)."""
    c = fake_api.cluster
    c.script(job="sim-a0", index=0, run_seconds=2.0,
             logs=[(0.08 * i, f'WMCTL-PROGRESS {{"event":"step","step":{i}}}') for i in range(20)])
    c.script(job="sim-a0", index=1, run_seconds=2.0)
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: len(col.kinds(base.PROGRESS)) >= 8)
    c.stop()                                   # freeze the job's output while the log rotates
    pod0 = next(p for p in fake_api.store.list("pods")[0]
                if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0")
    written = len(fake_api.api.log_lines("default", pod0["metadata"]["name"], "trainer"))
    assert col.until(lambda col: len(col.kinds(base.PROGRESS)) == written)
    fake_api.faults.drop_watches()             # cuts the log stream too
    fake_api.api.rotate_log("default", pod0["metadata"]["name"], "trainer")
    c.start()
    assert col.until(lambda col: col.last.finished, timeout=20)
    assert col.until(lambda col: len(col.kinds(base.PROGRESS)) >= 20, timeout=60)
    assert [e.progress["step"] for e in col.kinds(base.PROGRESS)] == list(range(20))
    reads = [r for r in fake_api.api.sent("GET", "/log") if r["query"].get("follow") == "true"]
    assert all(r["query"].get("timestamps") == "true" for r in reads)
    assert any("sinceSeconds" in r["query"] for r in reads[1:])



def test_sim_a_progress_line_stamped_before_the_note_written_ahead_of_it_arrives(fake_api, backend):
    """Simulation: the runtime stamps each stream's lines on its own (containerd
    internal/cri/io/logger.go), so rank 0's `resume` line on stdout, printed right after the
    runtime's note on stderr, lands in the log behind the note with an earlier stamp. It still
    arrives, once, in log order (CI lost exactly this line on Docker: a follower that dropped
    every line older than the newest read)."""
    c = fake_api.cluster
    resume = 'WMCTL-PROGRESS {"event":"resume","step":10}'
    c.script(job="sim-a0", index=0, run_seconds=1.0,
             logs=[(0.05, 'WMCTL-PROGRESS {"event":"start"}'),
                   (0.1, "wmctl: checkpoint /ckpt/base/step-00000010: resumed from run base"),
                   (0.1, resume, 0.002)]
             + [(0.1 + 0.05 * i, f'WMCTL-PROGRESS {{"event":"step","step":{10 + i}}}') for i in range(1, 6)])
    c.script(job="sim-a0", index=1, run_seconds=1.0)
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda col: col.last.finished)
    assert col.until(lambda col: len(col.kinds(base.PROGRESS)) >= 7, timeout=60)
    events = [e.progress.get("event") for e in col.kinds(base.PROGRESS)]
    assert events == ["start", "resume"] + ["step"] * 5, events


def test_sim_a_rate_limited_registry_is_waited_out_not_a_failed_pull(fake_api, backend):
    """Simulation: the registry answers 429 to the first pulls (ErrImagePull with the
    runtime's error), then lets the nodes in. Not an image that will never come: no
    IMAGE_PULL_FAILED (it stops the run), the pods start and the run succeeds."""
    image = "registry.example.com/team/busy:v1"
    fake_api.cluster.rate_limited_images[image] = 0.4
    ref, col = _submit(fake_api, backend, image=image)
    assert fake_api.cluster.run_until(lambda: any(
        (cs.get("state") or {}).get("waiting", {}).get("reason") == "ErrImagePull"
        for p in fake_api.store.list("pods")[0] for cs in p["status"].get("containerStatuses") or []))
    assert col.until(lambda col: col.last.finished)
    assert [n.phase for n in col.last.nodes] == [base.SUCCEEDED] * 2
    assert not col.kinds(base.IMAGE_PULL_FAILED)


def _pooled_streams(fake_api) -> set:
    """Connections the client keeps for reuse whose server handler is still streaming (a watch or
    a followed log): the next request sent on one waits for the stream to end, or its read timeout
    (CI saw a node watcher's list wait past close() that way)."""
    kept = set()
    for pool in fake_api.client.rest_client.pool_manager.pools._container.values():
        for conn in list(pool.pool.queue):
            if conn is not None and conn.sock is not None:
                kept.add(conn.sock.getsockname()[:2])
    return kept & set(fake_api.server.streaming)


def test_sim_logs_follow_left_mid_stream_is_not_pooled_for_reuse(fake_api, backend, tmp_path, monkeypatch):
    """`wmctl logs -f` whose reader stops (a pipe closed, the attempt ended) leaves the pod's log
    stream mid-way: its connection must be closed, not kept for the client's next call."""
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    fake_api.cluster.script(job="sim-a0", run_seconds=None, logs=[(0.0, "first")])
    ref, col = _submit(fake_api, backend)
    assert col.until(lambda c: [n.phase for n in c.last.nodes] == [base.RUNNING] * 2)
    lines = backend.logs(ref, 0, follow=True)
    assert next(lines) == "first"
    assert fake_api.server.streaming                  # the server still streams the quiet log
    lines.close()
    assert not _pooled_streams(fake_api)


def test_sim_log_follower_stopped_while_its_request_was_on_its_way_pools_no_stream(fake_api, backend,
                                                                                  monkeypatch):
    """close() that runs while a log follower's request is on its way finds no response to shut;
    the follower then leaves the stream unread: its connection must be closed, not pooled."""
    core = client.CoreV1Api
    original = core.read_namespaced_pod_log

    def close_races(self, *args, **kwargs):
        resp = original(self, *args, **kwargs)
        if kwargs.get("follow"):
            for st in list(backend._attempts.values()):
                st.stop.set()             # what close() does first
        return resp
    monkeypatch.setattr(core, "read_namespaced_pod_log", close_races)
    fake_api.cluster.script(job="sim-a0", run_seconds=None, logs=[(0.0, "first")])
    ref, col = _submit(fake_api, backend)
    st = backend._state(ref)
    assert st.stop.wait(15)
    for t in list(st.log_threads.values()):
        t.join(timeout=10)
        assert not t.is_alive()
    assert not _pooled_streams(fake_api)
