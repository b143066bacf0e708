"""`@record_class`: the part of `@dataclasses.dataclass` the classes on `record`'s path use, at a fraction of
its start-up cost.

`record` of a dry run that takes 12 ms spends most of its own time importing, and `dataclasses` is the
largest piece: importing it loads `inspect` (with `ast`, `dis`, `tokenize`), and each class it makes compiles
three or four methods from text. A class here gets one compiled `__init__`; equality, hashing, the frozen
guard and `repr` are shared functions over the class's field names. Same semantics for what these classes
use: fields from the annotations in order, defaults, `field(default_factory=...)`, `__post_init__`, `eq`
(and `__hash__ = None` when not frozen), `frozen` (hashable, assignment raises FrozenInstanceError),
`slots`, `replace()`, `fields()`. tests/allocator/test_record_class.py holds it against `dataclasses`.
"""
from __future__ import annotations

MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record (as dataclasses.FrozenInstanceError)."""


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def field(*, default_factory):
    """A field whose default is made per instance (`field(default_factory=list)`)."""
    return _Factory(default_factory)


def fields(cls_or_record) -> tuple[str, ...]:
    """The field names, in order."""
    return cls_or_record.__record_fields__


def replace(record, **changes):
    """A copy of `record` with `changes`, made through `__init__` (so `__post_init__` runs), as
    dataclasses.replace."""
    values = {name: getattr(record, name) for name in record.__record_fields__}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(record)(**values)


def record_class(cls=None, /, *, frozen: bool = False, eq: bool = True, slots: bool = False):
    """Make `cls` a record class (see the module); used as `@record_class` or `@record_class(frozen=True)`."""
    def make(cls):
        return _make(cls, frozen, eq, slots)
    return make if cls is None else make(cls)


def _make(cls, frozen: bool, eq: bool, slots: bool):
    names = tuple(cls.__dict__.get("__annotations__", {}))
    defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    if slots:
        body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
        body["__slots__"] = names
        cls = type(cls)(cls.__name__, cls.__bases__, body)
    else:
        for n, d in defaults.items():
            if isinstance(d, _Factory):
                delattr(cls, n)  # as dataclasses: no class attribute for a per-instance default
    cls.__record_fields__ = names
    cls.__init__ = _init(cls, names, defaults, frozen)
    if "__repr__" not in cls.__dict__:
        cls.__repr__ = _repr
    if eq:
        cls.__eq__ = _eq
        cls.__hash__ = _hash if frozen else None
    if frozen:
        cls.__setattr__ = _refuse
        cls.__delattr__ = _refuse
    return cls


def _init(cls, names: tuple, defaults: dict, frozen: bool):
    """One compiled `__init__` taking the fields as a dataclass's does (positional or by keyword)."""
    params, lines, scope = [], [], {"MISSING": MISSING, "setter": object.__setattr__}
    defaulted = False
    for n in names:
        d = defaults.get(n, MISSING)
        if d is MISSING:
            if defaulted:
                raise TypeError(f"{cls.__name__}: field {n!r} without a default follows one with a default")
            params.append(n)
            value = n
        elif isinstance(d, _Factory):
            defaulted = True
            scope[f"_f_{n}"] = d.make
            params.append(f"{n}=MISSING")
            value = f"_f_{n}() if {n} is MISSING else {n}"
        else:
            defaulted = True
            scope[f"_d_{n}"] = d
            params.append(f"{n}=_d_{n}")
            value = n
        lines.append(f"setter(self, {n!r}, {value})" if frozen else f"self.{n} = {value}")
    if hasattr(cls, "__post_init__"):
        lines.append("self.__post_init__()")
    src = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(lines or ["pass"])
    exec(src, scope)  # noqa: S102: text made here from the class's own field names
    fn = scope["__init__"]
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    return fn


def _values(self) -> tuple:
    return tuple(getattr(self, n) for n in self.__record_fields__)


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self):
    return hash(_values(self))


def _repr(self):
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__record_fields__)
    return f"{type(self).__qualname__}({inner})"


def _refuse(self, name, value=None):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")
