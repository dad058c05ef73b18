"""The in-job runtime. Ships in every image; imports only the standard library and torch.

Nothing here may import click, jinja2, yaml, pydantic, docker or kubernetes.
"""
