"""Label and annotation keys: where a run's state lives on Kubernetes objects and containers."""

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "wmctl"
RUN = "wmctl.io/run"
ATTEMPT = "wmctl.io/attempt"
NODE = "wmctl.io/node"                      # node index (Docker containers; pods use the completion index)
NODES = "wmctl.io/nodes"                    # how many nodes the attempt has (Docker): a container gone is missed
SPEC_HASH = "wmctl.io/spec-hash"
PARENT_ATTEMPT = "wmctl.io/parent-attempt"
EXCLUDED_NODES = "wmctl.io/excluded-nodes"  # comma-separated host names
VERSION = "wmctl.io/version"
CANCEL_REQUESTED = "wmctl.io/cancel-requested"  # annotation: the cancel intent (JSON), set before teardown
ROLE = "wmctl.io/role"                      # a pod of the attempt that is no node: "store" (spare nodes' c10d store)

COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_QUEUE = f"{KUEUE_GROUP}/queue-name"
KUEUE_JOB_UID = f"{KUEUE_GROUP}/job-uid"        # on the Workload Kueue creates for a Job: the Job's uid
VOLCANO_GROUP = "scheduling.k8s.io/group-name"


def run_labels(run: str, attempt: int) -> dict[str, str]:
    return {MANAGED_BY: MANAGED_BY_VALUE, RUN: run, ATTEMPT: str(attempt)}


def selector(run: str, attempt: int | None = None) -> str:
    """A label selector string for one attempt (or every attempt) of a run."""
    parts = [f"{MANAGED_BY}={MANAGED_BY_VALUE}", f"{RUN}={run}"]
    if attempt is not None:
        parts.append(f"{ATTEMPT}={attempt}")
    return ",".join(parts)
