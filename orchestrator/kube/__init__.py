"""Kubernetes plumbing for the Kubernetes backend: client loading, watches, classification.

Nothing here imports ``kubernetes`` at module import time; client code loads it lazily so the
CLI stays fast for --help and dry runs.
"""
