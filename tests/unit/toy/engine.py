from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

from orchestrator import layout
from orchestrator.backends import base as b
from orchestrator.plan import AttemptContext, HostFacts, Plan, Request
from orchestrator.runtime.protocol import format_progress, parse_progress
from orchestrator.runtime.records import record


@record(frozen=True)
class ToyRequest(Request):
    attempt_dir: Path


class ToyBackend(b.Backend[ToyRequest]):
    name = "toy"
    runs_image = False
    checkpoints_outlive_nodes = True

    def __init__(self) -> None:
        self.procs: dict[tuple[str, int], list[subprocess.Popen]] = {}
        self.read: dict[tuple[str, int, int], int] = {}

    @classmethod
    def render(cls, spec, profile, ctx: AttemptContext, host: HostFacts) -> Plan[ToyRequest]:
        steps = [format_progress("step", step=s, loss=1.0 / s) for s in (1, 2, 3)]
        script = "; ".join(f"print({line!r})" for line in steps)
        nodes = [{"kind": "process", "node": n, "argv": [host.python, "-c", script]} for n in range(spec.nodes)]
        return Plan(backend=cls.name, run=spec.name, attempt=ctx.attempt, spec_hash=spec.spec_hash(),
                    request=ToyRequest(layout.attempt_dir(spec.name, ctx.attempt, host.home)),
                    resources=nodes, context=ctx)

    def submit(self, plan: Plan[ToyRequest]) -> b.AttemptRef:
        plan.request.attempt_dir.mkdir(parents=True, exist_ok=True)
        procs = []
        for res in plan.resources:
            log = open(layout.node_log(plan.run, plan.attempt, res["node"]), "wb")
            procs.append(subprocess.Popen(res["argv"], stdout=log, stderr=subprocess.STDOUT))
        self.procs[(plan.run, plan.attempt)] = procs
        (plan.request.attempt_dir / layout.PLAN_FILE).write_text(json.dumps(plan.to_dict()))
        return b.AttemptRef(self.name, plan.run, plan.attempt)

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        events, nodes = [], []
        for node, proc in enumerate(self.procs.get((ref.run, ref.attempt), [])):
            code = proc.poll()
            lines = layout.node_log(ref.run, ref.attempt, node).read_text().splitlines()
            seen = self.read.get((ref.run, ref.attempt, node), 0)
            for line in lines[seen:]:
                p = parse_progress(line)
                if p is not None and node == 0:
                    events.append(b.Event(b.PROGRESS, node=node, host="toy", progress=p))
            self.read[(ref.run, ref.attempt, node)] = len(lines)
            phase = b.RUNNING if code is None else (b.SUCCEEDED if code == 0 else b.FAILED)
            nodes.append(b.NodeStatus(node, phase, "toy", code))
        return b.Observation(events, nodes)

    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        yield from layout.node_log(ref.run, ref.attempt, node).read_text().splitlines()

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        for proc in self.procs.pop((ref.run, ref.attempt), []):
            proc.kill()
            proc.wait()

    def attempts(self, run: str) -> list[b.AttemptRef]:
        return [b.AttemptRef(self.name, r, a) for (r, a) in sorted(self.procs) if r == run]
