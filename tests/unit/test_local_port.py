"""The local backend's rendezvous port: one the OS picks, so two runs on one machine never aim at
the same TCPStore (an agent that finds the port taken joins the other run's store as a client and
fails when that run ends: seen as a C10d RendezvousConnectionError)."""

from __future__ import annotations

import socket

from orchestrator.backends.local.engine import LocalBackend

from .helpers import spec_from

BASE = {"name": "p", "command": ["python", "train.py"], "image": {"vendor": "cpu", "context": "."}}


def test_by_default_not_the_shared_rendezvous_port_and_differs_per_plan():
    spec = spec_from(BASE)
    with socket.socket() as held:           # another run's store on what the first plan got
        first = LocalBackend.host_facts(LocalBackend(), spec).port
        held.bind(("127.0.0.1", first))
        held.listen()
        second = LocalBackend.host_facts(LocalBackend(), spec).port
    assert spec.rendezvous.port not in (first, second) and first != second


def test_an_explicit_master_port_is_used_while_it_is_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = spec_from({**BASE, "local": {"master_port": port}})
    assert LocalBackend.host_facts(LocalBackend(), spec).port == port
