"""Frozen dataclasses whose methods are shared instead of generated, for the login path.

`@dataclass(frozen=True)` writes `__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__` and
`__delattr__` as source text for each class and compiles them with exec() when the class is
defined (Python 3.11 and 3.12), and builds a docstring from `inspect.signature`: about 0.7 ms a
class, most of the site model's import time (docs/performance.md, "The login path").

`@record` makes the same dataclass: fields, defaults, `default_factory`, metadata,
`dataclasses.fields`, `replace` and `asdict` are dataclasses' own. Only those six methods differ:
one copy of each, defined here once, reads the class's fields when it is called. Instances
compare, hash, print and refuse assignment as a frozen dataclass's do; `__init__` takes keyword
arguments only, unless `kw_only=False`.
"""

from __future__ import annotations

from dataclasses import MISSING, FrozenInstanceError, dataclass, fields
from typing import Any, dataclass_transform


@dataclass_transform(kw_only_default=True, frozen_default=True)
def record(cls: type | None = None, /, *, kw_only: bool = True) -> Any:
    """`@record` or `@record(kw_only=False)` on a class written as for `@dataclass`."""

    def wrap(cls: type) -> type:
        if "__post_init__" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: a record has no __post_init__")
        if not cls.__doc__:   # else dataclass writes one from inspect.signature
            cls.__doc__ = cls.__name__
        for name, method in _METHODS.items():
            if name not in cls.__dict__:
                setattr(cls, name, method)
        # frozen=False and eq=False: dataclass then leaves the methods above (and __hash__) alone.
        cls = dataclass(cls, init=False, repr=False, eq=False)
        record_fields = fields(cls)
        if any(not f.init for f in record_fields):
            raise TypeError(f"{cls.__name__}: every field of a record is set by __init__")
        cls.__record_init__ = tuple((f.name, f.default, f.default_factory) for f in record_fields)
        cls.__record_kw_only__ = kw_only
        cls.__record_repr__ = tuple(f.name for f in record_fields if f.repr)
        cls.__record_compare__ = tuple(f.name for f in record_fields if f.compare)
        return cls

    return wrap if cls is None else wrap(cls)


def _init(self, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    spec = cls.__record_init__
    if args:
        if cls.__record_kw_only__:
            raise TypeError(f"{cls.__name__}() takes keyword arguments only")
        if len(args) > len(spec):
            raise TypeError(f"{cls.__name__}() takes {len(spec)} arguments but {len(args)} were given")
        for (name, _, _), value in zip(spec, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
            kwargs[name] = value
    for name, default, default_factory in spec:
        if name in kwargs:
            value = kwargs.pop(name)
        elif default is not MISSING:
            value = default
        elif default_factory is not MISSING:
            value = default_factory()
        else:
            raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
        object.__setattr__(self, name, value)
    if kwargs:
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}")


def _repr(self) -> str:
    cls = type(self)
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls.__record_repr__)
    return f"{cls.__qualname__}({shown})"


def _compared(self) -> tuple:
    return tuple(getattr(self, name) for name in type(self).__record_compare__)


def _eq(self, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self) -> int:
    return hash(_compared(self))


def _setattr(self, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


_METHODS = {"__init__": _init, "__repr__": _repr, "__eq__": _eq, "__hash__": _hash,
            "__setattr__": _setattr, "__delattr__": _delattr}
