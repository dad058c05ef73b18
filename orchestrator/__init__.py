"""wmctl: distributed PyTorch jobs from source to a self-healing run on any accelerator."""

__version__ = "0.1.0"
