"""The Kubernetes kinds wmctl creates, as data: which API serves each, how its methods are named,
and the order an attempt's objects are created in (kr8s keeps such a table instead of if-chains).

A new kind is one row. Typed kinds go through the client's ``<Api>.create_namespaced_<method>`` /
``read_namespaced_<method>``; custom resources through ``CustomObjectsApi`` with group, version
and plural.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    kind: str
    order: int                       # created in this order: lower first
    api: str | None = None           # typed API class (CoreV1Api, BatchV1Api); None: a custom resource
    method: str | None = None        # typed method suffix: create_namespaced_<method>
    plural: str | None = None        # custom resource plural
    api_version: str | None = None   # custom resource group/version, as wmctl renders it
    owned: bool = False              # gets an ownerReference to the attempt's Job, so it goes with it


KINDS: dict[str, Kind] = {k.kind: k for k in (
    # The Service (DNS for the rendezvous) and a PodGroup (gang) exist before the Job's pods.
    # Each is owned by the Job (set once the Job exists and has a uid): whoever deletes the Job,
    # the TTL-after-finished controller included, the garbage collector deletes them too.
    Kind("Service", 0, api="CoreV1Api", method="service", owned=True),
    Kind("ConfigMap", 0, api="CoreV1Api", method="config_map", owned=True),
    Kind("PodGroup", 1, plural="podgroups", api_version="scheduling.volcano.sh/v1beta1", owned=True),
    # Spare nodes (spares.py): the keepers' Role on their rounds ConfigMap, and the c10d store's
    # pod, up before the nodes' pods.
    Kind("Role", 0, api="RbacAuthorizationV1Api", method="role", owned=True),
    Kind("RoleBinding", 0, api="RbacAuthorizationV1Api", method="role_binding", owned=True),
    Kind("Pod", 1, api="CoreV1Api", method="pod", owned=True),
    Kind("Job", 2, api="BatchV1Api", method="job"),
)}


def create_order(kind: str | None) -> int:
    found = KINDS.get(kind or "")
    return found.order if found else 1
