"""A stateful fake Kubernetes API server plus a scripted cluster, for simulations.

Pure standard library. The real ``kubernetes`` Python client talks HTTP to it, so tests
exercise real serialisation, watches, streaming logs and error handling.
"""
