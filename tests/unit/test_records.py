"""A record behaves as the @dataclass it replaces, for every feature the code base uses: each
check runs on a record and on the same class made by dataclasses, and expects the same."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import field

import pytest

from orchestrator.runtime.records import record


def make(kind: str, frozen: bool):
    deco = (record(frozen=True) if frozen else record) if kind == "record" else dataclasses.dataclass(frozen=frozen)

    class Inner:
        a: int
        b: str = "b"
        c: list[int] = field(default_factory=list)
        d: int = field(default=4, compare=False, repr=False)
        e: int = field(default=5, init=False)

        @property
        def doubled(self) -> int:
            return self.a * 2

    Inner.__qualname__ = "Inner"
    return deco(Inner)


# module-level copies, so that pickle finds them by name
RecordInner, FrozenRecordInner = make("record", False), make("record", True)
for _name, _cls in (("RecordInner", RecordInner), ("FrozenRecordInner", FrozenRecordInner)):
    _cls.__qualname__ = _cls.__name__ = _name


KINDS = [pytest.param(frozen, id="frozen" if frozen else "mutable") for frozen in (False, True)]


@pytest.mark.parametrize("frozen", KINDS)
def test_construction_defaults_factories_and_errors_match_dataclass(frozen):
    R, D = make("record", frozen), make("dataclass", frozen)
    for cls in (R, D):
        one, two = cls(1), cls(1)
        assert (one.a, one.b, one.c, one.d, one.e, one.doubled) == (1, "b", [], 4, 5, 2)
        assert one.c is not two.c                          # a fresh list per instance
        assert cls(1, "x", [2], 9).b == "x" and cls(a=1, d=9).d == 9
    args: tuple
    for args, kwargs in [((), {}), ((1, "x", [], 4, 5), {}), ((1,), {"a": 2}), ((), {"a": 1, "e": 2}),
                         ((), {"a": 1, "zz": 2})]:
        with pytest.raises(TypeError):
            D(*args, **kwargs)
        with pytest.raises(TypeError):
            R(*args, **kwargs)


@pytest.mark.parametrize("frozen", KINDS)
def test_repr_eq_and_hash_match_dataclass(frozen):
    R, D = make("record", frozen), make("dataclass", frozen)
    assert repr(R(1, "x", [3])) == repr(D(1, "x", [3])) == "Inner(a=1, b='x', c=[3], e=5)"
    assert R(1) == R(1) and R(1) != R(2) and R(1, d=7) == R(1, d=8)   # d is not compared
    assert R(1) != D(1) and R(1).__eq__(object()) is NotImplemented
    if frozen:
        assert hash(R(1, c=())) == hash(R(1, c=())) == hash(D(1, c=()))   # the same fields hashed
    else:
        with pytest.raises(TypeError):
            hash(R(1))
        with pytest.raises(TypeError):
            hash(D(1))


def test_frozen_refuses_assignment_and_deletion_as_dataclass_does():
    R, D = make("record", True), make("dataclass", True)
    for obj in (R(1), D(1)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.a = 2
        with pytest.raises(dataclasses.FrozenInstanceError):
            del obj.a
        assert obj.a == 1
    mutable = make("record", False)(1)
    mutable.a = 2
    assert mutable.a == 2


@pytest.mark.parametrize("frozen", KINDS)
def test_dataclasses_functions_work_on_records(frozen):
    R = FrozenRecordInner if frozen else RecordInner
    one = R(1, "x", [2])
    assert dataclasses.is_dataclass(type(one))         # (its class: is_dataclass(one) narrows `one` for mypy)
    assert [f.name for f in dataclasses.fields(one)] == ["a", "b", "c", "d", "e"]
    assert dataclasses.asdict(one) == {"a": 1, "b": "x", "c": [2], "d": 4, "e": 5}
    changed = dataclasses.replace(one, b="y")
    assert (changed.a, changed.b, type(changed)) == (1, "y", R)
    assert pickle.loads(pickle.dumps(one)) == one and copy.deepcopy(one) == one


def test_methods_a_class_writes_itself_are_kept_and_post_init_runs():
    seen = []

    @record(frozen=True)
    class Own:
        a: int

        def __repr__(self) -> str:
            return "mine"

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 7

        def __post_init__(self) -> None:
            seen.append(self.a)

    @record
    class EqOnly:
        a: int

        def __eq__(self, other: object) -> bool:
            return False

    assert repr(Own(1)) == "mine" and Own(1) == Own(2) and hash(Own(1)) == 7 and seen == [1, 1, 2, 1]
    assert EqOnly(1) != EqOnly(1)
    with pytest.raises(TypeError):     # as @dataclass: its own __eq__ and no __hash__ is unhashable
        hash(EqOnly(1))
