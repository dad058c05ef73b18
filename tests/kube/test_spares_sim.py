"""Spare nodes on Kubernetes (restart.spares; backends/kubernetes/spares.py and rounds.py)
against the fake API server, whose Job controller keeps backoffLimitPerIndex, maxFailedIndexes
and elastic Indexed Jobs as pkg/controller/job does.

The pods are scripted (the fake runs no keeper): these tests hold what the watcher does through
the API (the spare's pod, the rounds it writes, the pod it fences, the Job it never creates) and
what the Job controller then does; the keeper's own reading of the rounds through the API is
tests/kube/test_keeper_rounds_api.py's, with a real keeper process.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.backends import base
from orchestrator.backends.kubernetes.spares import ROUND_KEY, rounds_name, store_name
from orchestrator.runtime.keeper import CLOSED, exit_line, newest_of
from orchestrator.runtime.protocol import format_progress

from ..unit.test_own_error import EVERY_RANK_RAISED, PEER_DIED

from .manifests import rendered_plan
from .simhelpers import Collector, node_of_index, running_pods, start_supervisor

pytestmark = pytest.mark.timeout(90)
SPARES = {"spares": 1, "auto_resume": True}


def _rounds(fake_api, job: str, namespace: str = "default") -> dict[str, str]:
    return fake_api.store.get("configmaps", namespace, rounds_name(job))["data"]


def _job(fake_api, name: str) -> dict:
    return fake_api.store.get("jobs", "default", name)


@pytest.mark.fake_api(nodes=["node-a", "node-b", "node-c", "node-d"])
def test_sim_spare_pod_waits_uncounted_and_replaces_a_lost_node_in_place(fake_api, backend):
    """An attempt with one spare: its Job has nodes + 1 indexes (backoffLimitPerIndex 0,
    maxFailedIndexes 1) and the store runs in a pod of its own; poll reports the two nodes only,
    not the spare. Node 0's machine dies; the survivor's keeper says its torchrun failed (its
    peer's connection broke) before the loss is seen: no exit of slot 1 is reported (its keeper
    holds), nor later a keeper's word of an older round. recover_in_place deletes node 0's pod, writes round 1 with
    the spare in its place, and creates no Job and no pod; the Job controller fails index 0 only
    (status.failedIndexes) and makes no pod for it; poll reports slots 1 and 2. A new spare
    (replenish_spare) is a fourth index of the same Job (an elastic Indexed Job), whose pod pulls
    for minutes: it is no spare until it runs, so a second loss meanwhile gets none. Once both
    active slots succeeded the attempt is finished, and release closes the rounds (the idle
    spares' keepers end)."""
    cluster = fake_api.cluster
    cluster.script(job="sp-a0", run_seconds=None)
    active = cluster.script(job="sp-a0", run_seconds=None, when=lambda p: True)   # every slot, until told
    cluster.script(job="sp-a0", index=3, run_seconds=None, start_delay=300.0)      # a 5-minute image pull
    cluster.script(when=lambda p: p["metadata"]["name"] == store_name("sp-a0"), run_seconds=None)
    cluster.start()
    ref = backend.submit(rendered_plan("sp", 0, restart=SPARES))
    c = Collector(backend, ref)

    job = _job(fake_api, "sp-a0")
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (3, 3)
    assert (job["spec"]["backoffLimitPerIndex"], job["spec"]["maxFailedIndexes"]) == (0, 1)
    assert job["spec"]["backoffLimit"] == 2**31 - 1          # the API server's default with per-index limits
    store = fake_api.store.get("pods", "default", store_name("sp-a0"))
    assert store["spec"]["hostname"] == store_name("sp-a0") and store["spec"]["subdomain"] == "sp-a0"
    assert any(r["uid"] == job["metadata"]["uid"] for r in store["metadata"]["ownerReferences"])
    round0 = newest_of(_rounds(fake_api, "sp-a0"))
    assert round0 is not None and round0["active"] == [0, 1]

    assert c.until(lambda c: len(running_pods(fake_api, "sp-a0")) == 3
                   and [(n.node, n.phase) for n in c.last.nodes] == [(0, base.RUNNING), (1, base.RUNNING)]), \
        c.last.nodes
    assert not [e for e in c.events if e.node == 2], c.events     # the spare is no node of the job
    assert store_name("sp-a0") not in {e.host for e in c.events}

    dead = node_of_index(running_pods(fake_api, "sp-a0"), 0)
    cluster.kill_node(dead)
    # the survivor's torchrun fails at once (its peer's connection broke) and its keeper says so,
    # long before the node's loss is evidence: no exit of slot 1 (its keeper holds), no app error
    survivor = next(p for p in running_pods(fake_api, "sp-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    for line in [*PEER_DIED, exit_line(0, 1, 1, None), _progress("sentinel", 1)]:
        fake_api.api.append_log("default", survivor["metadata"]["name"], survivor["spec"]["containers"][0]["name"],
                                line)
    assert c.until(lambda c: any(e.kind == base.NODE_LOST and e.node == 0 for e in c.events)
                   and {"event": "sentinel", "step": 1} in [e.progress for e in c.events]), c.events
    assert not [e for e in c.events if e.kind == base.NODE_EXITED], c.events
    jobs_before = fake_api.api.sent("POST", "/jobs")
    pods_before = fake_api.api.sent("POST", "/pods")
    got = backend.recover_in_place(ref, 0)
    assert got is not None and (got.round, got.lost, got.spare, got.spares_left) == (1, 0, 2, 0)
    assert fake_api.api.sent("POST", "/jobs") == jobs_before and fake_api.api.sent("POST", "/pods") == pods_before
    round1 = json.loads(_rounds(fake_api, "sp-a0")[ROUND_KEY.format(n=1)])
    assert round1["active"] == [2, 1] and round1["rdzv_id"] == "sp-a0-r1"
    assert round1["env"] == {"WMCTL_RESUME": "1", "WMCTL_FENCE_EPOCH": "1"}
    assert fake_api.api.sent("DELETE", "/pods/sp-a0-0-")[-1]["query"].get("gracePeriodSeconds") == "0"
    assert cluster.run_until(lambda: _job(fake_api, "sp-a0")["status"].get("failedIndexes") == "0")
    assert not [p for p in fake_api.store.list("pods")[0]
                if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"]
    assert c.until(lambda c: [n.node for n in c.last.nodes] == [1, 2]
                   and all(n.phase == base.RUNNING for n in c.last.nodes)), c.last.nodes
    # a keeper's word of an older round (said before it restarted for this one) is no news either
    for line in [*EVERY_RANK_RAISED, exit_line(0, 1, 1, None), _progress("sentinel", 2)]:
        fake_api.api.append_log("default", survivor["metadata"]["name"], survivor["spec"]["containers"][0]["name"],
                                line)
    assert c.until(lambda c: {"event": "sentinel", "step": 2} in [e.progress for e in c.events]), c.events
    assert not [e for e in c.events if e.kind == base.NODE_EXITED], c.events
    # a watcher that did not write the rounds (a restarted one) reads them from the cluster
    from orchestrator.backends.kubernetes.engine import KubernetesBackend

    other = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        assert Collector(other, ref).until(lambda o: [n.node for n in o.last.nodes] == [1, 2])
    finally:
        other.close()
    # a failed index gets no pod on purpose: the Job's Events are not read for why (FailedCreate)
    read = len(fake_api.api.sent("GET", "/events"))
    c.until(lambda c: False, timeout=2.5)          # past FAILED_CREATE_EVERY_S, polling
    assert len(fake_api.api.sent("GET", "/events")) == read

    assert backend.replenish_spare(ref, 0) == 3
    job = _job(fake_api, "sp-a0")
    assert (job["spec"]["completions"], job["spec"]["parallelism"], job["spec"]["maxFailedIndexes"]) == (4, 4, 2)
    assert cluster.run_until(lambda: any(p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "3"
                                         for p in fake_api.store.list("pods")[0]))
    assert backend.recover_in_place(ref, 1) is None          # still pulling: not warm, never waited for
    assert [n.node for n in c.poll().nodes] == [1, 2]        # a pulling spare is no node either

    active.run_seconds = 0.0                                  # the round's keepers finish the job
    assert c.until(lambda c: c.last.finished), c.last.nodes
    backend.release(ref)
    assert CLOSED in _rounds(fake_api, "sp-a0")
    assert [j["metadata"]["name"] for j in fake_api.store.list("jobs")[0]] == ["sp-a0"]


def test_sim_spare_job_fails_once_more_nodes_are_lost_than_spares(fake_api):
    """The Job's own bound (maxFailedIndexes: spares), for a watcher that is gone: two indexes
    failed with one spare fail the Job (MaxFailedIndexesExceeded) and its running pods are
    deleted; one failed index alone does not."""
    from .fakeapi.api import RESOURCES

    cluster = fake_api.cluster
    cluster.script(job="mx-a0", run_seconds=None)
    cluster.script(job="mx-a0", index=0, run_seconds=0.1, exit_code=1)
    cluster.script(when=lambda p: p["metadata"]["name"] == store_name("mx-a0"), run_seconds=None)
    cluster.start()
    plan = rendered_plan("mx", 0, restart=SPARES)
    job = next(o for o in plan.resources if o["kind"] == "Job")
    fake_api.api.create(RESOURCES[("batch/v1", "jobs")], "default", job)
    assert cluster.run_until(lambda: _job(fake_api, "mx-a0")["status"].get("failedIndexes") == "0"
                             and _job(fake_api, "mx-a0")["status"].get("active") == 2)
    assert not any(c["type"] in ("FailureTarget", "Failed") for c in _job(fake_api, "mx-a0")["status"]["conditions"]
                   ) if _job(fake_api, "mx-a0")["status"].get("conditions") else True
    victim = next(p for p in running_pods(fake_api, "mx-a0")
                  if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    fake_api.api.delete_pod("default", victim["metadata"]["name"], 0)
    assert cluster.run_until(lambda: any(c["type"] == "Failed" and c["reason"] == "MaxFailedIndexesExceeded"
                                         for c in _job(fake_api, "mx-a0")["status"].get("conditions") or []))
    assert cluster.run_until(lambda: not running_pods(fake_api, "mx-a0"))


def _progress(event: str, step: int) -> str:
    return f'WMCTL-PROGRESS {{"event":"{event}","step":{step}}}'


@pytest.mark.fake_api(nodes=["node-a", "node-b", "node-c", "node-d", "node-e", "node-f"])
def test_sim_supervisor_replaces_node_0_in_place_then_a_second_loss_starts_a_new_attempt(fake_api, tmp_path,
                                                                                          monkeypatch):
    """The real supervisor, one spare: node 0's machine dies after checkpoint 10 -> the spare takes
    its place in round 1 (no new attempt, no Job created); once the round steps, a new spare is
    started in the background (a fourth index whose image pull takes 5 minutes); checkpoint 20;
    then node 1's machine dies while that spare still pulls -> no spare is warm, so attempt 1
    replaces attempt 0 (the pull never held the run) and resumes from checkpoint 20. The watcher
    runs under exactly manifests/rbac-watcher.yaml: not one of its requests is refused."""
    from orchestrator.backends.kubernetes.engine import KubernetesBackend
    from orchestrator.specload import from_dict

    from .fakeapi.rbac import User
    from .manifests import watcher_rbac

    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "spr", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "restart": {"max_attempts": 3, "backoff": "0s", "heartbeat_timeout": "60s", "spares": 1},
        "kubernetes": {"namespace": "training"},
    })
    client = fake_api.as_user("sa-token", User.service_account("training", "wmctl-watcher"), manifests=watcher_rbac())
    cluster = fake_api.cluster
    cluster.script(when=lambda p: p["metadata"]["name"].endswith("-store"), run_seconds=None)
    cluster.script(job="spr-a0", run_seconds=None)
    cluster.script(job="spr-a0", index=0, run_seconds=None,
                   logs=[(0.0, _progress("start", 0)), (0.05, _progress("checkpoint", 10)),
                         (0.1, _progress("step", 12))])
    cluster.script(job="spr-a0", index=3, run_seconds=None, start_delay=300.0)     # a 5-minute image pull
    cluster.script(job="spr-a1", run_seconds=1.0)
    cluster.script(job="spr-a1", index=0, run_seconds=1.2,
                   logs=[(0.0, _progress("resume", 20)), (0.2, _progress("step", 25))])
    cluster.start()

    backend = KubernetesBackend(client, watch_timeout=2, namespace="training")
    thread, result, store, lines = start_supervisor(spec, backend)

    def said(text: str) -> bool:
        return any(text in ln for ln in lines)

    try:
        assert cluster.run_until(lambda: len(running_pods(fake_api, "spr-a0")) == 3 and said("checkpoint")), (
            lines, [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"))
                    for p in fake_api.store.list("pods")[0]], cluster.timeline[-15:])
        dead0 = node_of_index(running_pods(fake_api, "spr-a0"), 0)
        cluster.kill_node(dead0)
        assert cluster.run_until(lambda: said("spare node 2 takes its place in round 1"), timeout=30), lines
        pod1 = next(p for p in running_pods(fake_api, "spr-a0")
                    if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
        # round 0's runtime said node 0 was silent just before its keeper stopped it, read only now:
        # no news of round 1 (a second node_lost would end the attempt)
        fake_api.api.append_log("training", pod1["metadata"]["name"], "trainer", format_progress(
            "node_silent", host=dead0, silent_s=30.0, group_rank=0, witness=1))
        # the round's keepers restart their torchrun; rank 0 (on slot 1 now) tells the resume
        for event, step in (("resume", 10), ("step", 11), ("checkpoint", 20), ("step", 21)):
            fake_api.api.append_log("training", pod1["metadata"]["name"], "trainer", _progress(event, step))
        assert cluster.run_until(lambda: said("spare node 3 started in the background"), timeout=30), lines
        assert cluster.run_until(lambda: store.load().attempts[0].last_checkpoint_step == 20, timeout=30), lines
        dead1 = node_of_index(running_pods(fake_api, "spr-a0"), 1)
        cluster.kill_node(dead1)
        thread.join(timeout=60)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()

    assert result["outcome"].exit_code == 0, result["outcome"].report
    a0, a1 = store.load().attempts
    recovered = [(r["lost_node"], r["spare_node"], r["round"], r.get("replenished")) for r in a0.recoveries]
    assert recovered == [(0, 2, 1, 3)]
    assert (a0.outcome, a0.failed_node) == ("node_lost", 1), a0
    assert said("no spare node is left"), lines
    assert (a1.outcome, a1.resumed_from_step) == ("succeeded", 20), "\n".join(lines)
    # attempt 1 keeps off both machines: the one lost in place too, remembered for the next runs
    assert {dead0, dead1} <= set(a1.excluded_nodes), a1.excluded_nodes
    assert said(f"{dead0} remembered as excluded on"), lines
    created = [r["body"]["metadata"]["name"] for r in fake_api.api.sent("POST", "/jobs")]
    assert created == ["spr-a0", "spr-a1"]          # the in-place recovery created none
    assert not fake_api.refused(403), fake_api.refused(403)[:3]


def test_sim_the_stores_loss_is_the_attempts_at_once(fake_api, backend):
    """The c10d store's pod goes (deleted here; its node's loss reads the same): every keeper's
    torchrun loses the rendezvous, and a keeper would end only after its hold, so poll says it at
    once, as a loss of no node of the job (a new attempt replaces this one, away from its host)."""
    cluster = fake_api.cluster
    cluster.script(job="st-a0", run_seconds=None)
    cluster.script(when=lambda p: p["metadata"]["name"] == store_name("st-a0"), run_seconds=None)
    cluster.start()
    ref = backend.submit(rendered_plan("st", 0, restart=SPARES))
    c = Collector(backend, ref)
    assert c.until(lambda c: len(running_pods(fake_api, "st-a0")) == 3 and len(c.last.nodes) == 2), (
        [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"))
         for p in fake_api.store.list("pods")[0]], fake_api.cluster.timeline[-15:], _job(fake_api, "st-a0")["status"])
    assert cluster.run_until(lambda: fake_api.store.get("pods", "default", store_name("st-a0"))["status"]
                             .get("phase") == "Running")
    assert not c.kinds(base.NODE_LOST)
    host = fake_api.store.get("pods", "default", store_name("st-a0"))["spec"]["nodeName"]
    fake_api.api.delete_pod("default", store_name("st-a0"), 0)
    assert c.until(lambda c: c.kinds(base.NODE_LOST)), c.events
    lost = c.kinds(base.NODE_LOST)
    assert [(e.node, e.host, e.reason) for e in lost] == [(None, host, "StoreLost")], lost
    assert "the c10d store of the spare nodes" in (lost[0].message or "")


def test_failed_indexes_read_as_the_job_controller_writes_them():
    from orchestrator.backends.kubernetes.rounds import failed_indexes

    assert failed_indexes({"status": {"failedIndexes": "0,2-4,7"}}) == {0, 2, 3, 4, 7}
    assert failed_indexes({"status": {"failedIndexes": ""}}) == set() == failed_indexes(None)


def test_fake_api_keeps_completions_immutable_unless_an_indexed_job_grows_in_tandem(fake_api):
    """pkg/apis/batch/validation validateCompletions, which rounds.add_spare relies on: an Indexed
    Job's completions change only together with an equal parallelism (elastic Indexed Jobs)."""
    from .fakeapi.api import RESOURCES
    from .fakeapi.store import ApiError

    jobs = RESOURCES[("batch/v1", "jobs")]
    job = next(o for o in rendered_plan("el", 0, restart=SPARES).resources if o["kind"] == "Job")
    fake_api.api.create(jobs, "default", job)
    with pytest.raises(ApiError) as refused:
        fake_api.api.patch(jobs, "default", "el-a0", {"spec": {"completions": 4}}, "application/merge-patch+json",
                           None)
    assert refused.value.code == 422 and "in tandem with spec.parallelism" in refused.value.message
    fake_api.api.patch(jobs, "default", "el-a0", {"spec": {"completions": 4, "parallelism": 4}},
                       "application/merge-patch+json", None)
    assert _job(fake_api, "el-a0")["spec"]["completions"] == 4


@pytest.mark.fake_api(nodes=["node-a", "node-b", "node-c", "node-d"])
@pytest.mark.timeout(60)
def test_sim_the_jobs_own_error_ends_the_attempt_at_once_not_after_the_keepers_hold(fake_api, tmp_path, monkeypatch):
    """The real supervisor, one spare. One rank's data breaks (KeyError-like, its own traceback)
    and the peers' workers see their connections close. Each pod's keeper holds spares.hold_s
    before it fails its pod: here far longer than this test's own timeout (node_loss_timeout 1 h
    -> a hold of 3660 s), so only the keepers' ``keeper_exit`` lines can end the run in time.
    Slot 0's (a peer broke under it) is no news; slot 1's own traceback is its exit at once: the
    run stops app_error, naming the job's error and slot 1's machine, with no spare spent and no
    new attempt."""
    from orchestrator.backends.kubernetes.engine import KubernetesBackend
    from orchestrator.backends.kubernetes.spares import hold_s
    from orchestrator.specload import from_dict


    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "own", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 3, "backoff": "0s", "spares": 1, "node_loss_timeout": "1h"},
    })
    hold = hold_s(spec)
    assert hold > 60 * 10                # ten times this test's timeout: the hold cannot end it
    cluster = fake_api.cluster
    cluster.script(when=lambda p: p["metadata"]["name"].endswith("-store"), run_seconds=None)
    cluster.script(job="own-a0", run_seconds=None)          # the spare's keeper waits
    # each active slot's keeper: its torchrun fails at step 12, it says so, then holds before its pod fails
    start = [(0.0, _progress("start", 0)), (0.05, _progress("checkpoint", 10)), (0.1, _progress("step", 12))]
    cluster.script(job="own-a0", index=0, run_seconds=float(hold), exit_code=1, logs=[
        *start, *[(0.3, line) for line in PEER_DIED], (0.3, exit_line(0, 0, 1, None))])
    cluster.script(job="own-a0", index=1, run_seconds=float(hold), exit_code=1, logs=[
        (0.0, "training"), *[(0.4, line) for line in EVERY_RANK_RAISED], (0.4, exit_line(0, 1, 1, None))])
    cluster.start()

    backend = KubernetesBackend(fake_api.client, watch_timeout=2)
    thread, result, store, lines = start_supervisor(spec, backend)
    try:
        thread.join(timeout=45)
        assert not thread.is_alive(), "\n".join(lines)
    finally:
        backend.close()

    outcome = result["outcome"]
    [a0] = store.load().attempts
    host1 = a0.failed_host
    assert (outcome.status, a0.outcome, a0.failed_node) == ("failed", "app_error", 1), "\n".join(lines)
    assert host1 and host1 in {n["metadata"]["name"] for n in fake_api.store.list("nodes")[0]}
    assert "ValueError: bad batch at step 20" in outcome.report and host1 in outcome.report, outcome.report
    assert "not retried (app_error)" in outcome.report, outcome.report
    assert a0.error and a0.error[-1] == "ValueError: bad batch at step 20", a0.error
    assert not a0.recoveries                   # the job's error never spends a spare
    assert [r["body"]["metadata"]["name"] for r in fake_api.api.sent("POST", "/jobs")] == ["own-a0"]
