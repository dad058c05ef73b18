"""Contract tests of the fake Kubernetes API server itself, through the real `kubernetes`
client over HTTP. Simulations: there is no real cluster here; these pin the behaviours the
backend relies on (selectors, resourceVersion, watch timeouts, 410 Gone, 409, faults)."""

from __future__ import annotations

import json
import re
import time

import pytest
import urllib3
from kubernetes import watch
from .sdk import client
from kubernetes.client.exceptions import ApiException

from .fakeapi.server import _parse_rfc3339_ns
from .manifests import attempt_manifests

pytestmark = pytest.mark.timeout(60)


def _pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _status(exc: ApiException) -> dict:
    assert exc.body is not None
    return json.loads(exc.body)


def test_sim_label_and_field_selectors(fake_api):
    """Simulation: list with every label selector operator and the common field selectors."""
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_pod("default", _pod("p1", {"app": "a", "tier": "x"}))
    core.create_namespaced_pod("default", _pod("p2", {"app": "b"}))
    core.create_namespaced_pod("default", _pod("p3", {"app": "c", "tier": "y"}, node="node-a"))
    core.create_namespaced_pod("other", _pod("p4", {"app": "a"}))

    def names(**kw):
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert names(label_selector="app=a") == ["p1"]
    assert names(label_selector="app==b") == ["p2"]
    assert names(label_selector="app!=a") == ["p2", "p3"]
    assert names(label_selector="app in (a, c)") == ["p1", "p3"]
    assert names(label_selector="app notin (a,c)") == ["p2"]
    assert names(label_selector="tier") == ["p1", "p3"]
    assert names(label_selector="!tier") == ["p2"]
    assert names(label_selector="app in (a,c),tier=y") == ["p3"]
    assert names(field_selector="metadata.name=p2") == ["p2"]
    assert names(field_selector="spec.nodeName=node-a") == ["p3"]
    assert names(field_selector="status.phase=Pending,metadata.name!=p1") == ["p2", "p3"]
    assert sorted(p.metadata.name for p in core.list_pod_for_all_namespaces(
        label_selector="app=a").items) == ["p1", "p4"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert err.value.status == 400 and "field label not supported" in _status(err.value)["message"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", label_selector="app in (a")
    assert err.value.status == 400


def test_sim_resource_version_increases_on_every_change(fake_api):
    """Simulation: a global, strictly increasing resourceVersion on create, update, delete."""
    core = client.CoreV1Api(fake_api.client)
    rvs = [int(core.create_namespaced_pod("default", _pod(f"p{i}")).metadata.resource_version)
           for i in range(3)]
    patched = core.patch_namespaced_pod("p0", "default", {"metadata": {"labels": {"x": "1"}}})
    rvs.append(int(patched.metadata.resource_version))
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    listed = core.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= rvs[-1]
    assert patched.metadata.uid and patched.metadata.creation_timestamp
    # an unchanged patch does not bump it
    again = core.patch_namespaced_pod("p0", "default", {"metadata": {"labels": {"x": "1"}}})
    assert again.metadata.resource_version == patched.metadata.resource_version
    # generateName gets a random suffix
    gen = core.create_namespaced_pod("default", {"metadata": {"generateName": "w-"},
                                                 "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert gen.metadata.name.startswith("w-") and len(gen.metadata.name) == 7


def test_sim_watch_from_resource_version_and_timeout_closes(fake_api):
    """Simulation: watch from a list's resourceVersion sees exactly the later changes, with
    label filtering, and the stream closes by itself at timeoutSeconds."""
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_pod("default", _pod("before", {"w": "1"}))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", _pod("p", {"w": "1"}))
    core.create_namespaced_pod("default", _pod("ignored", {"w": "2"}))
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}})
    core.delete_namespaced_pod("p", "default")
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_pod, "default", label_selector="w=1", resource_version=rv,
        timeout_seconds=1)]
    assert seen == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    # without a resourceVersion: synthetic ADDED for what exists, then live changes
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_pod, "default", label_selector="w=1", timeout_seconds=1)]
    assert seen == [("ADDED", "before")]


def test_sim_watch_gets_410_on_compacted_resource_version(fake_api):
    """Simulation: after compaction a watch from an old resourceVersion receives an ERROR
    event with a 410 Status (the client raises ApiException 410); a fresh list recovers."""
    core = client.CoreV1Api(fake_api.client)
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", _pod("p"))
    fake_api.store.compact()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                  timeout_seconds=1))
    assert err.value.status == 410
    fresh = core.list_namespaced_pod("default").metadata.resource_version
    assert list(watch.Watch().stream(core.list_namespaced_pod, "default",
                                     resource_version=fresh, timeout_seconds=1)) == []


@pytest.mark.fake_api(history_limit=3)
def test_sim_small_history_window_expires_old_versions(fake_api):
    """Simulation: with a 3-change window, an RV more than 3 changes old is Gone."""
    core = client.CoreV1Api(fake_api.client)
    rv = core.list_namespaced_pod("default").metadata.resource_version
    for i in range(5):
        core.create_namespaced_pod("default", _pod(f"p{i}"))
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                  timeout_seconds=1))
    assert err.value.status == 410


def test_sim_duplicate_create_409_and_missing_404_and_invalid_422(fake_api):
    """Simulation: proper Status objects for AlreadyExists, NotFound and Invalid."""
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_pod("default", _pod("p"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", _pod("p"))
    st = _status(err.value)
    assert err.value.status == 409 and st["kind"] == "Status" and st["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("nope", "default")
    assert err.value.status == 404 and _status(err.value)["reason"] == "NotFound"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {}, "spec": {"containers": [
            {"name": "c", "image": "i"}]}})
    assert err.value.status == 422 and _status(err.value)["reason"] == "Invalid"
    # same name in another namespace is fine
    assert core.create_namespaced_pod("other", _pod("p")).metadata.namespace == "other"


def test_sim_injected_5xx_conflict_and_lost_response(fake_api):
    """Simulation: injected 503s hit the next N matching requests only; a lost response
    still performs the create, so the retry sees 409."""
    core = client.CoreV1Api(fake_api.client)
    fake_api.faults.fail_next(2, code=503, verb="POST", path="/pods")
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod("default", _pod("p"))
        assert err.value.status == 503
    core.create_namespaced_pod("default", _pod("p"))
    fake_api.faults.conflict_next(1, verb="PATCH")
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    assert err.value.status == 409
    fake_api.faults.lose_response_next(1, verb="POST")
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.create_namespaced_pod("default", _pod("q"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", _pod("q"))
    assert err.value.status == 409


def test_sim_watch_drop_cuts_the_stream(fake_api):
    """Simulation: drop_watches() cuts open watch streams mid-way (no clean end)."""
    core = client.CoreV1Api(fake_api.client)
    core.create_namespaced_pod("default", _pod("p"))
    w = watch.Watch()
    got = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for ev in w.stream(core.list_namespaced_pod, "default", timeout_seconds=20):
            got.append(ev["type"])
            fake_api.faults.drop_watches()
    assert got == ["ADDED"]


def test_sim_indexed_job_pods_and_completion(fake_api):
    """Simulation: the Job controller makes indexed pods with the real labels, annotation,
    hostname and subdomain; the kubelet runs them; the Job becomes Complete."""
    batch = client.BatchV1Api(fake_api.client)
    core = client.CoreV1Api(fake_api.client)
    svc, job = attempt_manifests("r", 0, nodes=3)
    core.create_namespaced_service("default", svc)
    batch.create_namespaced_job("default", job)
    c = fake_api.cluster
    assert c.run_until(lambda: len(fake_api.store.list("pods")[0]) == 3)
    pods = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
            for p in fake_api.store.list("pods")[0]}
    assert sorted(pods) == ["0", "1", "2"]
    p1 = pods["1"]
    assert p1["metadata"]["name"].startswith("r-a0-1-")
    assert p1["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert p1["metadata"]["labels"]["job-name"] == "r-a0"
    assert p1["metadata"]["labels"]["controller-uid"] == job_uid(batch)
    assert p1["spec"]["hostname"] == "r-a0-1" and p1["spec"]["subdomain"] == "r-a0"
    env = {e["name"] for e in p1["spec"]["containers"][0]["env"]}
    assert {"JOB_COMPLETION_INDEX", "WMCTL_RUN"} <= env
    assert c.run_until(lambda: any(
        cd.type == "Complete" and cd.status == "True"
        for cd in batch.read_namespaced_job("r-a0", "default").status.conditions or []))
    st = batch.read_namespaced_job("r-a0", "default").status
    assert st.succeeded == 3 and st.completed_indexes == "0-2"
    # spread over the three nodes by the scheduler
    assert len({p["spec"]["nodeName"] for p in fake_api.store.list("pods")[0]}) == 3


def job_uid(batch) -> str:
    return batch.read_namespaced_job("r-a0", "default").metadata.uid


def test_sim_backoff_limit_zero_fails_job_on_first_pod_failure(fake_api):
    """Simulation: backoffLimit 0 -> one failed pod marks the Job Failed; the others are
    terminated by the controller."""
    batch = client.BatchV1Api(fake_api.client)
    _, job = attempt_manifests("r", 0, nodes=2)
    fake_api.cluster.script(job="r-a0", index=1, run_seconds=0.05, exit_code=1)
    fake_api.cluster.script(job="r-a0", index=0, run_seconds=None)
    batch.create_namespaced_job("default", job)
    assert fake_api.cluster.run_until(lambda: any(
        cd.type == "Failed" and cd.status == "True"
        for cd in batch.read_namespaced_job("r-a0", "default").status.conditions or []))
    assert fake_api.cluster.run_until(lambda: [
        p["status"]["phase"] for p in fake_api.store.list("pods")[0]] == ["Failed"])


def test_sim_job_deletion_propagation(fake_api):
    """Simulation: Job deletion orphans pods by default (batch/v1's legacy default);
    Foreground deletes the pods first, then the Job."""
    batch = client.BatchV1Api(fake_api.client)
    fake_api.cluster.default_script.run_seconds = None
    for attempt in (0, 1):
        batch.create_namespaced_job("default", attempt_manifests("r", attempt, nodes=2)[1])
    c = fake_api.cluster
    assert c.run_until(lambda: len(fake_api.store.list("pods")[0]) == 4)
    batch.delete_namespaced_job("r-a0", "default")
    for _ in range(5):
        c.tick()
    assert len([p for p in fake_api.store.list("pods")[0]
                if p["metadata"]["name"].startswith("r-a0-")]) == 2
    resp = batch.delete_namespaced_job("r-a1", "default", propagation_policy="Foreground",
                                       _preload_content=False)
    assert resp.status == 202
    assert json.loads(resp.data)["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert c.run_until(lambda: not fake_api.store.exists("jobs", "default", "r-a1"))
    assert not [p for p in fake_api.store.list("pods")[0] if p["metadata"]["name"].startswith("r-a1-")]


def test_sim_node_loss_timeline_and_stuck_terminating(fake_api):
    """Simulation: kill a node -> after the (scaled) grace period Ready=Unknown and the
    unreachable NoExecute taint -> after tolerationSeconds the taint manager sets
    DisruptionTarget/DeletionByTaintManager and deletes the pod -> it stays Terminating with
    a stale Running phase -> a force delete (grace 0) removes it."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.default_script.run_seconds = None
    core.create_namespaced_pod("default", _pod("p", node="node-a"))
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
    c.kill_node("node-a")
    assert c.run_until(lambda: any(
        t.key == "node.kubernetes.io/unreachable" and t.effect == "NoExecute"
        for t in core.read_node("node-a").spec.taints or []))
    ready = next(x for x in core.read_node("node-a").status.conditions if x.type == "Ready")
    assert ready.status == "Unknown" and ready.reason == "NodeStatusUnknown"
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").metadata.deletion_timestamp)
    pod = core.read_namespaced_pod("p", "default")
    dt = next(x for x in pod.status.conditions if x.type == "DisruptionTarget")
    assert dt.reason == "DeletionByTaintManager" and pod.status.phase == "Running"
    for _ in range(20):
        c.tick()
    assert fake_api.store.exists("pods", "default", "p")     # stuck: no kubelet to confirm
    core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert not fake_api.store.exists("pods", "default", "p")


def test_sim_out_of_service_taint_releases_stuck_pods(fake_api):
    """Simulation: tainting a dead node out-of-service lets pod GC force-delete its pods."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.default_script.run_seconds = None
    core.create_namespaced_pod("default", _pod("p", node="node-b"))
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
    c.kill_node("node-b")
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").metadata.deletion_timestamp)
    c.taint_out_of_service("node-b")
    assert c.run_until(lambda: not fake_api.store.exists("pods", "default", "p"))


def test_sim_pod_logs_follow_and_container_choice(fake_api):
    """Simulation: pods/log returns scripted lines; follow streams until the container ends."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.script(when=lambda p: p["metadata"]["name"] == "p", run_seconds=0.3,
             logs=[(0.0, "one"), (0.1, "two"), (0.2, "three")])
    core.create_namespaced_pod("default", _pod("p", node="node-a"))
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", "default")
    assert err.value.status == 400 and "waiting to start" in _status(err.value)["message"]
    c.start()
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
    lines = list(watch.Watch().stream(core.read_namespaced_pod_log, "p", "default"))
    assert lines == ["one", "two", "three"]
    assert core.read_namespaced_pod_log("p", "default", tail_lines=1) == "three\n"


def test_sim_scheduler_respects_node_affinity_and_resources(fake_api):
    """Simulation: required node affinity NotIn and resource requests steer binding."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    pod = _pod("p")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                     "operator": "NotIn",
                                                     "values": ["node-a", "node-b"]}]}]}}}
    core.create_namespaced_pod("default", pod)
    big = _pod("big")
    big["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    core.create_namespaced_pod("default", big)
    c.tick()
    assert core.read_namespaced_pod("p", "default").spec.node_name == "node-c"
    big_pod = core.read_namespaced_pod("big", "default")
    assert big_pod.spec.node_name is None
    assert next(x for x in big_pod.status.conditions if x.type == "PodScheduled").reason == "Unschedulable"


def test_sim_rbac_edit_role_is_refused_nodes_like_kube_apiserver(fake_api):
    """Simulation of RBAC (fakeapi/rbac.py): a user with the built-in `edit` role bound in one
    namespace works there, is refused Nodes (cluster-scoped: edit/admin grant none) and other
    namespaces with kube-apiserver's 403 Status; no token is system:anonymous (403), an unknown
    token is 401."""
    alice = fake_api.as_user("alice-token", role="edit", namespace="team")
    core, batch = client.CoreV1Api(alice), client.BatchV1Api(alice)
    svc, job = attempt_manifests("r", 0, namespace="team")
    batch.create_namespaced_job("team", job)
    assert [p.metadata.name for p in core.list_namespaced_pod("team").items] == []
    batch.patch_namespaced_job("r-a0", "team", {"metadata": {"annotations": {"x": "y"}}})
    with pytest.raises(ApiException) as err:
        core.list_node()
    body = _status(err.value)
    assert (err.value.status, body["reason"], body["details"]["kind"]) == (403, "Forbidden", "nodes")
    assert body["message"] == ('nodes is forbidden: User "alice-token" cannot list resource "nodes" '
                               'in API group "" at the cluster scope')
    with pytest.raises(ApiException) as err:
        batch.delete_namespaced_job("r-a0", "other")
    assert _status(err.value)["message"] == (
        'jobs.batch "r-a0" is forbidden: User "alice-token" cannot delete resource "jobs" in API group '
        '"batch" in the namespace "other"')
    view = fake_api.as_user("viewer-token", role="view", namespace="team")
    with pytest.raises(ApiException) as err:
        client.BatchV1Api(view).delete_namespaced_job("r-a0", "team")
    assert err.value.status == 403
    assert client.CoreV1Api(view).list_namespaced_pod("team").items == []
    from .conftest import make_client
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(make_client(fake_api.server.url)).list_namespaced_pod("team")
    assert err.value.status == 403 and 'User "system:anonymous"' in _status(err.value)["message"]
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(make_client(fake_api.server.url, "stolen")).list_namespaced_pod("team")
    assert err.value.status == 401


def test_sim_rbac_runs_before_routing_so_an_absent_crd_is_403_not_404(fake_api):
    """Simulation: without Volcano installed, a user not allowed podgroups gets 403 (the
    authorisation filter runs before the mux: requestinfo.go resolves the resource from the path
    alone); a user allowed everything gets the mux's 404; with the CRD installed, 200."""
    custom = lambda c: client.CustomObjectsApi(c)  # noqa: E731
    alice = fake_api.as_user("alice-token", role="admin", namespace="team")
    root = fake_api.as_user("root-token", role="cluster-admin")
    for who, code in ((alice, 403), (root, 404)):
        with pytest.raises(ApiException) as err:
            custom(who).delete_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", "team",
                                                        "podgroups", "r-a0")
        assert err.value.status == code
    fake_api.api.crds.add("podgroups.scheduling.volcano.sh")
    assert custom(root).list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", "team",
                                                      "podgroups")["items"] == []


@pytest.mark.parametrize("how", ["machine dies", "kubelet reports NotReady"])
def test_sim_node_lifecycle_marks_pods_not_ready(fake_api, how):
    """Simulation of MarkPodsNotReady: once a node is Ready=Unknown (its kubelet went silent past
    the grace period) or Ready=False (reported by a live kubelet), the node lifecycle controller's
    next pass flips its pods' Ready condition to False, with no reason; ContainersReady stays
    True (only the kubelet changes that)."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.default_script.run_seconds = None
    core.create_namespaced_pod("default", _pod("p", node="node-a"))
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
    if how == "machine dies":
        c.kill_node("node-a")
    else:
        c.set_node_ready("node-a", False)

    def conds():
        return {x.type: x for x in core.read_namespaced_pod("p", "default").status.conditions}
    assert c.run_until(lambda: conds()["Ready"].status == "False")
    assert conds()["Ready"].reason is None and conds()["ContainersReady"].status == "True"


def test_sim_ttl_after_finished_deletes_the_job_its_pods_and_owned_objects(fake_api):
    """Simulation of the TTL-after-finished controller: a Complete Job with
    ttlSecondsAfterFinished is deleted (Foreground: pods first) once the (scaled) TTL has
    passed; the garbage collector then deletes the Service it owns; the Job controller's
    "Completed" Event stays."""
    core, batch = client.CoreV1Api(fake_api.client), client.BatchV1Api(fake_api.client)
    svc, job = attempt_manifests("t", 0, nodes=1)
    job["spec"]["ttlSecondsAfterFinished"] = 100          # 0.5 s at the test scale
    created = batch.create_namespaced_job("default", job)
    svc["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "t-a0",
                                           "uid": created.metadata.uid}]
    core.create_namespaced_service("default", svc)
    c = fake_api.cluster
    assert c.run_until(lambda: any(w == "job_complete" for _, w, _ in c.timeline))
    assert fake_api.store.exists("jobs", "default", "t-a0")      # not before the TTL
    assert c.run_until(lambda: not fake_api.store.list("jobs")[0] and not fake_api.store.list("pods")[0]
                       and not fake_api.store.list("services")[0])
    events = core.list_namespaced_event("default", field_selector="involvedObject.kind=Job,involvedObject.name=t-a0")
    assert [(e.type, e.reason, e.message) for e in events.items] == [("Normal", "Completed", "Job completed")]


def _running_pod_p(fake_api) -> client.CoreV1Api:
    """Pod "p" (container "c") on node-a, running until deleted: a log to write to and read."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.script(when=lambda p: p["metadata"]["name"] == "p", run_seconds=None)
    core.create_namespaced_pod("default", _pod("p", node="node-a"))
    c.start()
    assert c.run_until(lambda: core.read_namespaced_pod("p", "default").status.phase == "Running")
    return core


def test_sim_pod_log_rotation_timestamps_and_since(fake_api):
    """Simulation of kubelet log files: after a rotation a new request reads only the newest
    file; a stream that was following goes on with the new file from its start; `timestamps`
    prefixes RFC3339Nano and a space; `sinceSeconds` drops older lines and must be >= 1."""
    core = _running_pod_p(fake_api)
    api = fake_api.api
    for line in ("one", "two"):
        api.append_log("default", "p", "c", line)
    resp = core.read_namespaced_pod_log("p", "default", follow=True, _preload_content=False)
    got = []
    for line in watch.watch.iter_resp_lines(resp):
        got.append(line)
        if line == "two":
            api.rotate_log("default", "p", "c")
            api.append_log("default", "p", "c", "three")
        if line == "three":
            break
    resp.release_conn()
    assert got == ["one", "two", "three"]
    assert core.read_namespaced_pod_log("p", "default") == "three\n"      # only the newest file
    stamped = core.read_namespaced_pod_log("p", "default", timestamps=True)
    stamp, _, text = stamped.rstrip("\n").partition(" ")
    assert text == "three" and stamp.endswith("Z") and "T" in stamp
    assert core.read_namespaced_pod_log("p", "default", since_seconds=5) == "three\n"
    fake_api.api.logs[("default", "p", "c")][-1][0] = (time.time_ns() - 60 * 10**9, "three")
    assert core.read_namespaced_pod_log("p", "default", since_seconds=5) == ""
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("p", "default", since_seconds=0)
    assert err.value.status == 422


def test_sim_pod_log_keeps_write_order_with_each_streams_own_stamps(fake_api):
    """Simulation of the runtime's log writer (containerd internal/cri/io/logger.go): a line is
    stamped when its stream's copier reads it and written after, so the file, and pods/log, keep
    write order while a later line may carry an earlier stamp; `sinceSeconds` filters each line by
    its own stamp (pkg/kubelet/kuberuntime/logs/logs.go), not by its place in the file."""
    core = _running_pod_p(fake_api)
    api = fake_api.api
    api.append_log("default", "p", "c", "stderr note")
    api.append_log("default", "p", "c", "stdout line", stamp_lag_s=0.5)     # stamped before the note
    api.append_log("default", "p", "c", "long-waiting line", stamp_lag_s=30)
    stamped = core.read_namespaced_pod_log("p", "default", timestamps=True).splitlines()
    assert [line.partition(" ")[2] for line in stamped] == ["stderr note", "stdout line", "long-waiting line"]
    stamps = [_parse_rfc3339_ns(line.partition(" ")[0]) for line in stamped]
    assert stamps[1] < stamps[0] and stamps[2] < stamps[1]
    assert core.read_namespaced_pod_log("p", "default", since_seconds=10) == "stderr note\nstdout line\n"


def test_sim_job_failure_target_comes_first_and_failed_waits_for_terminating_pods(fake_api):
    """Simulation of the 1.31+ Job controller: a pod fails past backoffLimit 0 -> FailureTarget
    at once, the other pod is deleted; while that pod stays terminating (its node died, no
    kubelet confirms) there is no Failed condition; once it is gone, Failed with the same reason
    and the controller's Warning Event."""
    batch = client.BatchV1Api(fake_api.client)
    c = fake_api.cluster
    s0 = c.script(job="f-a0", index=0, run_seconds=None)
    s1 = c.script(job="f-a0", index=1, run_seconds=None)
    _, job = attempt_manifests("f", 0, nodes=2)
    batch.create_namespaced_job("default", job)
    c.start()

    def pods():
        return {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p
                for p in fake_api.store.list("pods")[0]}

    def conds():
        return {x.type: x for x in batch.read_namespaced_job("f-a0", "default").status.conditions or []}
    assert c.run_until(lambda: [p["status"]["phase"] for p in pods().values()] == ["Running"] * 2)
    assert s0.run_seconds is None
    c.kill_node(pods()["0"]["spec"]["nodeName"])
    s1.run_seconds, s1.exit_code = 0.0, 1
    assert c.run_until(lambda: "FailureTarget" in conds() and pods()["0"]["metadata"].get("deletionTimestamp"))
    for _ in range(10):
        c.tick()
    assert "Failed" not in conds() and conds()["FailureTarget"].reason == "BackoffLimitExceeded"
    client.CoreV1Api(fake_api.client).delete_namespaced_pod(pods()["0"]["metadata"]["name"], "default",
                                                            grace_period_seconds=0)
    assert c.run_until(lambda: "Failed" in conds())
    assert conds()["Failed"].reason == "BackoffLimitExceeded"
    events = client.CoreV1Api(fake_api.client).list_namespaced_event("default").items
    assert [(e.type, e.reason) for e in events] == [("Warning", "BackoffLimitExceeded")]


def test_sim_a_graceful_delete_gives_the_container_its_sigterm_and_grace(fake_api):
    """Simulation: deleting a running pod with a grace period (kuberuntime_container.go
    killContainer) keeps it Running and terminating while its container handles SIGTERM, lets
    what it prints reach its log, and records its own exit code; a container that ignores
    SIGTERM is killed (137) when the (scaled) grace period ends."""
    core = client.CoreV1Api(fake_api.client)
    c = fake_api.cluster
    c.script(when=lambda p: p["metadata"]["name"] == "saver", run_seconds=None, sigterm_seconds=0.3,
             sigterm_exit_code=83, sigterm_logs=[(0.1, "saving checkpoint"), (0.2, "saved")])
    c.script(when=lambda p: p["metadata"]["name"] == "deaf", run_seconds=None, sigterm_seconds=None)
    for name in ("saver", "deaf"):
        core.create_namespaced_pod("default", _pod(name, node="node-a"))
    assert c.run_until(lambda: all(core.read_namespaced_pod(n, "default").status.phase == "Running"
                                   for n in ("saver", "deaf")))
    core.delete_namespaced_pod("saver", "default", grace_period_seconds=200)   # 2 s at the sim scale
    core.delete_namespaced_pod("deaf", "default", grace_period_seconds=200)
    c.tick()
    saver = core.read_namespaced_pod("saver", "default")
    assert saver.metadata.deletion_timestamp and saver.status.phase == "Running"   # handling SIGTERM
    assert c.run_until(lambda: "saved" in fake_api.api.log_lines("default", "saver", "c"), timeout=60), (
        c.timeline, fake_api.api.logs)
    assert fake_api.api.log_lines("default", "saver", "c") == ["saving checkpoint", "saved"]
    assert c.run_until(lambda: not fake_api.store.exists("pods", "default", "saver"), timeout=60)
    assert c.run_until(lambda: not fake_api.store.exists("pods", "default", "deaf"), timeout=60)
    exits = dict(detail.split() for _, what, detail in c.timeline if what == "pod_stopped")
    assert exits == {"saver": "83", "deaf": "137"}, c.timeline


def _job_events(core, ns: str, job: str) -> list:
    return core.list_namespaced_event(ns, field_selector=f"involvedObject.kind=Job,involvedObject.name={job}").items


def test_sim_a_quota_refused_pod_is_a_failedcreate_event_on_the_job(fake_api):
    """Simulation (resourcequota/controller.go, controller_utils.go, events_cache.go): a pods
    quota of 1 admits one pod of a 2-node Job; the other is refused with 403, seen only as a
    Warning FailedCreate Event on the Job, one Event whose count grows as the controller retries."""
    batch, core = client.BatchV1Api(fake_api.client), client.CoreV1Api(fake_api.client)
    core.create_namespaced_resource_quota("default", {"metadata": {"name": "compute"}, "spec": {"hard": {"pods": "1"}}})
    _, job = attempt_manifests("r", 0, nodes=2)
    fake_api.cluster.script(job="r-a0", run_seconds=None)
    batch.create_namespaced_job("default", job)
    c = fake_api.cluster
    # each refusal names a new generated pod name: ten Events, then one combined Event that counts
    assert c.run_until(lambda: any(e.count and e.count >= 2 for e in _job_events(core, "default", "r-a0")))
    assert len(fake_api.store.list("pods")[0]) == 1
    events = _job_events(core, "default", "r-a0")
    assert len(events) == 11 and {(e.type, e.reason) for e in events} == {("Warning", "FailedCreate")}
    for e in events:
        assert re.fullmatch(r'(\(combined from similar events\): )?Error creating: pods "r-a0-1-\w{5}" is forbidden: '
                            r"exceeded quota: compute, requested: pods=1, used: pods=1, limited: pods=1", e.message)
    with pytest.raises(ApiException) as err:          # the same refusal, asked directly
        core.create_namespaced_pod("default", _pod("extra"))
    assert err.value.status == 403 and "exceeded quota: compute" in _status(err.value)["message"]


def test_sim_pod_security_baseline_refuses_host_path_volumes(fake_api):
    """Simulation (pod-security-admission check_hostPathVolumes.go): a namespace enforcing
    baseline refuses a pod with hostPath volumes; the Job shows it as FailedCreate."""
    batch, core = client.BatchV1Api(fake_api.client), client.CoreV1Api(fake_api.client)
    core.create_namespace({"metadata": {"name": "locked", "labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})
    _, job = attempt_manifests("r", 0, nodes=1, namespace="locked")
    job["metadata"]["namespace"] = "locked"
    job["spec"]["template"]["spec"]["volumes"].append({"name": "drivers", "hostPath": {"path": "/usr/local/dcmi"}})
    batch.create_namespaced_job("locked", job)
    assert fake_api.cluster.run_until(lambda: bool(_job_events(core, "locked", "r-a0")))
    (ev,) = _job_events(core, "locked", "r-a0")
    assert ev.reason == "FailedCreate" and \
        'violates PodSecurity "baseline:latest": hostPath volumes (volume "drivers")' in ev.message
    assert not fake_api.store.list("pods", "locked")[0]
    core.create_namespaced_pod("default", {**_pod("ok"), "spec": {**_pod("ok")["spec"], "volumes": [
        {"name": "drivers", "hostPath": {"path": "/x"}}]}})      # a privileged namespace admits it


def test_sim_an_unschedulable_pod_carries_the_schedulers_reasons(fake_api):
    """Simulation (schedule_one.go handleSchedulingFailure, FitError.Error): PodScheduled=False,
    reason Unschedulable, with every node's reason counted."""
    core = client.CoreV1Api(fake_api.client)
    pod = _pod("p")
    pod["spec"]["nodeSelector"] = {"gpu": "h200"}
    core.create_namespaced_pod("default", pod)
    fake_api.cluster.tick()
    cond = next(x for x in core.read_namespaced_pod("p", "default").status.conditions if x.type == "PodScheduled")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert cond.message == "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


def test_sim_a_kubelet_admission_rejection_fails_the_pod_before_it_starts(fake_api):
    """Simulation (pkg/kubelet/kubelet.go rejectPod, pkg/kubelet/lifecycle/predicate.go): the
    kubelet refuses a pod bound to its node: phase Failed, the admit handler's reason, "Pod was
    rejected: ..." and no container status."""
    core = client.CoreV1Api(fake_api.client)
    fake_api.cluster.admission_rejections["node-a"] = (
        "UnexpectedAdmissionError", "Allocate failed due to no healthy devices present, which is unexpected")
    core.create_namespaced_pod("default", _pod("p", node="node-a"))
    fake_api.cluster.tick()
    st = core.read_namespaced_pod("p", "default").status
    assert (st.phase, st.reason) == ("Failed", "UnexpectedAdmissionError")
    assert st.message == "Pod was rejected: Allocate failed due to no healthy devices present, which is unexpected"
    assert not st.container_statuses


def test_sim_an_unhealthy_device_lowers_allocatable_not_capacity(fake_api):
    """Simulation (devicemanager/manager.go, nodestatus/setters.go): the device plugin marks a
    GPU unhealthy; the Node's allocatable count drops, its capacity stays."""
    core = client.CoreV1Api(fake_api.client)
    fake_api.cluster.set_devices("node-a", "nvidia.com/gpu", 8)
    fake_api.cluster.set_devices("node-a", "nvidia.com/gpu", 7)
    st = core.read_node("node-a").status
    assert (st.capacity["nvidia.com/gpu"], st.allocatable["nvidia.com/gpu"]) == ("8", "7")


def test_sim_a_node_problem_detector_condition_shows_on_the_node(fake_api):
    """Simulation (node-problem-detector condition manager): its condition is on the Node beside
    the kubelet's Ready, True while the problem lasts."""
    core = client.CoreV1Api(fake_api.client)
    fake_api.cluster.set_node_condition("node-a", "KernelDeadlock", "True", "DockerHung",
                                        "task docker:7 blocked for more than 120 seconds.")
    conds = {c.type: c for c in core.read_node("node-a").status.conditions}
    assert conds["KernelDeadlock"].status == "True" and conds["KernelDeadlock"].reason == "DockerHung"
    assert conds["Ready"].status == "True"


@pytest.mark.parametrize("field, value, says", [
    ("priorityClassName", "high", 'is forbidden: no PriorityClass with name high was found'),
    ("serviceAccountName", "trainer",
     'is forbidden: error looking up service account default/trainer: serviceaccount "trainer" not found'),
])
def test_sim_a_missing_priority_class_or_service_account_is_refused_at_admission(fake_api, field, value, says):
    """Simulation (plugin/pkg/admission/priority, plugin/pkg/admission/serviceaccount): 403."""
    core = client.CoreV1Api(fake_api.client)
    pod = _pod("p")
    pod["spec"][field] = value
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", pod)
    assert err.value.status == 403 and _status(err.value)["message"] == f'pods "p" {says}'
    pod["spec"][field] = {"priorityClassName": "system-node-critical", "serviceAccountName": "default"}[field]
    core.create_namespaced_pod("default", pod)      # the built-in ones always exist
def test_sim_node_field_selector_lists_and_watches_one_node(fake_api):
    """Simulation: Nodes select by metadata.name (NodeToSelectableFields), list and watch; a watch
    of one node sees that node's changes and nothing of the others; other field labels are 400."""
    core = client.CoreV1Api(fake_api.client)
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name=node-b").items] == ["node-b"]
    rv = core.list_node(field_selector="metadata.name=node-b").metadata.resource_version
    fake_api.cluster.set_node_ready("node-a", False)
    fake_api.cluster.set_node_ready("node-b", False)
    seen = [(ev["type"], ev["raw_object"]["metadata"]["name"]) for ev in watch.Watch().stream(
        core.list_node, field_selector="metadata.name=node-b", resource_version=rv, timeout_seconds=1)]
    assert seen == [("MODIFIED", "node-b")]
    with pytest.raises(ApiException) as err:
        core.list_node(field_selector="status.phase=Running")
    assert err.value.status == 400


@pytest.mark.fake_api(nodes=[f"n{i:02d}" for i in range(7)])
def test_sim_list_pages_with_limit_and_continue(fake_api):
    """Simulation: limit/continue (ListOptions): pages of at most `limit` in key order, a continue
    token on every page but the last, all pages under the first page's resourceVersion, and the
    same items as one unpaginated list."""
    core = client.CoreV1Api(fake_api.client)
    pages, token = [], None
    while True:
        page = core.list_node(limit=3, _continue=token) if token else core.list_node(limit=3)
        pages.append(page)
        token = page.metadata._continue
        if not token:
            break
    assert [len(p.items) for p in pages] == [3, 3, 1]
    assert len({p.metadata.resource_version for p in pages}) == 1
    assert [n.metadata.name for p in pages for n in p.items] == \
        [n.metadata.name for n in core.list_node().items] == [f"n{i:02d}" for i in range(7)]
    # a selector pages the matching items only
    assert [n.metadata.name for n in core.list_node(limit=3, field_selector="metadata.name=n05").items] == ["n05"]


@pytest.mark.fake_api(nodes=[f"n{i:02d}" for i in range(5)])
def test_sim_stale_continue_token_is_410_expired(fake_api):
    """Simulation: a continue token whose revision was compacted is 410 Expired (etcd3 errors.go
    continueExpired); a garbled token is 400; a token with a resourceVersion other than 0 is 400."""
    core = client.CoreV1Api(fake_api.client)
    token = core.list_node(limit=2).metadata._continue
    assert token
    with pytest.raises(ApiException) as err:
        core.list_node(limit=2, _continue=token, resource_version="5")
    assert err.value.status == 400
    fake_api.cluster.set_node_ready("n00", False)
    fake_api.store.compact()
    with pytest.raises(ApiException) as err:
        core.list_node(limit=2, _continue=token)
    body = _status(err.value)
    assert (err.value.status, body["reason"]) == (410, "Expired")
    assert "continue parameter is too old" in body["message"]
    with pytest.raises(ApiException) as err:
        core.list_node(limit=2, _continue="not-a-token")
    assert err.value.status == 400


def test_sim_a_job_is_stored_with_its_selector_and_template_labels_from_the_first(fake_api):
    """pkg/registry/batch/job/strategy.go PrepareForCreate -> generateSelector: the Job is stored
    with its controller-uid selector and the template's job-name labels set; nobody (a watch, the
    Job controller) ever sees it without them. The fake once added them by an update after the
    create: its Job controller could make pods without `job-name` in between, which then ran no
    script of the test's (the edit-role supervisor sim's flake: attempt 1 "succeeded" without one
    line of its log)."""
    batch = client.BatchV1Api(fake_api.client)
    rv = batch.list_namespaced_job("default").metadata.resource_version
    _, job = attempt_manifests("sel", 0, nodes=2)
    batch.create_namespaced_job("default", job)
    seen = [e["raw_object"] for e in watch.Watch().stream(batch.list_namespaced_job, "default",
                                                           resource_version=rv, timeout_seconds=1)]
    first = seen[0]
    uid = first["metadata"]["uid"]
    assert first["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert first["spec"]["template"]["metadata"]["labels"]["job-name"] == first["metadata"]["name"]
    assert first["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
