"""Records: dataclasses whose methods are shared, not compiled once per class.

CPython 3.11's ``@dataclass`` writes each class's ``__init__``, ``__repr__`` and ``__eq__`` (and,
frozen, ``__setattr__``, ``__delattr__`` and ``__hash__``) as source text and compiles it
(``dataclasses._create_fn``): about 4 million instructions per class, measured with callgrind, so
the 35 types a dry run touches cost it ~120M of its ~640M (the floor of click + jinja2 + yaml is
395M; bench/bench_dryrun.py). A record is a dataclass made with ``init``, ``repr`` and ``eq``
off, so that ``fields()``, ``asdict()``, ``replace()`` and ``is_dataclass()`` work on it as on any
dataclass; the methods it lacks are the shared functions below, which read the class's fields
once, at its first instance. Same behaviour as the generated ones for what this code base uses
(defaults, ``field(default_factory=...)``, ``field(init=False)``, ``field(repr=False)``,
``field(compare=False)``, ``frozen``, ``__post_init__``); tests/unit/test_records.py holds each
against ``@dataclass`` itself.

Use it for types on the dry run's path; elsewhere a plain ``@dataclass`` is as good. A subclass
of a record is a record too: ``@dataclass(frozen=True)`` refuses a base it reads as not frozen.
"""

from __future__ import annotations

from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, TypeVar, overload

_T = TypeVar("_T")
_F = TypeVar("_F")

if TYPE_CHECKING:   # type checkers read records as dataclasses (PEP 681); typing has it from 3.11
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: object) -> Callable[[_F], _F]:
        return lambda f: f


# (name, default, default_factory) of the fields __init__ takes, in order; the same for the
# init=False fields; the names __init__ takes; the names compared and hashed; the names shown.
_Plan = tuple[tuple[tuple[str, Any, Any], ...], tuple[tuple[str, Any, Any], ...], frozenset[str],
              tuple[str, ...], tuple[str, ...]]


def _plan(cls: type) -> _Plan:
    plan: _Plan | None = cls.__dict__.get("__record_plan__")
    if plan is None:
        every = fields(cls)
        taken = tuple((f.name, f.default, f.default_factory) for f in every if f.init)
        rest = tuple((f.name, f.default, f.default_factory) for f in every if not f.init)
        plan = (taken, rest, frozenset(name for name, _, _ in taken),
                tuple(f.name for f in every if f.compare), tuple(f.name for f in every if f.repr))
        type.__setattr__(cls, "__record_plan__", plan)
    return plan


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    taken, rest, names, _, _ = _plan(cls)
    if len(args) > len(taken):
        raise TypeError(f"{cls.__name__}.__init__() takes {len(taken) + 1} positional arguments "
                        f"but {len(args) + 1} were given")
    for name in kwargs:
        if name not in names:
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}")
    put = object.__setattr__
    for i, (name, default, factory) in enumerate(taken):
        if i < len(args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument {name!r}")
            value = args[i]
        elif name in kwargs:
            value = kwargs[name]
        elif default is not MISSING:
            value = default
        elif factory is not MISSING:
            value = factory()
        else:
            raise TypeError(f"{cls.__name__}.__init__() missing 1 required argument: {name!r}")
        put(self, name, value)
    for name, default, factory in rest:
        if default is not MISSING:
            put(self, name, default)
        elif factory is not MISSING:
            put(self, name, factory())
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _repr(self: Any) -> str:
    shown = _plan(type(self))[4]
    return f"{type(self).__qualname__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")"


def _eq(self: Any, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    compared = _plan(type(self))[3]
    return all(getattr(self, n) == getattr(other, n) for n in compared)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in _plan(type(self))[3]))


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: type[_T], frozen: bool) -> type[_T]:
    own = dict(cls.__dict__)
    made = dataclass(init=False, repr=False, eq=False)(cls)
    methods: dict[str, object] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    for name, method in methods.items():
        if name not in own:
            type.__setattr__(made, name, method)
    # dataclasses' hash table for eq=True: a __hash__ the class wrote stays; otherwise frozen
    # hashes the compared fields and unfrozen is unhashable (Python's own None after an __eq__
    # in the class body does not count as written).
    class_hash = own.get("__hash__", MISSING)
    if class_hash is MISSING or (class_hash is None and "__eq__" in own):
        type.__setattr__(made, "__hash__", _hash if frozen else None)
    return made


@overload
@dataclass_transform(field_specifiers=(field,))
def record(cls: type[_T], /) -> type[_T]: ...
@overload
def record(*, frozen: bool = False) -> Callable[[type[_T]], type[_T]]: ...


def record(cls: type[_T] | None = None, /, *, frozen: bool = False) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """``@record`` or ``@record(frozen=True)`` in place of ``@dataclass`` / ``@dataclass(frozen=True)``."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)
