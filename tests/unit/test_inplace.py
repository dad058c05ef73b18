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
    assert rec.recoveries == [{"time": 6.0, "kind": F.NODE_LOST, "round": 1, "lost_node": 1, "spare_node": 2,
                               "host": "h1", "evidence": "evidence", "step": 12, "checkpoint_step": 10, "detect_s": 1.0,
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


def test_recoveries_with_no_checkpoint_between_are_capped_at_the_spares():
    """A spare is spent on each loss; with spares replenished, a failure that follows the job
    (each new spare dies too) must not loop for ever: more in-place recoveries than restart.spares
    with no checkpoint committed since is a new attempt, which counts."""
    spec = spec_from({**BASE, "restart": {"spares": 1}})
    backend = SparedToy(left=5)
    rec = AttemptRecord(attempt=0, submitted_at=0.0)
    ref = b.AttemptRef("toy", "ip", 0)

    def lose(node: int, checkpoint: int):
        tracker = AttemptTracker(started_at=0.0, last_step=checkpoint + 2, last_checkpoint_step=checkpoint)
        return recover_in_place(spec, backend, ref, rec, tracker, F.Failure(F.NODE_LOST, node, "h", 5.0, "gone"),
                                lambda: 6.0)

    assert lose(1, 10)[0]
    done, line = lose(0, 10)         # the same checkpoint: nothing committed since the last recovery
    assert not done and "after 1 in-place recovery with no checkpoint committed since (step 10" in line
    assert backend.asked == [1]
    assert lose(0, 20)[0]            # the round committed step 20: progress, so a spare answers again
    assert [r["lost_node"] for r in rec.recoveries] == [1, 0]


class Replenishing(SparedToy):
    replenishes_spares = True

    def __init__(self, left: int, can: bool = True) -> None:
        super().__init__(left)
        self.can = can
        self.started: list[int] = []

    def replenish_spare(self, ref, lost):
        self.started.append(lost)
        return 10 + len(self.started) if self.can else None


class Cannot(Replenishing):
    replenishes_spares = False


def _replenish_case(spares_spec: dict, backend: SparedToy):
    spec = spec_from({**BASE, "restart": {"spares": 1, **spares_spec}})
    rec = AttemptRecord(attempt=0, submitted_at=0.0)
    ref = b.AttemptRef("toy", "ip", 0)
    first = AttemptTracker(started_at=0.0, last_step=12, last_checkpoint_step=10)
    assert recover_in_place(spec, backend, ref, rec, first, F.Failure(F.NODE_LOST, 1, "h", 5.0, "gone"),
                            lambda: 6.0)[0]
    return spec, rec, ref, first.next_round(7.0, None)


def test_a_used_spare_is_replenished_once_the_new_round_has_stepped_never_before():
    from orchestrator.inplace import replenish

    backend = Replenishing(left=1)
    spec, rec, ref, tracker = _replenish_case({}, backend)
    assert replenish(spec, backend, ref, rec, tracker, 8.0) == [] and backend.started == []   # still recovering
    tracker.all_started_at = 7.5
    assert replenish(spec, backend, ref, rec, tracker, 9.0) == [] and backend.started == []   # up, no step yet
    tracker.first_step_at = 9.5
    tended = replenish(spec, backend, ref, rec, tracker, 10.0)
    assert backend.started == [1] and rec.recoveries[0]["replenished"] == 11
    assert tended == [(rec.recoveries[0], "attempt 0: spare node 11 started in the background for the one round 1 used "
                     "(restart.replenish_spares)")]
    assert replenish(spec, backend, ref, rec, tracker, 11.0) == [] and backend.started == [1]     # once


def test_a_job_that_reports_no_steps_gets_its_spare_after_its_nodes_ran_a_while():
    from orchestrator.inplace import REPLENISH_AFTER_S, replenish

    backend = Replenishing(left=1)
    spec, rec, ref, tracker = _replenish_case({}, backend)
    tracker.all_started_at = 8.0
    assert replenish(spec, backend, ref, rec, tracker, 8.0 + REPLENISH_AFTER_S - 0.1) == []
    assert replenish(spec, backend, ref, rec, tracker, 8.0 + REPLENISH_AFTER_S) and backend.started == [1]


@pytest.mark.parametrize("case", ["off", "cannot", "fails"])
def test_no_replenishing_when_off_or_the_backend_cannot(case):
    from orchestrator.inplace import replenish

    backend = (Cannot if case == "cannot" else Replenishing)(left=1, can=case != "fails")
    spec, rec, ref, tracker = _replenish_case({"replenish_spares": False} if case == "off" else {}, backend)
    tracker.first_step_at = 9.0
    tended = replenish(spec, backend, ref, rec, tracker, 10.0)
    if case == "fails":
        assert rec.recoveries[0]["replenished"] is None and "no new spare could be started" in tended[0][1]
    else:
        assert tended == [] and backend.started == [] and "replenished" not in rec.recoveries[0]
