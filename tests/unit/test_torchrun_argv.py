"""The user's arguments reach the program intact on every backend, whatever torchrun's own flags.

torchrun's argparse looks at every word for an abbreviated option, even after the program: a
user's ``--n 200000`` was read as an ambiguous abbreviation of ``--nnodes``/``--no-python``/...
and the launch failed with exit 2 (read as the job's own error). Each rendered torchrun line is
parsed here by torch's own parser (torch.distributed.run.get_args_parser), as the node would.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from orchestrator.commands._common import plan_document
from orchestrator.plan import AttemptContext
from orchestrator.vendors import load_profile

from .helpers import full_spec, render_plan

run = pytest.importorskip("torch.distributed.run")

# Each collides with torchrun's flags as a prefix (--n: --nnodes, --nproc-per-node, --no-python,
# --node-rank; --no; --log: --log-dir, --logs-specs; --max: --max-restarts; --run: --run-path),
# and a user's own `--` must stay theirs.
USER = ["python", "train.py", "--n", "200000", "--no", "--log", "x", "--max", "3", "--run", "y", "--", "z"]


def torchrun_lines(node: Any) -> list[list[str]]:
    """Every argv in a rendered plan that runs torchrun's rendezvous."""
    found: list[list[str]] = []
    if isinstance(node, dict):
        for value in node.values():
            found += torchrun_lines(value)
    elif isinstance(node, list):
        if node and all(isinstance(w, str) for w in node) and "--rdzv-backend=c10d" in node:
            found.append(node)
        else:
            for value in node:
                found += torchrun_lines(value)
    return found


@pytest.mark.parametrize("backend", ["local", "docker", "kubernetes"])
def test_user_arguments_that_look_like_torchrun_flags_reach_the_program(backend, monkeypatch):
    monkeypatch.setenv("WMCTL_HOME", "/nonexistent/.wmctl")
    spec = full_spec("cpu", command=USER)
    ctx = AttemptContext(attempt=0)
    kwargs: dict[str, Any] = {"cpus": list(range(8))}
    if backend == "local":
        kwargs.update(python="/usr/bin/python3", port=29500)
    plan = render_plan(spec, load_profile("cpu"), backend, ctx, **kwargs)
    lines = torchrun_lines(list(yaml.safe_load_all(plan_document(plan, "yaml"))))
    # One pod template for every index on Kubernetes; a line a node elsewhere.
    assert len(lines) == (1 if backend == "kubernetes" else spec.nodes), lines
    for argv in lines:
        first = next(i for i, w in enumerate(argv) if w.startswith("--"))
        args = run.get_args_parser().parse_args(argv[first:])
        # wmctl-bind, or on local `python -m orchestrator.runtime.affinity` with the host's python
        words = [args.training_script, *args.training_script_args]
        assert args.no_python and ("wmctl-bind" in words[:1] or "orchestrator.runtime.affinity" in words[:3]), argv
        program = words.index("train.py")
        assert words[program:] == USER[1:], argv
        assert words[program - 1].endswith("python") or words[program - 1].endswith("python3"), argv
        assert args.nnodes == str(spec.nodes) and args.max_restarts == 0
