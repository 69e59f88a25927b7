"""`trainctl.records.record`: a frozen dataclass with shared methods behaves as
`@dataclass(frozen=True)` does: construction, defaults, equality, hashing, repr, assignment,
and dataclasses' own functions."""

import copy
import dataclasses
import pickle

import pytest

from trainctl.records import record
from trainctl.site import SiteConfig, load_site


def _pair(**params):
    """The same class made by `record` and by `dataclass(frozen=True, ...)`."""

    def body():
        class Table:
            name: str
            size: int = 3
            tags: tuple[str, ...] = ()
            extra: dict[str, str] = dataclasses.field(default_factory=dict, metadata={"doc": "extra"})
        return Table

    kw_only = params.get("kw_only", True)
    return record(kw_only=kw_only)(body()), dataclasses.dataclass(frozen=True, kw_only=kw_only)(body())


@pytest.mark.parametrize("kw_only", [True, False])
def test_a_record_is_built_compared_and_printed_as_a_frozen_dataclass(kw_only):
    ours, theirs = _pair(kw_only=kw_only)
    a, b = ours(name="x", tags=("t",)), theirs(name="x", tags=("t",))
    assert repr(a).replace("_pair.<locals>.body.<locals>.", "") == repr(b).replace(
        "_pair.<locals>.body.<locals>.", "")
    expected = {"name": "x", "size": 3, "tags": ("t",), "extra": {}}
    assert dataclasses.asdict(a) == dataclasses.asdict(b) == expected
    assert a == ours(name="x", tags=("t",)) and a != ours(name="y", tags=("t",)) and a != b
    assert a.extra is not ours(name="x").extra          # default_factory: a new dict each time
    assert [f.metadata.get("doc") for f in dataclasses.fields(a)] == [None, None, None, "extra"]
    assert dataclasses.replace(a, size=5).size == 5 and a.size == 3
    assert copy.deepcopy(a) == a and copy.deepcopy(a) is not a


def test_a_record_hashes_its_fields_as_a_frozen_dataclass_does():
    ours, theirs = _pair()
    assert hash(ours(name="x", extra=None)) == hash(ours(name="x", extra=None))
    for cls in (ours, theirs):
        with pytest.raises(TypeError, match="unhashable"):
            hash(cls(name="x"))                           # a dict field, as dataclass's own hash


def test_a_record_refuses_assignment_and_deletion():
    ours, _ = _pair()
    item = ours(name="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.size = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        del item.size
    assert item.size == 3


def test_a_record_refuses_what_dataclass_refuses():
    ours, _ = _pair()
    with pytest.raises(TypeError, match="missing required argument: 'name'"):
        ours()
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        ours(name="x", colour="red")
    with pytest.raises(TypeError, match="keyword arguments only"):
        ours("x")
    positional, _ = _pair(kw_only=False)
    assert positional("x", 4).size == 4
    with pytest.raises(TypeError, match="multiple values for argument 'name'"):
        positional("x", name="y")
    with pytest.raises(TypeError, match="takes 4 arguments but 5 were given"):
        positional("x", 1, (), {}, 5)


def test_a_loaded_site_pickles_and_compares():
    site = load_site("local-demo").config
    assert isinstance(site, SiteConfig) and pickle.loads(pickle.dumps(site)) == site
    assert site != dataclasses.replace(site, name="other")
