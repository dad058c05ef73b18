"""Kueue holding a Job: the fake's Kueue (tests/kube/fakeapi/cluster.py Cluster._kueue, after
kubernetes-sigs/kueue's job reconciler, workload controller and scheduler) and what the watcher
makes of it. A full queue is said (`queued: ...`, the scheduler's own message) and waited out for
as long as it takes; a queue that does not exist, or no Kueue at all, needs a person: said, then
`unschedulable` after restart.pending_timeout. A user who may not read Workloads (the built-in
edit role) is told the wait without Kueue's reason."""

from __future__ import annotations

import time

import pytest
from .sdk import client as k8s

from orchestrator.backends.kubernetes.classify import kueue_wait
from orchestrator.backends.kubernetes.engine import KubernetesBackend
from orchestrator.specload import from_dict
from orchestrator.state import LocalRunStore as RunStore
from orchestrator.state import RunRecord
from orchestrator.supervisor import Supervisor, SupervisorOptions
from orchestrator.watchview import EchoView
from orchestrator.vendors import load_profile

from .manifests import watcher_rbac
from .simhelpers import run_supervisor

pytestmark = pytest.mark.timeout(90)

KUEUE = ("workloads.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io")
FULL = ("couldn't assign flavors to pod set main: "
        "insufficient unused quota for cpu in flavor default-flavor, 2 more needed")
LQ = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
      "metadata": {"name": "team-a"}, "spec": {"clusterQueue": "cluster-total"}}


def queued_job(name: str, queue: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            "spec": {"suspend": True, "parallelism": 2, "completions": 2, "completionMode": "Indexed",
                     "template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "registry.example.com/x:1"}]}}}}


def workloads(fake_api, ns: str = "default") -> list[dict]:
    return fake_api.store.list("workloads", ns)[0]


def condition(wl: dict, ctype: str) -> tuple:
    c: dict = next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})
    return c.get("status"), c.get("reason"), c.get("message")


# --- the fake's Kueue, against what Kueue does ------------------------------------------------------

@pytest.mark.fake_api(crds=KUEUE)
def test_fake_kueue_holds_a_job_in_a_full_queue_then_admits_and_unsuspends_it(fake_api):
    custom, batch = k8s.CustomObjectsApi(fake_api.client), k8s.BatchV1Api(fake_api.client)
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues", LQ)
    fake_api.cluster.kueue_full["team-a"] = FULL
    job = batch.create_namespaced_job("default", queued_job("held", "team-a"))
    assert fake_api.cluster.run_until(lambda: workloads(fake_api) and condition(workloads(fake_api)[0],
                                                                               "QuotaReserved")[0] == "False")
    (wl,) = workloads(fake_api)
    # workload_names.go: job-<name>-<5 hex>; labelled with the Job's uid, owned by the Job
    assert wl["metadata"]["name"].startswith("job-held-") and len(wl["metadata"]["name"]) == len("job-held-") + 5
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == job.metadata.uid
    assert wl["metadata"]["ownerReferences"][0]["uid"] == job.metadata.uid
    assert condition(wl, "QuotaReserved") == ("False", "Pending", FULL)
    events = [e for e in fake_api.store.list("events", "default")[0] if e["involvedObject"]["kind"] == "Workload"]
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [("Warning", "Pending", FULL)]
    for _ in range(20):
        fake_api.cluster.tick()
    assert batch.read_namespaced_job("held", "default").spec.suspend is True
    assert not fake_api.store.list("pods", "default")[0]
    assert kueue_wait(workloads(fake_api)) == (False, "Pending", FULL)

    del fake_api.cluster.kueue_full["team-a"]
    assert fake_api.cluster.run_until(lambda: len(fake_api.store.list("pods", "default")[0]) == 2)
    (wl,) = workloads(fake_api)
    assert condition(wl, "QuotaReserved") == ("True", "QuotaReserved", "Quota reserved in ClusterQueue cluster-total")
    assert condition(wl, "Admitted") == ("True", "Admitted", "The workload is admitted")
    assert batch.read_namespaced_job("held", "default").spec.suspend is False
    assert kueue_wait(workloads(fake_api)) is None


@pytest.mark.fake_api(crds=KUEUE)
def test_fake_kueue_a_missing_local_queue_is_inadmissible_and_the_workload_goes_with_its_job(fake_api):
    batch = k8s.BatchV1Api(fake_api.client)
    batch.create_namespaced_job("default", queued_job("lost", "team-b"))
    assert fake_api.cluster.run_until(lambda: workloads(fake_api) and condition(workloads(fake_api)[0],
                                                                               "QuotaReserved")[0] == "False")
    assert condition(workloads(fake_api)[0], "QuotaReserved") == \
        ("False", "Inadmissible", "LocalQueue team-b doesn't exist")
    assert kueue_wait(workloads(fake_api)) == (True, "Inadmissible", "LocalQueue team-b doesn't exist")
    batch.delete_namespaced_job("lost", "default", propagation_policy="Foreground")
    assert fake_api.cluster.run_until(lambda: not workloads(fake_api))      # the garbage collector's


def test_fake_kueue_is_not_served_without_its_crds(fake_api):
    groups = {g.name for g in k8s.ApisApi(fake_api.client).get_api_versions().groups}
    assert "kueue.x-k8s.io" not in groups
    with pytest.raises(k8s.ApiException) as err:
        k8s.CustomObjectsApi(fake_api.client).list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta1", "default", "workloads")
    assert err.value.status == 404


# --- what the watcher makes of it ---------------------------------------------------------------

def namespace(fake_api) -> None:
    if not fake_api.store.exists("namespaces", None, "training"):
        k8s.CoreV1Api(fake_api.client).create_namespace({"metadata": {"name": "training"}})


def supervised(fake_api, tmp_path, monkeypatch, queue: str, api_client=None, pending: str = "30m"):
    monkeypatch.setenv("WMCTL_HOME", str(tmp_path))
    spec = from_dict({
        "name": "kq", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "resources": {"cpu": 1, "memory": "2Gi", "shm": "1Gi"},
        "restart": {"max_attempts": 2, "backoff": "0s", "pending_timeout": pending},
        "kubernetes": {"namespace": "training", "queue": queue},
    })
    namespace(fake_api)
    fake_api.cluster.script(job="kq-a0", run_seconds=0.3)
    fake_api.cluster.start()
    backend = KubernetesBackend(api_client or fake_api.client, watch_timeout=2, namespace="training")
    store = RunStore(spec.name)
    record = RunRecord(run=spec.name, backend="kubernetes", spec_path="kq.yaml", overrides={},
                       spec_hash=spec.spec_hash(), auto_resume=True)
    lines: list[str] = []
    sup = Supervisor(spec, load_profile("cpu"), backend, store, record, EchoView(lines.append),
                     SupervisorOptions(auto_resume=True, poll_interval=0.02))
    return sup, backend, store, lines


def evidence(store) -> str:
    from orchestrator.errors import RunNotFound

    try:
        attempts = store.load().attempts
    except RunNotFound:           # not saved yet
        return ""
    return (attempts[-1].evidence or "") if attempts else ""


@pytest.mark.fake_api(crds=KUEUE)
@pytest.mark.parametrize("who", ["unrestricted", "rbac-watcher"])
def test_a_full_queue_is_said_and_waited_out_past_pending_timeout(fake_api, tmp_path, monkeypatch, who):
    from .fakeapi.rbac import User

    namespace(fake_api)
    k8s.CustomObjectsApi(fake_api.client).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta1", "training", "localqueues", LQ)
    fake_api.cluster.kueue_full["team-a"] = FULL
    client = None if who == "unrestricted" else fake_api.as_user(
        "sa-token", User.service_account("training", "wmctl-watcher"), manifests=watcher_rbac())
    sup, backend, store, lines = supervised(fake_api, tmp_path, monkeypatch, "team-a", client, pending="1s")
    thread, result = run_supervisor(sup)
    try:
        assert fake_api.cluster.run_until(lambda: evidence(store).startswith("queued: "), 20), lines
        assert evidence(store) == f"queued: Kueue Pending: {FULL}"
        assert any("node_queued" in ln and FULL in ln for ln in lines), lines
        time.sleep(2.5)                    # past restart.pending_timeout: a full queue is not a failure
        assert thread.is_alive() and store.load().attempts[-1].outcome is None, lines
        del fake_api.cluster.kueue_full["team-a"]
        thread.join(timeout=30)
        assert not thread.is_alive(), lines
    finally:
        backend.close()
    assert result["outcome"].exit_code == 0, result["outcome"].report
    (a0,) = store.load().attempts
    assert a0.outcome == "succeeded"
    assert not fake_api.refused(403)        # manifests/rbac-watcher.yaml grants the Workload reads


@pytest.mark.parametrize("case", ["missing-local-queue", "no-kueue"])
def test_a_queue_nothing_will_admit_from_ends_unschedulable_with_the_reason(fake_api, tmp_path, monkeypatch, case):
    if case == "missing-local-queue":
        fake_api.api.crds = set(KUEUE)
        expect = "Kueue Inadmissible: LocalQueue team-b doesn't exist"
    else:
        expect = "serves no kueue.x-k8s.io API (Kueue is not installed)"
    sup, backend, store, lines = supervised(fake_api, tmp_path, monkeypatch, "team-b", pending="1s")
    try:
        outcome = sup.run()
    finally:
        backend.close()
    (a0,) = store.load().attempts
    assert outcome.exit_code == 7, outcome.report
    assert (a0.outcome, a0.decision) == ("unschedulable", "stop")
    assert expect in a0.evidence and "restart.pending_timeout" in a0.evidence, a0.evidence
    said = expect.split(": ", 1)[-1]
    assert any("node_waiting" in ln and said in ln for ln in lines), lines


@pytest.mark.fake_api(crds=KUEUE)
def test_a_user_who_may_not_read_workloads_is_told_the_wait_without_kueue_s_reason(fake_api, tmp_path, monkeypatch):
    """The built-in edit role grants nothing on kueue.x-k8s.io (Kueue's own batch-user role
    does): the wait is said, with what would show the reason."""
    namespace(fake_api)
    k8s.CustomObjectsApi(fake_api.client).create_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta1", "training", "localqueues", LQ)
    fake_api.cluster.kueue_full["team-a"] = FULL
    alice = fake_api.as_user("alice-token", role="edit", namespace="training")
    sup, backend, store, lines = supervised(fake_api, tmp_path, monkeypatch, "team-a", alice)
    thread, _ = run_supervisor(sup)
    try:
        assert fake_api.cluster.run_until(lambda: evidence(store).startswith("queued: "), 20), lines
        assert "may not read" in evidence(store) and "workloads.kueue.x-k8s.io" in evidence(store)
        assert "Kueue's batch-user role" in evidence(store)
        store.request_cancel(by="the test", graceful=False)
        thread.join(timeout=30)
        assert not thread.is_alive(), lines
    finally:
        backend.close()
    assert store.load().status == "cancelled"


# --- cancel --graceful through Kueue (issue 23 item 5) ---------------------------------------------

@pytest.mark.fake_api(crds=KUEUE)
def test_fake_kueue_unsuspends_an_admitted_job_and_a_deactivated_workload_stops_it(fake_api):
    """reconciler.go: a suspended Job whose Workload is admitted is started again; a Workload set
    spec.active=false is evicted (Deactivated) and its Job suspended, for good."""
    custom, batch = k8s.CustomObjectsApi(fake_api.client), k8s.BatchV1Api(fake_api.client)
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues", LQ)
    batch.create_namespaced_job("default", queued_job("adm", "team-a"))
    assert fake_api.cluster.run_until(lambda: len(fake_api.store.list("pods", "default")[0]) == 2)
    batch.patch_namespaced_job("adm", "default", {"spec": {"suspend": True}})
    assert fake_api.cluster.run_until(lambda: batch.read_namespaced_job("adm", "default").spec.suspend is False)
    (wl,) = workloads(fake_api)
    custom.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "workloads",
                                          wl["metadata"]["name"], {"spec": {"active": False}})
    assert fake_api.cluster.run_until(lambda: condition(workloads(fake_api)[0], "Evicted")[0] == "True")
    assert condition(workloads(fake_api)[0], "Evicted") == ("True", "Deactivated", "The workload is deactivated")
    assert condition(workloads(fake_api)[0], "Admitted")[0] == "False"
    for _ in range(20):
        fake_api.cluster.tick()
    assert batch.read_namespaced_job("adm", "default").spec.suspend is True


@pytest.mark.fake_api(crds=KUEUE)
def test_graceful_cancel_of_a_kueue_job_deactivates_its_workload_so_no_pod_comes_back(fake_api):
    """`cancel --graceful` of a Job Kueue admitted: its Workload is deactivated (spec.active:
    false), Kueue suspends the Job, each pod gets SIGTERM and writes its checkpoint (exit 83),
    and Kueue never starts the Job again. Before: wmctl suspended the Job itself and Kueue
    unsuspended it at once (the Workload was still admitted): pods could come back while the old
    ones saved."""
    from .manifests import rendered_plan

    custom = k8s.CustomObjectsApi(fake_api.client)
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "default", "localqueues", LQ)
    c = fake_api.cluster
    c.script(job="kq-a0", run_seconds=None, sigterm_seconds=0.4, sigterm_exit_code=83)
    c.start()
    b = KubernetesBackend(fake_api.client, watch_timeout=2)
    try:
        ref = b.submit(rendered_plan("kq", 0, kube={"queue": "team-a"}))

        def pods() -> list[dict]:
            return [p for p in fake_api.store.list("pods", "default")[0]
                    if p["metadata"]["labels"].get("job-name") == "kq-a0"]
        assert c.run_until(lambda: len([p for p in pods() if p["status"].get("phase") == "Running"]) == 2)
        before = {p["metadata"]["uid"] for p in pods()}
        cancelled_at = time.time()
        b.cancel(ref, graceful=True)
        notes = b.teardown_notes(ref)
    finally:
        b.close()
    assert not notes, notes
    # (the Workload itself went with the Job, by the garbage collector: the request is what tells)
    patches = [r["body"] for r in fake_api.api.sent("PATCH", "/workloads/")]
    assert patches == [{"spec": {"active": False}}], patches
    created = {ch.obj["metadata"]["uid"] for ch in fake_api.store._history if ch.resource == "pods"
               and ch.type == "ADDED" and ch.obj["metadata"]["labels"].get("job-name") == "kq-a0"}
    assert created == before, "Kueue started pods again during the graceful stop"
    restarted = [t for t, what, who in c.timeline if what == "kueue_admitted" and who == "kq-a0" and t > cancelled_at]
    assert not restarted, "Kueue unsuspended the Job during the graceful stop"
    ends = [ch.obj for ch in fake_api.store._history if ch.resource == "pods" and ch.type == "MODIFIED"
            and ch.obj["status"].get("phase") == "Failed"]
    codes = {((s.get("state") or {}).get("terminated") or {}).get("exitCode")
             for p in ends for s in p["status"].get("containerStatuses") or []}
    assert 83 in codes, codes          # the SIGTERM checkpoint's exit
