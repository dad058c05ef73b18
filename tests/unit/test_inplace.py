"""Which failures a spare node answers (orchestrator/inplace.py): a node's loss only, while one is
left; the job's own error, an OOM or a hang would follow the job to the spare."""

from __future__ import annotations

import pytest

from orchestrator import failures as F
from orchestrator.backends import base as b
from orchestrator.inplace import recover_in_place
from orchestrator.state import AttemptRecord
from orchestrator.tracker import AttemptTracker

from .helpers import spec_from
from .toy.engine import ToyBackend

BASE = {"name": "ip", "command": ["python", "train.py"], "nodes": 2, "image": {"vendor": "cpu", "tag": "x:1"}}


class SparedToy(ToyBackend):
    spares = True

    def __init__(self, left: int) -> None:
        super().__init__()
        self.left = left
        self.asked: list[object] = []

    def recover_in_place(self, ref, node):
        self.asked.append(node)
        if not self.left:
            return None
        self.left -= 1
        return b.InPlaceRecovery(round=len(self.asked), lost=node, spare=2, spares_left=self.left)


def _try(spares: int, kind: str, backend: SparedToy, node: int | None = 1):
    spec = spec_from({**BASE, "restart": {"spares": spares}})
    rec = AttemptRecord(attempt=0, submitted_at=0.0)
    tracker = AttemptTracker(started_at=0.0, last_step=12, last_checkpoint_step=10)
    failure = F.Failure(kind, node, "h1" if node is not None else None, 5.0, "evidence")
    ref = b.AttemptRef("toy", "ip", 0)
    return recover_in_place(spec, backend, ref, rec, tracker, failure, lambda: 6.0), rec


def test_a_lost_node_is_replaced_and_recorded():
    backend = SparedToy(left=1)
    (done, line), rec = _try(1, F.NODE_LOST, backend)
    assert done and "spare node 2 takes its place in round 1" in line and "0 spare(s) left" in line
    assert rec.recoveries == [{"time": 6.0, "round": 1, "lost_node": 1, "spare_node": 2, "host": "h1",
                               "evidence": "evidence", "step": 12, "checkpoint_step": 10, "detect_s": 1.0,
                               "replace_s": 0.0}]


def test_no_spare_left_falls_back_to_a_new_attempt_and_says_so():
    backend = SparedToy(left=0)
    (done, line), rec = _try(1, F.NODE_LOST, backend)
    assert not done and "node 1 failed (node_lost) and no spare node is left" in line and rec.recoveries == []


@pytest.mark.parametrize("kind", [F.APP_ERROR, F.OOM, F.STORAGE_FULL, F.RENDEZVOUS])
def test_failures_not_a_nodes_never_use_a_spare(kind):
    backend = SparedToy(left=1)
    (done, line), _ = _try(1, kind, backend)
    assert (done, line, backend.asked) == (False, None, [])


def test_a_frozen_node_is_replaced_but_a_hang_of_no_one_node_is_not():
    backend = SparedToy(left=1)
    (done, line), _ = _try(1, F.HANG, backend, node=None)     # a stuck collective: no node to blame
    assert (done, line, backend.asked) == (False, None, [])
    (done, line), rec = _try(1, F.HANG, backend)                # the engine saw node 1 paused
    assert done and "node 1 frozen" in line and rec.recoveries[0]["lost_node"] == 1


def test_without_spares_nothing_changes():
    backend = SparedToy(left=1)
    assert _try(0, F.NODE_LOST, backend)[0] == (False, None) and backend.asked == []
    assert _try(1, F.NODE_LOST, backend, node=None)[0] == (False, None) and backend.asked == []
