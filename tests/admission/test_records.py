"""`record` behaves as the dataclass it replaces: each case builds the same class both ways
and compares what a user of the class can see."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import pathlib
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from admission import records
from admission.records import FrozenInstanceError, field, record

ROOT = pathlib.Path(__file__).resolve().parents[2]


def twins(body: dict, dc: dict, rec: dict, name: str = "Point"):
    """The class `body` made by @dataclass(**dc) and by @record(**rec), both named `name`."""
    annotations = body.pop("__annotations__")
    made = []
    for decorate, declare in ((dataclass(**dc), dataclasses.field), (record(**rec), field)):
        attrs = {k: (declare(**v) if isinstance(v, dict) else v) for k, v in body.items()}  # a dict: a field()
        made.append(decorate(type(name, (), {"__annotations__": dict(annotations), "__qualname__": name,
                                            "__module__": __name__, **attrs})))
    return made


POINT = {"__annotations__": {"x": int, "y": int, "tags": list, "label": str},
         "tags": {"default_factory": list}, "label": "p"}


@pytest.mark.parametrize("slots", [False, True])
def test_a_frozen_record_is_the_frozen_dataclass(slots):
    D, R = twins(dict(POINT), {"frozen": True, "slots": slots}, {"slots": slots})
    d, r = D(1, 2), R(1, 2)
    assert repr(r) == repr(d) == "Point(x=1, y=2, tags=[], label='p')"
    assert R(1, 2, [3], label="q") == R(1, 2, [3], "q") != R(1, 2)
    assert R(1, 2) != D(1, 2)  # another class, as between two dataclasses
    assert hash(R(1, 2, (), "a")) == hash(D(1, 2, (), "a")) == hash((1, 2, (), "a"))
    assert R(1, 2).tags is not R(1, 2).tags  # a fresh default from the factory each time
    assert str(inspect.signature(R)) == str(inspect.signature(D))
    for obj in (d, r):
        with pytest.raises(AttributeError, match="cannot assign to field 'x'"):
            obj.x = 5
        with pytest.raises(AttributeError, match="cannot delete field 'y'"):
            del obj.y
    with pytest.raises(FrozenInstanceError):
        r.other = 1  # not a field: refused too, as the dataclass refuses it
    with pytest.raises(TypeError):
        R(1)  # y is required


@record
class Plain:
    x: int
    y: int
    tags: list = field(default_factory=list)
    label: str = "p"


@record(slots=True)
class Slotted:
    x: int
    y: int
    tags: list = field(default_factory=list)
    label: str = "p"


@pytest.mark.parametrize("R", [Plain, Slotted])
def test_a_record_works_with_dataclasses_functions_pickle_and_copy(R):
    r = R(1, 2, [3])
    assert [f.name for f in records.fields(R)] == [f.name for f in records.fields(r)] == ["x", "y", "tags", "label"]
    assert records.asdict(r) == {"x": 1, "y": 2, "tags": [3], "label": "p"}
    assert records.asdict(r)["tags"] is not r.tags  # copied, as dataclasses.asdict copies
    assert records.replace(r, y=9) == R(1, 9, [3])
    for back in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert back == r and type(back) is R
    assert Slotted.__slots__ == ("x", "y", "tags", "label") and not hasattr(Slotted(1, 2), "__dict__")


def test_a_mutable_record_is_the_mutable_dataclass():
    D, R = twins(dict(POINT), {}, {"frozen": False})
    r = R(1, 2)
    r.x = 7
    assert r == R(7, 2) and repr(r) == repr(D(7, 2))
    assert R.__hash__ is None is D.__hash__  # eq without frozen: unhashable, as a dataclass
    D2, R2 = twins(dict(POINT), {"eq": False}, {"frozen": False, "eq": False})
    assert R2(1, 2) != R2(1, 2) and hash(R2(1, 2)) != 0  # identity, as object's


def test_defaults_keyword_only_post_init_and_uninitialised_fields():
    seen = []

    def post(self):
        seen.append(self)
        object.__setattr__(self, "total", self.a + self.b)

    body = {"__annotations__": {"a": int, "b": int, "total": int, "note": str},
            "b": 10, "total": {"init": False, "repr": False, "compare": False},
            "note": {"default": "n", "kw_only": True}, "__post_init__": post}
    D, R = twins(body, {"frozen": True}, {})
    r = R(1, note="m")
    assert (r.a, r.b, r.total, r.note) == (1, 10, 11, "m") and seen == [r]
    assert repr(r) == repr(D(1, note="m")).replace("Point", "Point")
    assert str(inspect.signature(R)) == str(inspect.signature(D)) == "(a: int, b: int = 10, *, note: str = 'n') -> None"
    with pytest.raises(TypeError):
        R(1, 2, "m")  # note is keyword-only
    assert R(1) == R(1, 10) and hash(R(1)) == hash(D(1))


def test_an_init_false_field_with_a_default_has_it_in_every_shape():
    for slots in (False, True):
        _, R = twins({"__annotations__": {"a": int, "k": int}, "k": {"default": 4, "init": False}},
                     {"frozen": True}, {"slots": slots})
        assert R(1).k == 4 and R(1) == R(1)


def test_a_class_body_keeps_its_own_methods():
    body = {"__annotations__": {"a": int}, "__repr__": lambda self: "mine", "__eq__": lambda self, o: True}
    _, R = twins(body, {"frozen": True}, {})
    assert repr(R(1)) == "mine" and R(1) == R(2) and hash(R(1)) == hash((1,))
    _, R = twins({"__annotations__": {"a": int}, "__hash__": lambda self: 42}, {"frozen": True}, {})
    assert hash(R(1)) == 42


def test_what_a_record_refuses():
    with pytest.raises(TypeError, match="cannot overwrite __setattr__"):
        record(type("Bad", (), {"__annotations__": {"a": int}, "__setattr__": object.__setattr__}))
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        record(type("Bad", (), {"__annotations__": {"a": int, "b": int}, "a": 1}))
    with pytest.raises(TypeError, match="InitVar"):
        record(type("Bad", (), {"__annotations__": {"a": "dataclasses.InitVar[int]"}}))
    with pytest.raises(TypeError, match="from __future__ import annotations"):
        # a class body's lazy annotations (Python 3.14 without the future import): not read as none
        record(type("Lazy", (), {"__annotate__": lambda fmt: {"a": int}}))
    Frozen = record(type("Frozen", (), {"__annotations__": {"a": int}}))
    with pytest.raises(TypeError, match=r"frozen=False\) cannot inherit Frozen \(frozen=True\)"):
        record(frozen=False)(type("Thawed", (Frozen,), {"__annotations__": {"b": int}}))


def test_a_subclass_record_adds_fields_and_stays_frozen():
    Base = record(type("Base", (), {"__annotations__": {"a": int}}))
    Sub = record(type("Sub", (Base,), {"__annotations__": {"b": int}, "b": 2}))
    s = Sub(1)
    assert (s.a, s.b) == (1, 2) and s != Base(1) and repr(s) == "Sub(a=1, b=2)"
    with pytest.raises(FrozenInstanceError):
        s.a = 3


def test_replace_and_asdict_as_dataclasses_do():
    Inner = record(type("Inner", (), {"__annotations__": {"v": list}}))
    Outer = record(type("Outer", (), {"__annotations__": {"inner": Inner, "items": tuple, "k": int},
                                      "k": field(default=0, init=False)}))
    o = Outer(Inner([1]), (Inner([2]), 3))
    assert records.asdict(o) == {"inner": {"v": [1]}, "items": ({"v": [2]}, 3), "k": 0}
    with pytest.raises(ValueError, match="init=False"):
        records.replace(o, k=1)
    with pytest.raises(TypeError):
        records.replace(o, nope=1)
    with pytest.raises(TypeError, match="record"):
        records.fields(object())
    with pytest.raises(TypeError, match="record"):
        records.asdict({"a": 1})
    with pytest.raises(ValueError, match="mutable default <class 'list'> for field a"):
        record(type("Bad", (), {"__annotations__": {"a": list}, "a": []}))
    with pytest.raises(ValueError, match="both default and default_factory"):
        field(default=1, default_factory=int)


def test_class_variables_are_not_fields():
    R = record(type("R", (), {"__annotations__": {"a": int, "LIMIT": "ClassVar[int]"}, "LIMIT": 3}))
    assert [f.name for f in records.fields(R)] == ["a"] and R(1).LIMIT == 3 and R.__match_args__ == ("a",)


@pytest.mark.parametrize("R", [Plain, Slotted])
def test_a_record_is_a_dataclass_to_the_standard_library(R):
    """A user's `dataclasses.asdict(exc.outcome)` (fleet.Outcome is a record) works as it did."""
    r = R(1, 2, [3])
    assert dataclasses.is_dataclass(R) and dataclasses.is_dataclass(r)
    assert [f.name for f in dataclasses.fields(r)] == ["x", "y", "tags", "label"]
    assert dataclasses.asdict(r) == records.asdict(r) and dataclasses.astuple(r) == (1, 2, [3], "p")
    assert dataclasses.replace(r, label="q") == R(1, 2, [3], "q")
    tags = dataclasses.fields(R)[2]
    assert tags.default_factory is list and tags.default is dataclasses.MISSING and tags.init


def test_a_subclass_has_its_own_dataclass_fields_whoever_was_looked_at_first():
    Base = record(type("Base", (), {"__annotations__": {"a": int}}))
    Sub = record(type("Sub", (Base,), {"__annotations__": {"b": int}, "b": 2}))
    assert [f.name for f in dataclasses.fields(Base)] == ["a"]
    assert [f.name for f in dataclasses.fields(Sub)] == ["a", "b"]
    assert dataclasses.replace(Sub(1), a=5) == Sub(5, 2)


def test_records_never_import_dataclasses_themselves():
    code = ("import sys\n"
            "from admission.records import record, replace, asdict, fields\n"
            "from fleet.rules.unit import Outcome\n"
            "R = record(type('R', (), {'__annotations__': {'a': int}}))\n"
            "r = replace(R(1), a=2)\n"
            "assert r == R(2) and hash(r) == hash(R(2)) and asdict(r) == {'a': 2} and repr(r) == 'R(a=2)'\n"
            "print('dataclasses' in sys.modules, 'inspect' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_fleet_and_admission_declare_records_not_dataclasses():
    """A dataclass costs six compilations at import, and `dataclasses` brings `inspect`:
    on a start's critical path (docs/executor.md, "What a boot costs"), so the packages
    declare records and never import dataclasses (admission/records.py does, for a module
    that looks for a record's dataclass fields: `test_records_never_import_dataclasses_themselves`)."""
    found = []
    for path in [*(ROOT / "fleet").rglob("*.py"), *(ROOT / "admission").rglob("*.py")]:
        if path == ROOT / "admission" / "records.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(@(dataclasses\.)?dataclass\b|import dataclasses\b|from dataclasses import)", line):
                found.append(f"{path.relative_to(ROOT)}:{n}")
    assert found == []
