"""The contract between the orchestrator (outside the job) and the runtime (inside it).

Standard library only: both sides import this module.

Jobs that checkpoint themselves (Megatron, DeepSpeed, Lightning, plain ``torch.save``) need none
of the runtime to be resumed: the supervisor relaunches the job, the job resumes from its own
checkpoints, and it reports them with progress lines it prints itself, one JSON object after
``WMCTL-PROGRESS `` on stdout (any rank; every node's output is read):

    WMCTL-PROGRESS {"event": "checkpoint", "step": 1200}   once checkpoint 1200 is durable
    WMCTL-PROGRESS {"event": "resume", "step": 1200}       once the job resumed from it
    WMCTL-PROGRESS {"event": "step", "step": 1210}         a heartbeat, often enough

From these the supervisor reports the newest checkpoint of each attempt and applies its
no-progress rule (an attempt that resumed from N and committed nothing newer is not retried
again). After a job's first progress line only progress lines count as its heartbeat, so a job
that prints them prints ``step`` lines more often than ``restart.heartbeat_timeout``. A
progress line, not a ``latest`` file: the supervisor cannot always read the checkpoint folder
(a volume inside the cluster), but it always reads the job's output.
tests/integration/jobs/selfsave.py is such a job.
"""

from __future__ import annotations

import json
import posixpath
import time
from typing import Any, TextIO

# Exit code a rank uses after a graceful, checkpointed stop on SIGTERM. Distinct from 1 (app
# error), 137 (SIGKILL/OOM) and 143 (SIGTERM without handling) so the supervisor can tell it apart.
PREEMPTED_EXIT_CODE = 83

# Every progress line starts with this marker, then one JSON object, on global rank 0's stdout.
# With c10d rendezvous, global rank 0 may live on any node: backends read every node's output.
PROGRESS_PREFIX = "WMCTL-PROGRESS "

# Environment the orchestrator sets for the job (every backend sets the same names).
ENV_RUN = "WMCTL_RUN"                      # run name
ENV_ATTEMPT = "WMCTL_ATTEMPT"              # attempt number, 0-based
# The fencing epoch (checkpoint root's ATTEMPT file) when it is not the attempt: with spare nodes
# each in-place recovery inside an attempt opens a new one (attempt * EPOCHS_PER_ATTEMPT + round).
ENV_FENCE_EPOCH = "WMCTL_FENCE_EPOCH"
EPOCHS_PER_ATTEMPT = 1000
ENV_SPEC_HASH = "WMCTL_SPEC_HASH"          # JobSpec.spec_hash() of the spec this attempt runs
ENV_VENDOR = "WMCTL_VENDOR"                # vendor profile name (cuda, musa, ..., cpu)
ENV_VENDOR_PROFILE = "WMCTL_VENDOR_PROFILE"  # the runtime part of that profile, as JSON (runtime.vendor)
ENV_TORCH_MODULE = "WMCTL_TORCH_MODULE"    # torch device module (the profile's torch_module)
ENV_DIST_BACKEND = "WMCTL_DIST_BACKEND"    # the collective library (the profile's dist_backend)
ENV_CHECKPOINT_DIR = "WMCTL_CHECKPOINT_DIR"  # this run's own checkpoint root (run_checkpoint_dir)
ENV_CHECKPOINT_EVERY = "WMCTL_CHECKPOINT_EVERY"
ENV_CHECKPOINT_KEEP = "WMCTL_CHECKPOINT_KEEP"
ENV_RESUME = "WMCTL_RESUME"                # "1": resume from the latest complete checkpoint if any
ENV_RESUME_FROM = "WMCTL_RESUME_FROM"      # another checkpoint root or step folder to start from on purpose
ENV_AFFINITY = "WMCTL_AFFINITY"            # none | numa | exclusive | JSON {local_rank: "cpulist"}
ENV_HEARTBEAT_EVERY = "WMCTL_HEARTBEAT_EVERY"  # emit a step progress line every N steps
ENV_PROGRESS_FILE = "WMCTL_PROGRESS_FILE"  # optional: also append progress lines to this file
ENV_EXPECT_DEVICES = "WMCTL_EXPECT_DEVICES"  # accelerators each node must see (preflight); unset: one per local rank
ENV_NODE_NAME = "WMCTL_NODE_NAME"          # the host (or container) a node runs on, as the backend names it
ENV_POD_NAME = "WMCTL_POD_NAME"            # Kubernetes: the pod's own name
ENV_PG_TIMEOUT = "WMCTL_PG_TIMEOUT"        # process-group timeout in seconds (runtime.dist)

# Set by the CPU-binding launcher (wmctl-bind) for the rank it starts.
ENV_BOUND_CPUS = "WMCTL_BOUND_CPUS"        # the CPU list it bound this rank to
ENV_KEEP_OMP = "WMCTL_KEEP_OMP"            # "1": leave OMP_NUM_THREADS / MKL_NUM_THREADS alone
ENV_SYSFS_ROOT = "WMCTL_SYSFS_ROOT"        # tests: read the topology from a fake tree

# Outside the job: the orchestrator's own settings.
ENV_HOME = "WMCTL_HOME"                    # run folders live under it (default ~/.wmctl)
ENV_WATCHER_OBJECT = "WMCTL_WATCHER_OBJECT"  # in a watcher started by `submit --in-cluster`: what restarts it
ENV_RUN_STORE = "WMCTL_RUN_STORE"          # where run state is kept: unset (this machine) or a backend with a run_store
ENV_VENDOR_PATH = "WMCTL_VENDOR_PATH"      # folders of vendor profiles, searched before images/
ENV_LOCAL_TAG = "WMCTL_LOCAL_TAG"          # local backend: marks every process of one node
ENV_CACHE_DIR = "WMCTL_CACHE_DIR"          # where the runtime wheel is cached
ENV_RUNTIME_WHEEL = "WMCTL_RUNTIME_WHEEL"  # a prebuilt runtime wheel to put in images
ENV_TEST_SLEEP_BEFORE_COMMIT = "WMCTL_TEST_SLEEP_BEFORE_COMMIT"  # tests: widen the torn-commit window
ENV_TEST_PAUSE_AT = "WMCTL_TEST_PAUSE_AT"  # tests: the watcher holds this phase open (supervisor.pause_point)


def run_checkpoint_dir(directory: str, run: str) -> str:
    """A run's own checkpoint root under the configured checkpoint folder: ``<directory>/<run>``.

    The one place that scopes checkpoints per run: the launcher hands the job this folder
    (WMCTL_CHECKPOINT_DIR) and everything outside the job that looks for the run's checkpoints
    asks here, so both sides agree. Two runs configured with the same folder never restore (or
    prune) each other's checkpoints. POSIX joining: the folder is often a path inside a container.
    """
    return posixpath.join(directory, run) if run else directory


def format_progress(event: str, **fields: Any) -> str:
    """One progress line (no newline). ``event``: start, resume, step, checkpoint,
    checkpoint_damaged, preempted, exit."""
    payload = {"event": event, "time": round(time.time(), 3), **fields}
    return PROGRESS_PREFIX + json.dumps(payload, sort_keys=True, separators=(",", ":"))


def parse_progress(line: str) -> dict[str, Any] | None:
    """Parse a progress line back; None for any other output (logs, tracebacks, torchrun noise)."""
    idx = line.find(PROGRESS_PREFIX)
    if idx < 0:
        return None
    try:
        payload = json.loads(line[idx + len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and "event" in payload else None


def emit_progress(event: str, *, _stream: TextIO | None = None, _file: str | None = None, **fields: Any) -> str:
    """Write one progress line (fields such as ``path`` or ``step`` go into the JSON)."""
    import sys

    line = format_progress(event, **fields)
    out = _stream or sys.stdout
    out.write(line + "\n")
    out.flush()
    if _file:
        with open(_file, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return line
