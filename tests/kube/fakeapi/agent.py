"""torchrun's agent waiting at the rendezvous, for pods scripted with ``rendezvous=True``.

torch/distributed/run.py -> launcher/api.py launch_agent -> agent/server/api.py _rendezvous:
every agent joins the c10d rendezvous at the endpoint (pod 0's store) and waits for all
``--nnodes`` of them. An agent that started first waits: on the store host, up to
``join_timeout`` (elastic/rendezvous/dynamic_rendezvous.py, RendezvousTimeoutError); on any
other node, up to ``read_timeout`` for the store to answer at all
(elastic/rendezvous/c10d_rendezvous_backend.py _create_tcp_store: "The connection to the C10d
store has failed", RendezvousConnectionError from a DistNetworkError). Then the agent exits 1
with its own traceback, no worker's. Both timeouts are read from the pod's own command line
(``--rdzv-conf=join_timeout=N,read_timeout=M``, in Kubernetes seconds, scaled like every other
duration). The rendezvous completes once every pod of the Job (same ``job-name``) runs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .store import Obj

if TYPE_CHECKING:
    from .cluster import Cluster, PodRuntime

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
TD = "/usr/local/lib/python3.11/site-packages/torch/distributed"


def _conf(pod: Obj) -> dict[str, float]:
    words = [w for c in pod["spec"]["containers"][:1] for w in (c.get("command") or []) + (c.get("args") or [])]
    for w in words:
        m = re.match(r"^--rdzv-conf=(.*)$", w)
        if m:
            pairs = (kv.split("=", 1) for kv in m.group(1).split(",") if "=" in kv)
            return {k: float(v) for k, v in pairs if v.replace(".", "").isdigit()}
    return {}


def _traceback(store_host: bool, waited: int) -> list[str]:
    head = ["Traceback (most recent call last):", '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{TD}/launcher/api.py", line 270, in launch_agent', "    result = agent.run()",
            f'  File "{TD}/elastic/agent/server/api.py", line 711, in _invoke_run',
            "    self._initialize_workers(self._worker_group)",
            f'  File "{TD}/elastic/agent/server/api.py", line 683, in _initialize_workers',
            "    self._rendezvous(worker_group)",
            f'  File "{TD}/elastic/agent/server/api.py", line 500, in _rendezvous',
            "    rdzv_info = spec.rdzv_handler.next_rendezvous()"]
    if store_host:
        return head + [f"torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: the rendezvous did not "
                       f"complete within {waited} seconds"]
    return head + ["torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
                   "store has failed. See inner exception for details."]


def at_rendezvous(cluster: "Cluster", pod: Obj, rt: "PodRuntime", now: float) -> bool:
    """True while this pod's agent still waits at the rendezvous (its script's clock held back);
    False once it completed. An agent that gave up has its pod's exit scripted (exit 1, its
    traceback in the log) and its clock run out."""
    if not rt.script.rendezvous or rt.rdzv_done:
        return False
    job = (pod["metadata"].get("labels") or {}).get("job-name")
    peers, _ = cluster.store.list("pods", pod["metadata"]["namespace"], lambda p: (
        (p["metadata"].get("labels") or {}).get("job-name") == job and not p["metadata"].get("deletionTimestamp")))
    nnodes = int(next((w.split("=", 1)[1] for c in pod["spec"]["containers"][:1]
                       for w in (c.get("command") or []) + (c.get("args") or []) if w.startswith("--nnodes=")), "1"))
    if sum(1 for p in peers if (p.get("status") or {}).get("phase") == "Running") >= nnodes:
        rt.rdzv_done = True
        rt.started_at = now            # the job's own script starts after the rendezvous
        return False
    conf = _conf(pod)
    store_host = (pod["metadata"].get("labels") or {}).get(INDEX_KEY) == "0"
    limit = conf.get("join_timeout" if store_host else "read_timeout", 600.0)
    assert rt.started_at is not None
    if now - rt.started_at < cluster.timings.real(limit):
        return True
    rt.rdzv_done = True
    rt.script = type(rt.script)(run_seconds=0.0, exit_code=1,
                                logs=[(0.0, line) for line in _traceback(store_host, int(limit))])
    cluster.note("rendezvous_timeout", pod["metadata"]["name"])
    return False
