"""A watcher that lives in the cluster: `wmctl submit -b kubernetes --auto-resume --in-cluster`.

A training run lasts days; a laptop does not. With ``--in-cluster`` the run's state is kept in the
cluster (runstore.py) and its supervisor is a one-replica Deployment of ``kubernetes.watcher_image``
(an image with wmctl installed) under ``kubernetes.watcher_service_account`` (the least-privilege
ServiceAccount of manifests/rbac-watcher.yaml), running `wmctl watch RUN --auto-resume`. If its
node dies, the Deployment controller starts another pod, which takes the stale lease over and
adopts the running attempt (no second submit). When the run has ended, the watcher deletes its own
Deployment, so it does not restart into a finished run.

Recreate, not RollingUpdate: two watcher pods must never overlap (the lease would refuse the second
anyway, but it would crash-loop until the first is gone).
"""

from __future__ import annotations

import os
from typing import Any

from ... import labels as L
from ...adaptors.kubernetes import api_exception, api_status, sdk
from ...errors import RunExists
from ...resources import rbac_manifest
from ...runtime.protocol import ENV_RUN_STORE, ENV_WATCHER_OBJECT
from .client import call_json
from .runstore import ENV_NAMESPACE

STORE_NAME = "kubernetes"                              # WMCTL_RUN_STORE value of this package's store


WATCHER_TOLERATION_S = 30
# The watcher runs under the `restricted` Pod Security Standard, so any namespace may hold it: not
# root (an image built `pip install wmctl` runs as root by default, so a uid is given, with a
# writable HOME of its own), no privilege escalation, no capabilities, the runtime's default
# seccomp profile. It reads the API with its service account's token (mode 0644) and writes
# nothing else.
WATCHER_UID = 65532
WATCHER_HOME = "/home/wmctl"


def deployment_name(run: str) -> str:
    return f"wmctl-watch-{run}"


def watcher_manifest(run: str, namespace: str, image: str, service_account: str,
                     pull_secrets: list[str] | None = None) -> dict[str, Any]:
    name = deployment_name(run)
    labels = {L.MANAGED_BY: L.MANAGED_BY_VALUE, L.RUN: run, "wmctl.io/role": "watcher"}
    env = [{"name": ENV_RUN_STORE, "value": STORE_NAME},
           {"name": ENV_NAMESPACE, "value": namespace},
           {"name": ENV_WATCHER_OBJECT, "value": name},
           {"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": "HOME", "value": WATCHER_HOME}]
    pod: dict[str, Any] = {
        "serviceAccountName": service_account,
        "restartPolicy": "Always",
        "securityContext": {"runAsNonRoot": True, "runAsUser": WATCHER_UID, "runAsGroup": WATCHER_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "watcher", "image": image,
            # the record's own auto_resume (chosen at submit) decides, as for any `wmctl watch`
            "command": ["wmctl", "watch", run],
            "env": env,
            # Small and Guaranteed: the watcher is the last pod to evict on a busy node.
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                          "limits": {"cpu": "100m", "memory": "256Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "home", "mountPath": WATCHER_HOME}],
        }],
        "volumes": [{"name": "home", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    # Leave a dead node fast: the DefaultTolerationSeconds admission plugin would give the pod 300 s
    # on a not-ready or unreachable node before the taint manager evicts it and the Deployment
    # starts a replacement (plugin/pkg/admission/defaulttolerationseconds/admission.go adds them
    # only where the pod has none for those taints).
    pod["tolerations"] = [{"key": key, "operator": "Exists", "effect": "NoExecute",
                           "tolerationSeconds": WATCHER_TOLERATION_S}
                          for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {L.RUN: run, "wmctl.io/role": "watcher"}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def start(api_client: Any, manifest: dict[str, Any], run: str) -> None:
    """Create the watcher Deployment. The run is submitted by then: a refusal says so, and how to
    supervise it, instead of escaping as an API traceback."""
    apps = sdk().AppsV1Api(api_client)
    meta = manifest["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        call_json(apps.create_namespaced_deployment, ns, manifest, what=f"create Deployment {ns}/{name}",
                  field_validation="Strict")
    except api_exception() as exc:
        status = api_status(exc)
        if status not in (403, 409):
            raise
        why = ("a Deployment of that name is already there (an earlier run's watcher that could not delete "
               "it)" if status == 409 else "you may not create Deployments there (403)")
        fix = (f"remove it: `kubectl delete -n {ns} deployment/{name}`" if status == 409
               else "ask for `create` on deployments (the built-in `edit` role has it)")
        raise RunExists(f"run {run} was submitted, but its watcher Deployment {ns}/{name} was not created: {why}",
                        hint=f"{fix}; until a watcher runs nothing resumes the run: supervise it from here with "
                             f"WMCTL_RUN_STORE=kubernetes WMCTL_RUN_STORE_NAMESPACE={ns} wmctl watch {run} "
                             f"--auto-resume, or cancel it with the same settings and `wmctl cancel {run}`") from None


def retire(api_client: Any, run: str, namespace: str, environ: dict[str, str] | None = None) -> str | None:
    """In the watcher pod, once the run has ended: delete its own Deployment (named in its env, and
    only when it is this run's watcher). Returns what was done, or None outside such a pod."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_WATCHER_OBJECT)
    if not name or name != deployment_name(run):
        return None
    apps = sdk().AppsV1Api(api_client)
    try:
        call_json(apps.delete_namespaced_deployment, name, namespace, what=f"delete Deployment {namespace}/{name}")
    except api_exception() as exc:
        if api_status(exc) == 403:      # least privilege without `delete` on Deployments: say what is left
            return (f"the run has ended, but this watcher may not delete its Deployment (403): "
                    f"`kubectl delete -n {namespace} deployment/{name}` (grant the verb: {rbac_manifest()})")
        if api_status(exc) != 404:
            raise
    return f"the run has ended: deleted the watcher Deployment {namespace}/{name}"
