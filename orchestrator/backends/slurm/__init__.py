"""Slurm backend: an attempt is one sbatch job whose one srun step starts torchrun on every node."""

from .engine import SlurmBackend as BACKEND

__all__ = ["BACKEND"]
