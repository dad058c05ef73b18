"""Spare nodes on Kubernetes (restart.spares, docs/spares.md): what an attempt with spares adds to
its plan.

- The Indexed Job runs ``nodes + k`` indexes (the spares last), each pod a keeper
  (runtime/keeper.py) that owns its torchrun. ``backoffLimitPerIndex: 0`` fails only the index of a
  pod that failed (its slot: never replaced under that index), and ``maxFailedIndexes: k`` fails
  the Job once more slots are lost than there are spares (pkg/controller/job/job_controller.go).
- The rounds are the ConfigMap ``<attempt>-rounds`` (``round-N.json`` keys, as the local rounds
  folder's files); each keeper reads it through the API server with its pod's service-account
  token (a Role grants ``get`` on that one ConfigMap), so a new round reaches it within a second
  where a mounted ConfigMap waits for the kubelet's sync (a minute).
- The c10d store is a small pod of its own (``<attempt>-store``: hostname and subdomain on the
  headless Service give it a stable DNS name), so any node, node 0 included, can die.
- The keeper and the store's program travel in the ConfigMap ``<attempt>-files``, mounted at
  ``FILES_DIR``: the image needs torch, not wmctl.

Everything but the Job is owned by the Job (apply.own): it goes with the attempt.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ... import labels as L
from ... import layout
from ...runtime import c10dstore, keeper
from ...runtime.protocol import ENV_LOCAL_TAG
from ...spec import JobSpec

FILES_DIR = "/opt/wmctl"
FILES_VOLUME = "wmctl-files"
KEEPER_FILE = "keeper.py"
STORE_FILE = "c10dstore.py"
PYTHON = "python3"                     # the image's interpreter (the one with torch)
TORCHRUN = [PYTHON, "-m", keeper.TORCHRUN_MODULE]   # a keeper imports it while its slot waits (keeper.prewarm)
ROUND_KEY = "round-{n:04d}.json"
STORE_ROLE = "store"
SLOT_ENV = "JOB_COMPLETION_INDEX"       # the Job controller sets it in each Indexed pod
API_HOST = "https://kubernetes.default.svc"
# How long a keeper whose torchrun failed waits for a newer round before its pod exits with the
# failure (keeper.run_rounds hold_s): past the slowest evidence of a lost node (the runtime's beat,
# the node's Ready condition after the node monitor's grace period), so a survivor never fails its
# index while the watcher is about to replace the lost peer.
HOLD_MARGIN_S = 60.0
NODE_MONITOR_GRACE_S = 50.0             # kube-controller-manager --node-monitor-grace-period (1.32+)


def rounds_name(job_name: str) -> str:
    return f"{job_name}-rounds"


def files_name(job_name: str) -> str:
    return f"{job_name}-files"


def store_name(job_name: str) -> str:
    return f"{job_name}-store"


def store_fqdn(spec: JobSpec, job_name: str) -> str:
    """The store pod's DNS name: its hostname under the headless Service (its subdomain)."""
    return f"{store_name(job_name)}.{job_name}.{spec.kubernetes.namespace}.svc.{spec.kubernetes.cluster_domain}"


def rounds_url(namespace: str, job_name: str, host: str = API_HOST) -> str:
    return f"{host}/api/v1/namespaces/{namespace}/configmaps/{rounds_name(job_name)}"


def hold_s(spec: JobSpec) -> int:
    r = spec.restart
    return int(math.ceil(max(r.node_silence_timeout_s, r.node_loss_timeout_s, NODE_MONITOR_GRACE_S) + HOLD_MARGIN_S))


def round_doc(n: int, active: list[int], rdzv_id: str, env: dict[str, str], when: float | None = None) -> str:
    """One round as the keeper reads it (keeper.write_round's document)."""
    return json.dumps({"round": n, "active": active, "rdzv_id": rdzv_id, "env": env, "time": when or 0.0})


def keeper_command(spec: JobSpec, job_name: str, torchrun_argv: list[str], notes: list[str]) -> list[str]:
    """Each pod's command: the keeper of its slot (the completion index), torchrun after ``--``."""
    k = spec.restart.spares
    notes.append(f"{k} spare node(s) (indexes {', '.join(map(str, range(spec.nodes, spec.nodes + k)))}) wait beside "
                 f"the job's, each pod a keeper watching its rounds in ConfigMap {rounds_name(job_name)}; the c10d "
                 f"store runs in pod {store_name(job_name)}")
    return [PYTHON, f"{FILES_DIR}/{KEEPER_FILE}", "--rounds-url", rounds_url(spec.kubernetes.namespace, job_name),
            "--slot-env", SLOT_ENV, "--log", "/dev/stdout", "--exit-file", "/tmp/wmctl-keeper-exit.json",
            "--pid-file", "/tmp/wmctl-keeper-pid.json", "--hold", str(hold_s(spec)), "--", *torchrun_argv]


def pod_env() -> list[dict[str, Any]]:
    """The keeper finds its own torchrun and workers by this tag (keeper._own_tree): the pod's name."""
    return [{"name": ENV_LOCAL_TAG, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def files_mount() -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"name": FILES_VOLUME, "configMap": {"name": "", "defaultMode": 0o555}},
            {"name": FILES_VOLUME, "mountPath": FILES_DIR, "readOnly": True})


def file_texts() -> dict[str, str]:
    """The standalone programs a pod runs by path: the keeper, the store."""
    return {KEEPER_FILE: Path(keeper.__file__).read_text(encoding="utf-8"),
            STORE_FILE: Path(c10dstore.__file__).read_text(encoding="utf-8")}


def spare_values(spec: JobSpec, job_name: str, attempt: int, labels: dict[str, str],
                 node_affinity: dict[str, Any] | None) -> dict[str, Any]:
    """The template values of spares.yaml.j2 (job.yaml.j2 and podgroup.yaml.j2 read ``spares``
    and ``slots``)."""
    if not spec.restart.spares:
        return {"spares": 0, "slots": spec.nodes}
    # the store keeps off the training nodes where it can: a machine that dies with a node would
    # take the store (and the attempt) with it
    affinity: dict[str, Any] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {"job-name": job_name}}}}]}}
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    sa = spec.kubernetes.service_account or "default"
    return {
        "store_affinity": affinity, "store_pod_labels": {**labels, L.ROLE: STORE_ROLE},
        "spares": spec.restart.spares, "slots": spec.nodes + spec.restart.spares,
        "rounds_name": rounds_name(job_name), "files_name": files_name(job_name),
        "store_name": store_name(job_name), "store_labels": {L.ROLE: STORE_ROLE},
        "store_command": [PYTHON, f"{FILES_DIR}/{STORE_FILE}", "--port", str(spec.rendezvous.port)],
        "files": file_texts(), "files_dir": FILES_DIR, "files_volume": FILES_VOLUME,
        "rounds_data": {ROUND_KEY.format(n=0): round_doc(0, list(range(spec.nodes)),
                                                         layout.round_rendezvous_id(spec.name, attempt, 0), {})},
        "rounds_service_account": sa,
    }

