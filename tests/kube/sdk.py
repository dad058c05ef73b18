"""The kubernetes SDK's `client` module as the simulations hold it: typed `Any` once, here.

The tests drive the real SDK with plain dict manifests (it serialises them as they are, and the
fake API server takes what a real one takes), and read back optional model fields they check as
they go; the SDK's annotations ask for its V1* model classes on every call."""

from __future__ import annotations

from typing import Any

from kubernetes import client as _client

client: Any = _client
