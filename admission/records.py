"""Records: the immutable (or plain) data classes fleet and the provider admission declare
by the dozen, made at a small part of a dataclass's cost at import.

Why not `dataclasses`. A dataclass writes the source of each method it adds and compiles
it at import: `__init__`, `__repr__`, `__eq__`, `__hash__`, and for a frozen class
`__setattr__` and `__delattr__`, six `exec` calls a class; importing `dataclasses` also
imports `inspect` (with `ast` and `dis`). An `Executor()` makes ~70 classes before its
first result: ~40 ms of CPU on the start's critical path, and ~5 ms more in each of the
parent and the fork server for the imports (Python 3.11; 3.12 and 3.13 are no faster).

A record compiles only its `__init__`, once, the same code a dataclass's is, so making
one costs what it did. Its other methods are closures over its field names, built in
microseconds: `__repr__` prints the same text as a dataclass's, and a frozen record refuses
assignment and deletion with `FrozenInstanceError` (an AttributeError, as dataclasses').
`__eq__` and `__hash__` (on the tuple of the compared fields, as a dataclass's) are
compiled when first called: most classes are never compared, and the few compared on a
hot path run the same code a dataclass's do.

The functions are those of dataclasses, for records: `field`, `fields`, `replace`,
`asdict`. And a record is a dataclass to `dataclasses` itself: `is_dataclass`, `fields`,
`asdict` and `replace` of the standard library (and what reads them: pytest's diffs, a
user's `dataclasses.asdict(outcome)`) find its `__dataclass_fields__`, made the first
time one is looked for, by the module that looks and has imported dataclasses (a
record's own process never does).

What a record does not do: `order`, `unsafe_hash`, `InitVar` and `KW_ONLY` (nothing here
uses them; an InitVar is refused at class creation), nor `__dataclass_params__` (a
standard dataclass cannot subclass a record); a class without a docstring keeps none (a
dataclass writes its signature there).

This module imports only the standard library, as `admission` does.
"""
from __future__ import annotations

import copy
import reprlib

__all__ = ["FrozenInstanceError", "MISSING", "asdict", "field", "fields", "record", "replace"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: "No value given": a field without a default, a parameter not passed.
MISSING = _Missing()


class _Factory:
    """A parameter's default when its field has a `default_factory` (it prints as
    dataclasses' marker does, so a signature reads the same)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


class FrozenInstanceError(AttributeError):
    """An assignment to, or a deletion of, a field of a frozen record."""


class Field:
    """One field of a record: what `field()` declares, named and typed by `record`."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "compare", "kw_only")

    def __init__(self, default, default_factory, init: bool, repr: bool, compare: bool, kw_only):  # noqa: A002
        self.name = None
        self.type = None
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare
        self.kw_only = kw_only

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r}, init={self.init}, repr={self.repr}, "
                f"compare={self.compare}, kw_only={self.kw_only})")


def field(*, default=MISSING, default_factory=MISSING, init: bool = True, repr: bool = True,  # noqa: A002
          compare: bool = True, kw_only=MISSING) -> Field:
    """A field's declaration, as `dataclasses.field` (without `hash` and `metadata`)."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, compare, kw_only)


def fields(class_or_instance) -> tuple[Field, ...]:
    """The fields of a record type or instance, in declaration order (bases' first)."""
    try:
        return tuple(class_or_instance.__record_fields__.values())
    except AttributeError:
        raise TypeError(f"fields() takes a record type or instance, not {class_or_instance!r}") from None


def replace(obj, /, **changes):
    """A new record like `obj` with `changes`, built by its `__init__` (so `__post_init__`
    runs again), as `dataclasses.replace`."""
    for f in fields(obj):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
        elif f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def asdict(obj) -> dict:
    """`obj`'s fields as a dict, records, lists, tuples and dicts within it converted and
    everything else deep-copied, as `dataclasses.asdict`."""
    if not hasattr(type(obj), "__record_fields__"):
        raise TypeError(f"asdict() takes a record instance, not {obj!r}")
    return _plain(obj)


def _plain(obj):
    if hasattr(type(obj), "__record_fields__"):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple: rebuilt by position
        return type(obj)(*[_plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((_plain(k), _plain(v)) for k, v in obj.items())
    return copy.deepcopy(obj)


class _DataclassFields:
    """A record class's ``__dataclass_fields__``, made when first looked for: the
    `dataclasses.Field` of each field, as `dataclasses.fields`, `asdict`, `replace` and
    `is_dataclass` read them. `dataclasses` is imported then, by then already the looker's;
    each record class holds one of these, replaced by what it made (a subclass makes its own)."""

    def __get__(self, obj, cls):
        import dataclasses

        made = {}
        for f in cls.__record_fields__.values():
            d = dataclasses.field(default=dataclasses.MISSING if f.default is MISSING else f.default,
                                  default_factory=(dataclasses.MISSING if f.default_factory is MISSING
                                                   else f.default_factory),
                                  init=f.init, repr=f.repr, compare=f.compare, kw_only=f.kw_only)
            d.name, d.type, d._field_type = f.name, f.type, dataclasses._FIELD  # what dataclasses' own processing sets
            made[f.name] = d
        type.__setattr__(cls, "__dataclass_fields__", made)
        return made


def record(cls=None, /, *, frozen: bool = True, eq: bool = True, slots: bool = False, kw_only: bool = False):
    """Class decorator: `cls` made as `@dataclass(frozen=frozen, eq=eq, slots=slots,
    kw_only=kw_only)` would make it. Frozen by default, the common case here."""

    def wrap(klass):
        return _make(klass, frozen=frozen, eq=eq, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _make(cls, *, frozen: bool, eq: bool, slots: bool, kw_only: bool):
    own = cls.__dict__
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"cannot overwrite __setattr__ or __delattr__ in frozen record {cls.__qualname__}")
    for base in cls.__mro__[1:]:
        base_frozen = base.__dict__.get("__record_frozen__")
        if base_frozen is not None and base_frozen != frozen:
            raise TypeError(f"record {cls.__qualname__} (frozen={frozen}) cannot inherit "
                            f"{base.__qualname__} (frozen={base_frozen})")
    # Explicit methods of the class body stay, as with dataclasses. A body defining __eq__
    # alone has __hash__ = None put in its dict by `type`: that one is not explicit.
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    keep = {name for name in ("__init__", "__repr__", "__eq__") if name in own}
    declared = _declare(cls, kw_only)
    if slots:
        cls = _slotted(cls, declared)
    cls.__record_fields__ = declared
    cls.__record_frozen__ = frozen
    cls.__dataclass_fields__ = _DataclassFields()
    cls.__replace__ = replace  # copy.replace (Python 3.13), as a dataclass has it
    every = tuple(declared.values())
    names = tuple(declared)
    cls.__match_args__ = tuple(f.name for f in every if f.init and not f.kw_only)
    if "__init__" not in keep:
        cls.__init__ = _init(cls, every, frozen, slots)
    if "__repr__" not in keep:
        cls.__repr__ = _repr(cls, tuple(f.name for f in every if f.repr))
    if eq:
        compared = tuple(f.name for f in every if f.compare)
        if "__eq__" not in keep:
            cls.__eq__ = _eq(cls, compared)
        if not explicit_hash:
            cls.__hash__ = _hash(cls, compared) if frozen else None
    if frozen:
        cls.__setattr__, cls.__delattr__ = _frozen(cls, frozenset(names))
        if slots:  # unpickling and copy set each slot, which the frozen __setattr__ refuses
            cls.__getstate__, cls.__setstate__ = _slot_state(cls, names)
    return cls


def _declare(cls, kw_only: bool) -> dict:
    """name -> Field: the bases' records' fields, then this class's annotations (a name
    declared again keeps its place and takes the new declaration)."""
    own = cls.__dict__
    if "__annotations__" not in own and "__annotate__" in own:
        # Python 3.14 keeps a class's annotations in its dict only under `from __future__
        # import annotations` (PEP 749); without it, a record would have no fields at all
        raise TypeError(f"record {cls.__qualname__}: declare it in a module with `from __future__ import "
                        "annotations` (its fields are read from the class's own annotations)")
    declared = {}
    for base in reversed(cls.__mro__[1:]):
        declared.update(base.__dict__.get("__record_fields__", {}))
    for name, kind in own.get("__annotations__", {}).items():
        text = kind if isinstance(kind, str) else repr(kind)
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        if "InitVar" in text:
            raise TypeError(f"record {cls.__qualname__}: field {name!r} is an InitVar, which a record does not take")
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(value, MISSING, True, True, True, MISSING)
        f.name, f.type = name, kind
        if f.kw_only is MISSING:
            f.kw_only = kw_only
        if f.default is not MISSING and type(f.default).__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        if isinstance(value, Field):  # the class attribute is the default, or nothing
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        declared[name] = f
    seen_default = None
    for f in declared.values():
        if not f.init or f.kw_only:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = f.name
        elif seen_default is not None:
            raise TypeError(f"record {cls.__qualname__}: non-default argument {f.name!r} follows default argument")
    return declared


def _slotted(cls, declared: dict):
    """`cls` made again with a slot per field (its own; its bases' slots stay theirs)."""
    body = dict(cls.__dict__)
    inherited = {name for base in cls.__mro__[1:] for name in base.__dict__.get("__slots__", ())}
    body["__slots__"] = tuple(name for name in declared if name not in inherited)
    for name in declared:
        body.pop(name, None)  # a default lives in the Field: a class attribute would shadow the slot
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    made = type(cls)(cls.__name__, cls.__bases__, body)
    made.__qualname__ = cls.__qualname__
    return made


def _named(cls, fn, name: str):
    fn.__name__ = name
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    fn.__module__ = cls.__module__
    return fn


def _init(cls, every: tuple, frozen: bool, slots: bool):
    """The one method compiled: the __init__ dataclasses writes (defaults, factories,
    keyword-only fields, `__post_init__`), so a record costs what a dataclass did to make."""
    scope = {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    positional, keyword, body = [], [], []
    for f in every:
        if f.default_factory is not MISSING:
            scope[f"_factory_{f.name}"] = f.default_factory
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}" if f.init else f"_factory_{f.name}()"
            param = f"{f.name}=_FACTORY"
        elif f.default is not MISSING:
            scope[f"_default_{f.name}"] = f.default
            value = f.name if f.init else f"_default_{f.name}"
            param = f"{f.name}=_default_{f.name}"
            if not f.init and not slots:
                continue  # the class attribute is the value, as with dataclasses
        else:
            value, param = f.name, f.name
            if not f.init:
                continue  # set by __post_init__, or never
        if f.init:
            (keyword if f.kw_only else positional).append(param)
        body.append(f"_set(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    params = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    exec(f"def __init__({params}):\n    " + ("\n    ".join(body) or "pass") + "\n", scope)  # noqa: S102
    init = scope["__init__"]
    init.__annotations__ = {**{f.name: f.type for f in every if f.init}, "return": None}  # a dataclass's signature
    return _named(cls, init, "__init__")


def _repr(cls, names: tuple):
    @reprlib.recursive_repr()
    def __repr__(self):
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    return _named(cls, __repr__, "__repr__")


def _on_first_call(cls, name: str, source: str, scope: dict):
    """`cls.<name>`, compiled from `source` when first called (then in place of this one):
    a class whose instances are never compared or hashed never pays for the compilation,
    and one that is pays once, for the same code a dataclass's method is."""

    def first(self, *args):
        exec(source, scope)  # noqa: S102
        method = _named(cls, scope[name], name)
        setattr(cls, name, method)
        return method(self, *args)

    return _named(cls, first, name)


def _eq(cls, names: tuple):
    mine = "".join(f"self.{n}," for n in names)
    theirs = "".join(f"other.{n}," for n in names)
    return _on_first_call(cls, "__eq__", "def __eq__(self, other):\n"
                                         "    if other.__class__ is self.__class__:\n"
                                         f"        return ({mine}) == ({theirs})\n"
                                         "    return NotImplemented\n", {})


def _hash(cls, names: tuple):
    mine = "".join(f"self.{n}," for n in names)
    return _on_first_call(cls, "__hash__", f"def __hash__(self):\n    return hash(({mine}))\n", {})


def _frozen(cls, names: frozenset):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return _named(cls, __setattr__, "__setattr__"), _named(cls, __delattr__, "__delattr__")


def _slot_state(cls, names: tuple):
    def __getstate__(self):
        return [getattr(self, name) for name in names]

    def __setstate__(self, state):
        for name, value in zip(names, state):
            object.__setattr__(self, name, value)

    return _named(cls, __getstate__, "__getstate__"), _named(cls, __setstate__, "__setstate__")
