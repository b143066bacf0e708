"""`record_class` against `dataclasses.dataclass`: the same classes declared both ways behave the same."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from alloctrace.allocator import record_class as rc

OPTIONS = [{}, {"frozen": True}, {"eq": False}, {"slots": True}, {"eq": False, "slots": True},
           {"frozen": True, "slots": True}]


def declare(decorator, field, **options):
    @decorator(**options)
    class Point:
        """doc"""
        name: str
        x: int = 0
        tags: list = field(default_factory=list)
        note: str | None = None

        def moved(self):
            return self.x + 1
    return Point


def both(**options):
    return declare(dataclasses.dataclass, dataclasses.field, **options), declare(rc.record_class, rc.field, **options)


def state(obj) -> dict:
    return {n: getattr(obj, n) for n in ("name", "x", "tags", "note")}


def hash_of(obj):
    try:
        if type(obj).__eq__ is object.__eq__:
            return "identity", hash(obj) == object.__hash__(obj)
        return "values", hash(obj) == hash(tuple(state(obj).values()))
    except TypeError as e:
        return type(e)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_same_construction_equality_hashing_and_repr(options):
    dc, mine = both(**options)
    for args, kwargs in [(("a",), {}), (("a", 3), {"note": "n"}), ((), {"name": "b", "tags": [1]}),
                         (("a", 1, [2], "z"), {})]:
        d, m = dc(*args, **kwargs), mine(*args, **kwargs)
        assert state(d) == state(m)
        assert repr(d).replace(dc.__qualname__, "P") == repr(m).replace(mine.__qualname__, "P")
        twin_d, twin_m = dc(*args, **kwargs), mine(*args, **kwargs)
        assert (d == twin_d) == (m == twin_m)
        assert (d == dc("other")) == (m == mine("other"))
        assert (m == object()) is False
        hashable = (type(d).__hash__ is not None, type(m).__hash__ is not None)
        assert hashable[0] == hashable[1]
        assert hash_of(d) == hash_of(m)  # a frozen record hashes its values (unhashable: a list among them)
        assert m.moved() == d.moved()


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_defaults_made_per_instance_and_missing_arguments_refused(options):
    dc, mine = both(**options)
    a, b = mine("a"), mine("b")
    assert a.tags == [] and a.tags is not b.tags
    for cls in (dc, mine):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls("a", nope=1)
        with pytest.raises(TypeError):
            cls("a", 1, [], None, "too many")


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_frozen_slots_and_replace(options):
    dc, mine = both(**options)
    d, m = dc("a", 2), mine("a", 2)
    if options.get("frozen"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.x = 3
        with pytest.raises(AttributeError):
            m.x = 3
        with pytest.raises(rc.FrozenInstanceError):
            del m.x
    else:
        m.x = d.x = 3
        assert m.x == d.x == 3
    assert hasattr(m, "__dict__") == hasattr(d, "__dict__")
    assert state(rc.replace(m, note="r")) == state(dataclasses.replace(d, note="r"))
    with pytest.raises(TypeError):
        rc.replace(m, nope=1)
    assert rc.fields(mine) == tuple(f.name for f in dataclasses.fields(dc))
    assert hasattr(mine, "tags") == hasattr(dc, "tags") and hasattr(mine, "x") == hasattr(dc, "x")


def test_post_init_runs_after_the_fields_and_through_replace():
    @rc.record_class
    class Sized:
        n: int
        twice: int = 0

        def __post_init__(self):
            self.twice = 2 * self.n
    assert Sized(4).twice == 8 and rc.replace(Sized(4), n=5).twice == 10


def test_a_field_without_default_after_one_with_is_refused_as_dataclasses_does():
    with pytest.raises(TypeError):
        @dataclasses.dataclass
        class D:
            a: int = 0
            b: int
    with pytest.raises(TypeError):
        @rc.record_class
        class R:
            a: int = 0
            b: int


def test_the_converted_classes_still_pickle_and_compare():
    """The records a reading child sends back are pickled."""
    from alloctrace.allocator.events import Event
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta

    ev = Event("alloc", graph=1, tensor="t", size=64, extra={"k": 1})
    g = GraphRecord(0, "reserve", [ev], max_size=64)
    meta = TraceMeta("n", "record", tags=["a=b"])
    for obj in (ev, g, meta):
        back = pickle.loads(pickle.dumps(obj))
        assert back == obj and back is not obj
    assert Event("alloc", size=1) != Event("alloc", size=2)
