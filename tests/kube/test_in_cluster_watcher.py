"""`wmctl submit -b kubernetes --auto-resume --in-cluster`: the watcher runs in the cluster.

The fake API server serves HTTPS, with RBAC on. A user with the built-in `edit` role submits from
"a laptop" (a kubeconfig). The watcher Deployment the submit creates is not run by a controller
here: the test runs its container's own command as a host process with a pod's in-cluster
environment (a private mount namespace with the service-account token and CA at
/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT, no kubeconfig), under
exactly manifests/rbac-watcher.yaml. It is SIGKILLed mid-attempt (its node died), a second "pod"
takes the stale lease over and adopts the attempt (one Job ever created), a cancel from the laptop
is obeyed, and the watcher deletes its own Deployment so that nothing restarts it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.procs import Lines

from .conftest import TEST_SCALE, FakeKube
from .fakeapi.cluster import Cluster, Timings
from .fakeapi.rbac import User
from .fakeapi.server import FakeApiServer
from .manifests import watcher_rbac
from .simhelpers import backdate_lease
from .test_cli_sim import progress

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]
NS = "training"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture
def tls_api(tmp_path):
    """The fake API server over HTTPS with a throwaway CA-less self-signed certificate for 127.0.0.1."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = FakeApiServer(tls=(str(cert), str(key))).start()
    cluster = Cluster(server.api, Timings(scale=TEST_SCALE))
    for name in ("node-a", "node-b", "node-c"):
        cluster.add_node(name)
    import kubernetes.client

    cfg = kubernetes.client.Configuration()
    cfg.host, cfg.ssl_ca_cert = server.url, str(cert)
    client = kubernetes.client.ApiClient(cfg)
    try:
        yield FakeKube(server, cluster, client), cert
    finally:
        cluster.stop()
        client.close()
        server.stop()


def laptop(fake: FakeKube, cert: Path, home: Path) -> dict[str, str]:
    """A user's machine: a kubeconfig for a user bound to the built-in `edit` role in NS."""
    fake.as_user("alice-token", User("alice"), role="edit", namespace=NS)
    home.mkdir(parents=True, exist_ok=True)
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": fake.server.url, "certificate-authority": str(cert)}}],
        "users": [{"name": "alice", "user": {"token": "alice-token"}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "alice", "namespace": NS}}],
    }))
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "WMCTL_HOME": str(home / "wmctl"), "PYTHONPATH": str(REPO)}


def pod_process(fake: FakeKube, cert: Path, deployment: dict, where: Path) -> subprocess.Popen:
    """Run the Deployment's container command as a pod would: its env, the service account's
    token and CA where client libraries look for them, the API server's service address, and no
    kubeconfig at all."""
    fake.as_user("sa-token", User.service_account(NS, "wmctl-watcher"), manifests=watcher_rbac())
    sa = where / "sa"
    sa.mkdir(parents=True, exist_ok=True)
    (sa / "token").write_text("sa-token")
    (sa / "namespace").write_text(NS)
    shutil.copy(cert, sa / "ca.crt")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][0] == "wmctl"
    argv = [sys.executable, "-m", "orchestrator.cli", *container["command"][1:]]
    host, port = fake.server.server_address[:2]
    env = {"PATH": os.environ["PATH"], "HOME": str(where), "PYTHONPATH": str(REPO), "WMCTL_HOME": str(where / "wmctl"),
           "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
           **{e["name"]: e["value"] for e in container["env"]}}
    # A private mount namespace: a tmpfs over /run (/var/run links to it) holds the pod's
    # service-account files; the host's /run is untouched.
    script = (f'mount -t tmpfs tmpfs /run && mkdir -p {SA_DIR} && cp "$0"/* {SA_DIR}/ && exec "$@"')
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(sa), *argv],
                            env=env, cwd=str(where), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=90)


def test_sim_the_in_cluster_watcher_survives_its_pod_and_retires_with_the_run(tls_api, tmp_path):
    if os.geteuid() != 0:
        pytest.fail("runs a pod's mount namespace (unshare --mount): run as root, as CI does")
    fake, cert = tls_api
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "inc", "nodes": 2, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"], "restart": {"max_attempts": 3, "backoff": "0s"},
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "kubernetes": {"namespace": NS, "watcher_image": "registry.example.com/wmctl:0.9"},
    }))
    fake.cluster.script(job="inc-a0", run_seconds=None,
                        logs=[(0.0, progress("start", 0)), (0.1, progress("checkpoint", 10))])
    fake.cluster.start()
    alice = laptop(fake, cert, tmp_path / "laptop")

    sub = run(alice, "submit", str(spec), "-b", "kubernetes", "--auto-resume", "--in-cluster")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert f"watcher Deployment {NS}/wmctl-watch-inc supervises inc" in sub.stdout, sub.stdout
    dep = fake.store.get("deployments", NS, "wmctl-watch-inc")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "wmctl-watcher" and dep["spec"]["strategy"]["type"] == "Recreate"
    assert pod["containers"][0]["image"] == "registry.example.com/wmctl:0.9"
    assert {t["key"]: t["tolerationSeconds"] for t in pod["tolerations"]} == {
        "node.kubernetes.io/not-ready": 30, "node.kubernetes.io/unreachable": 30}
    assert not list((tmp_path / "laptop" / "wmctl").glob("runs/*")), "run state must be in the cluster"

    def jobs():
        return [j["metadata"]["name"] for j in fake.store.list("jobs", NS)[0]]

    def lease_holder():
        cms = [c for c in fake.store.list("configmaps", NS)[0] if c["metadata"]["name"] == "wmctl-run-inc.lease"]
        return json.loads(cms[0]["data"].get("lease.json") or "{}").get("pid") if cms else None

    first = pod_process(fake, cert, dep, tmp_path / "pod1")
    try:
        if not fake.cluster.run_until(lambda: lease_holder() not in (None, 0) and jobs() == ["inc-a0"], timeout=60):
            os.killpg(first.pid, signal.SIGKILL)
            pytest.fail("the watcher pod never took the lease:\n" + first.communicate(timeout=10)[0][-3000:])
        time.sleep(1.0)                              # it reads the attempt's progress
        os.killpg(first.pid, signal.SIGKILL)          # its node died
        first.communicate(timeout=10)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)

    # The Deployment controller starts a new pod while the dead one's lease is still fresh: it
    # waits (no exit, no CrashLoopBackOff), then takes the lease over once it goes stale.
    second = pod_process(fake, cert, dep, tmp_path / "pod2")
    said = Lines(second)
    try:
        said.wait_for("waiting to take over", 60)      # it met the fresh lease (PYTHONUNBUFFERED: lines as they come)
        assert second.poll() is None, said.text()
        backdate_lease(fake, "inc", 61, namespace=NS)
        said.wait_for("took over the stale lease", 60)
        assert second.poll() is None, said.text()
        env = {**alice, "WMCTL_RUN_STORE": "kubernetes"}
        status = run(env, "status", "inc", "-o", "json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["status"] == "running"
        cancel = run(env, "cancel", "inc")
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        second.wait(timeout=90)
        out = said.text(join=True)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 8, out                                   # the run ended cancelled
    assert "waiting to take over" in out and "took over the stale lease" in out, out
    assert "deleted the watcher Deployment" in out, out
    assert not [d for d in fake.store.list("deployments", NS)[0]]
    assert len([r for r in fake.api.sent("POST", "") if r["path"].endswith("/jobs")]) == 1
    assert not [r for r in fake.refused() if "alice" not in json.dumps(r)], fake.refused()
    final = json.loads(run(env, "status", "inc", "-o", "json").stdout)
    assert final["status"] == "cancelled" and len(final["attempts"]) == 1


def test_in_cluster_needs_a_backend_that_runs_watchers_and_a_watcher_image(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "image": {"vendor": "cpu", "tag": "r.example.com/wm:1"},
                                    "command": ["python", "train.py"]}))
    env = {**os.environ, "WMCTL_HOME": str(tmp_path / "h"), "PYTHONPATH": str(REPO), "KUBECONFIG": "/nonexistent"}
    env.pop("WMCTL_RUN_STORE", None)
    local = run(env, "submit", str(spec), "--in-cluster")
    assert local.returncode == 2 and "--in-cluster: the local backend runs no watcher of its own" in local.stderr
    assert "-b kubernetes" in local.stderr and "Traceback" not in local.stderr
    kube = run(env, "submit", str(spec), "-b", "kubernetes", "--in-cluster")
    assert kube.returncode == 2 and "kubernetes.watcher_image" in kube.stderr, kube.stderr
    assert not (tmp_path / "h" / "runs").exists()


def test_in_cluster_state_goes_where_the_watcher_looks(tls_api, tmp_path):
    """The watcher Deployment reads its run in the job's namespace on the cluster that runs the job:
    the submitting machine must keep the record there, not in its kubeconfig's current context and
    namespace (here: a current context pointing nowhere, and no namespace, i.e. `default`)."""
    fake, cert = tls_api
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "inc", "nodes": 1, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"],
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "kubernetes": {"namespace": NS, "watcher_image": "registry.example.com/wmctl:0.9"},
    }))
    fake.cluster.script(job="inc-a0", run_seconds=None, logs=[(0.0, progress("start", 0))])
    fake.cluster.start()
    alice = laptop(fake, cert, tmp_path / "laptop")
    kubeconfig = Path(alice["KUBECONFIG"])
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"].pop("namespace")
    config["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}})
    config["contexts"].append({"name": "nowhere", "context": {"cluster": "nowhere", "user": "alice"}})
    config["current-context"] = "nowhere"
    kubeconfig.write_text(yaml.safe_dump(config))
    alice.pop("WMCTL_RUN_STORE", None)
    alice.pop("WMCTL_RUN_STORE_NAMESPACE", None)
    alice.pop("WMCTL_RUN_STORE_CONTEXT", None)

    sub = run(alice, "submit", str(spec), "-b", "kubernetes", "--context", "sim", "--auto-resume",
              "--in-cluster")
    assert sub.returncode == 0, sub.stdout + sub.stderr
    dep = fake.store.get("deployments", NS, "wmctl-watch-inc")
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    records = [c for c in fake.store.list("configmaps", env["WMCTL_RUN_STORE_NAMESPACE"])[0]
               if c["metadata"]["name"] == "wmctl-run-inc"]
    assert records, "the watcher would find no run: the record is not in the namespace it reads"
    assert f"WMCTL_RUN_STORE_NAMESPACE={NS}" in sub.stdout, sub.stdout    # how to reach it from here


def test_in_cluster_watcher_deployment_in_the_way_is_a_clear_error(tls_api, tmp_path):
    """A watcher Deployment of that name already there (an earlier run's, whose watcher could not
    delete it): exit 4 naming it and what to do, not an API traceback after the Job was created."""
    fake, cert = tls_api
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "inc", "nodes": 1, "image": {"vendor": "cpu", "tag": "registry.example.com/wm:v3"},
        "command": ["python", "train.py"],
        "volumes": [{"name": "ckpt", "mount": "/ckpt", "pvc": "wm-ckpt"}], "checkpoint": {"dir": "/ckpt"},
        "kubernetes": {"namespace": NS, "watcher_image": "registry.example.com/wmctl:0.9"},
    }))
    fake.cluster.script(job="inc-a0", run_seconds=None, logs=[(0.0, progress("start", 0))])
    fake.cluster.start()
    from orchestrator.backends.kubernetes import incluster

    from .sdk import client

    old = incluster.watcher_manifest("inc", NS, "registry.example.com/wmctl:0.8", "wmctl-watcher")
    client.AppsV1Api(fake.client).create_namespaced_deployment(NS, old)
    alice = laptop(fake, cert, tmp_path / "laptop")
    sub = run(alice, "submit", str(spec), "-b", "kubernetes", "--auto-resume", "--in-cluster")
    assert "Traceback" not in sub.stderr, sub.stderr
    assert sub.returncode == 4, sub.stdout + sub.stderr
    assert "deployment/wmctl-watch-inc" in sub.stderr and "wmctl watch inc --auto-resume" in sub.stderr, sub.stderr


def test_start_watcher_without_a_watcher_image_names_the_field(tmp_path):
    """A caller that skips watcher_problems (the api asks it first) still hears which field is
    missing, before anything is created in the cluster: no API client is ever needed."""
    from orchestrator.backends.kubernetes.engine import KubernetesBackend
    from orchestrator.errors import SpecError
    from orchestrator.specload import load_spec

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "image": {"vendor": "cpu", "tag": "r.example.com/wm:1"},
                                    "command": ["python", "train.py"]}))
    with pytest.raises(SpecError) as err:
        KubernetesBackend(api_client=object()).start_watcher("x", load_spec(path))
    assert "kubernetes.watcher_image" in str(err.value)
