"""Slurm backend: an attempt is one sbatch job, one srun step, one torchrun per node.

This slice plans: ``render`` (render.py) makes the exact sbatch script and command line that a
dry run prints and that the engine will submit, and ``check`` (check.py) refuses what Slurm
cannot run. The engine (sbatch, squeue/sacct/scontrol, scancel) is not built yet: ``submits`` is
False, so a submit is refused by name before anything is recorded, and the engine's methods
refuse the same way should anything reach them.
"""

from __future__ import annotations

from typing import Iterator, NoReturn

from ...errors import BackendError
from ...plan import AttemptContext, HostFacts, Plan
from ...runtime.protocol import run_checkpoint_dir
from ...serialize import dump
from ...spec import JobSpec
from ...speccheck import context_problems
from ...vendors import VendorProfile
from .. import base as b
from ..local.render import local_checkpoint_dir
from .check import problems
from .render import SlurmRequest, render_slurm


class SlurmBackend(b.Backend[SlurmRequest]):
    name = "slurm"
    submits = False                   # the engine (sbatch, squeue, scancel) comes next
    places_nodes = True               # sbatch --exclude keeps an attempt off the nodes that failed
    runs_image = False                # without a container the nodes run this host's interpreter
    checkpoints_outlive_nodes = True  # the run folder and checkpoints are on the cluster's shared filesystem

    @classmethod
    def check(cls, spec: JobSpec) -> list[tuple[str, str]]:
        return problems(spec)

    @classmethod
    def render(cls, spec: JobSpec, profile: VendorProfile, ctx: AttemptContext,
               host: HostFacts) -> Plan[SlurmRequest]:
        return render_slurm(spec, profile, ctx, host)

    @classmethod
    def document(cls, plan: Plan[SlurmRequest], output: str) -> str:
        """The script itself (its comments name the sbatch line and the plan's notes): what
        `sbatch` reads. As json: the whole plan, script and sbatch line included."""
        if output == "json":
            return dump(plan.to_dict(), "json")
        return plan.request.script

    def check_host(self, spec: JobSpec) -> list[tuple[str, str]]:
        """Without a container the nodes run the job in image.context: it must be there."""
        return context_problems(spec) if spec.slurm.container == "none" else []

    def checkpoint_root(self, spec: JobSpec) -> tuple[str, bool]:
        """Without a container the checkpoints are a folder of the shared filesystem, seen here too."""
        if spec.slurm.container == "none":
            return run_checkpoint_dir(str(local_checkpoint_dir(spec)), spec.name), True
        return super().checkpoint_root(spec)

    # -- the engine: not built yet --------------------------------------------------------------
    def _refuse(self) -> NoReturn:
        raise BackendError(f"the {self.name} backend cannot submit or follow jobs yet: it renders the sbatch script "
                           "only (its engine is still to come)",
                           hint=f"see the script with `wmctl submit SPEC -b {self.name} --dry-run` or "
                                f"`wmctl render SPEC -b {self.name}`")

    def submit(self, plan: Plan[SlurmRequest]) -> b.AttemptRef:
        self._refuse()

    def poll(self, ref: b.AttemptRef) -> b.Observation:
        self._refuse()

    def logs(self, ref: b.AttemptRef, node: int = 0, follow: bool = False,
             query: b.LogQuery | None = None) -> Iterator[str]:
        self._refuse()

    def cancel(self, ref: b.AttemptRef, graceful: bool = False) -> None:
        self._refuse()

    def attempts(self, run: str) -> list[b.AttemptRef]:
        self._refuse()
