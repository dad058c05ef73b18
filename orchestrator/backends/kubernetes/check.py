"""Spec problems only Kubernetes has."""

from __future__ import annotations

from ...spec import JobSpec
from ...validate import Problems


def volume_problems(spec: JobSpec) -> Problems:
    """Docker resolves a relative host_path against the spec folder and local maps it; a
    Kubernetes hostPath is a path on whichever node runs the pod, so it must be absolute."""
    return [(f"volumes[{i}].host_path", f"{vol.host_path!r} is relative; Kubernetes needs an absolute path "
             "on the node, e.g. /mnt/ckpt (or use a pvc or nfs volume)")
            for i, vol in enumerate(spec.volumes)
            if vol.host_path is not None and not vol.host_path.startswith("/")]
