"""An op, all of it in one class, and the registry every face is made from.

An op's halves, in its class:

* **its one signature, and its loop half**: `on_loop(self, sup, ...)` runs on the
  supervisor's loop (the one owner of the state, `fleet.runtime.loop.Supervisor.call`)
  and works on the components it names; or `run(self, sup, ...)` runs on the caller's
  thread (by default it posts `on_loop`). Their parameters after ``sup`` are the op's
  signature everywhere: the façade's method (`Operations`), `fleet.Fleet`'s (when
  ``fleet = True``), `fleet.Client`'s. fleetd's served half, where it adds to the
  façade, is `on_daemon(self, daemon, ...)`;
* **the wire**: ``name``, ``mutating``, ``blocking``, ``summary``, ``schema``, `check`;
  `call_args` and `reply` turn a request's arguments into the façade's and its result
  into the reply (`execute`); an op the wire does not carry says why in ``no_wire``;
* **the client's half**: `wire_args` and `result` (the caller's arguments into the
  request's, the reply into what the method returns), under ``method`` (or None, with
  ``no_method``);
* **fleetctl's half**: ``command``, `add_arguments`, `from_cli`, `cli_call`, `render`,
  `exit_code` (or None, with ``no_command``).

`OpRegistry` holds them (`OPS`, `fleet.service.control.ops`): the server and the client
look ops up by name, fleetctl makes its commands of them, and `Operations` (the façade
over a supervisor), `ServedOperations` (fleetd's), `fleet.Client`'s and `fleet.Fleet`'s
operator methods are made from them. Adding an op is one class in one module of this
package.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from fleet.rules.errors import EXIT_OK
from fleet.service.control.errors import E_INVALID_ARGS, E_INVALID_REPLY, E_UNKNOWN_OP, ProtocolError
from fleet.service.control.terminal import fields_text
from fleet.service.control.wire import Arg, check_args

#: The words of fleetctl's command groups and their help (a group's commands are ops).
COMMAND_GROUPS = {
    "posture": "Show the cordon posture and its thresholds, retune them, or release a sticky cause on the "
               "running fleet.",
    "admission": "Show the provider admission's bulkheads, closures and starving list; close or reopen a "
                 "provider or key.",
}


class Op:
    """One command, all of it: subclass, set the class attributes, register in `OPS`
    (see the module docstring for the halves)."""

    name: ClassVar[str]
    mutating: ClassVar[bool] = False
    #: A blocking op waits for an event (a long poll). Its `execute` must return a
    #: Future at once instead of a value; the daemon dispatches it off the main loop.
    blocking: ClassVar[bool] = False
    #: A direct op's served half touches only state that any thread may call (the
    #: supervisor's submitter, the outcome store, the replays): fleetd runs it on the
    #: control server's thread, not through its loop (`with_blocking_ops`).
    direct: ClassVar[bool] = False
    #: A streaming op's served half is given its connection's push side (``stream``,
    #: a `fleet.service.control.Stream`, or None off a connection) to write to unasked.
    streams: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    schema: ClassVar[Mapping[str, Arg]] = {}
    #: Why the control protocol does not carry it ("": it does).
    no_wire: ClassVar[str] = ""

    command: ClassVar[tuple[str, ...] | None] = None
    no_command: ClassVar[str] = ""
    #: fleetctl's help for the command (default: ``summary``); ``description`` its longer text.
    help: ClassVar[str] = ""
    description: ClassVar[str] = ""

    method: ClassVar[str | None] = ""  # "" : named after the op
    no_method: ClassVar[str] = ""
    #: `fleet.Fleet` has the method too (the embedded fleet's operator methods).
    fleet: ClassVar[bool] = False
    #: The loop half only reads: it may read what a stopped loop left (a change to a
    #: stopped fleet raises FleetClosed).
    view: ClassVar[bool] = False

    def __init__(self):
        if self.method == "":
            self.method = self.name
        self.half = _half(type(self))
        self.signature = None if self.half is None else _after_first(inspect.signature(self.half))
        self.doc = inspect.getdoc(self.half) if self.half is not None and self.half.__doc__ else self.summary

    @property
    def wire(self) -> bool:
        return not self.no_wire

    # -- the caller's half (the façade's method; by default its loop half, posted)
    def run(self, sup, *args: Any, **kwargs: Any) -> Any:
        return sup.call(functools.partial(self.on_loop, sup, *args, **kwargs), view=self.view)

    # -- client half
    def to_wire(self, **args: Any) -> dict[str, Any]:
        """Build the request's args from a caller's keyword arguments (checked locally)."""
        self.validate(args)
        return args

    def wire_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The request's arguments from the caller's (bound to the op's signature)."""
        return args

    def result(self, reply: Any, args: dict[str, Any]) -> Any:
        """What the client's method returns for the reply."""
        return reply

    def client(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The `fleet.Client` method's body: ``call(**wire_args)`` sends the op and returns
        its reply."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        return self.result(call(**self.wire_args(given)), given)

    # -- fleetctl half
    def add_arguments(self, parser) -> None:
        """The command's own arguments (an argparse parser)."""

    def from_cli(self, args) -> dict[str, Any]:
        """The wire arguments from the parsed command line."""
        return {}

    def cli_call(self, call: Callable[..., Any], args) -> Any:
        """What fleetctl's command does with the daemon: ``call(op_name, **wire)`` sends an op
        and returns its reply. By default this op once, with `from_cli`'s arguments; a
        command that waits on the daemon (``drain --wait``) calls more."""
        return call(self.name, **self.from_cli(args))

    def render(self, result: Any, args) -> str:
        """The reply as text for a terminal."""
        return fields_text(result)

    def exit_code(self, result: Any) -> int:
        """fleetctl's exit code for a reply (an error reply exits with its error's code)."""
        return EXIT_OK

    # -- daemon half
    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Schema check plus `check`; returns the normalized args `execute` receives."""
        checked = check_args(self.name, self.schema, args)
        self.check(checked)
        return checked

    def check(self, args: dict[str, Any]) -> None:
        """Op-specific checks beyond types; may normalize ``args`` in place."""

    def take_fds(self, args: dict[str, Any], fds: list[int]) -> list:
        """Claim the file descriptors that came with the request (checked ``args``): the
        `fleet.service.control.fds.Mapped` the call holds until it ends. This op claims none:
        InvalidArgs. Owns ``fds``: on any refusal every one of them is closed."""
        if not fds:
            return []
        from fleet.service.control.fds import close_all

        close_all(fds)
        raise self.bad(f"it carries no file descriptors; the frame brought {len(fds)}")

    def claim_reply_fds(self, result: Any, fds: list[int]) -> None:
        """The client half's: claim the file descriptors that came with this op's reply
        (mapped into ``result`` in place). This op's replies carry none: ProtocolError
        (InvalidReply). Owns ``fds``: every one is closed on a refusal."""
        if not fds:
            return
        from fleet.service.control.fds import close_all

        close_all(fds)
        raise ProtocolError(E_INVALID_REPLY, f"{self.name}: its reply carries no file descriptors; the frame "
                                             f"brought {len(fds)}")

    def call_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The façade method's keyword arguments from the request's (checked) arguments."""
        return args

    def reply(self, value: Any, args: dict[str, Any]) -> Any:
        """The reply (JSON) for what the façade method returned."""
        return value

    def execute(self, handler, args: dict[str, Any]) -> Any:
        """Run against the handler (the façade, or fleetd's served operations); called on
        the thread that owns the state."""
        return self.reply(getattr(handler, self.name)(**self.call_args(args)), args)

    def bad(self, message: str) -> ProtocolError:
        """The InvalidArgs error naming this op."""
        return ProtocolError(E_INVALID_ARGS, f"{self.name}: {message}")


def _half(cls) -> Callable | None:
    """The method that states an op's signature: its `run` when it has its own, else its
    `on_loop`, else its `on_daemon`; None for an op of the wire alone."""
    if cls.run is not Op.run:
        return cls.run
    return getattr(cls, "on_loop", None) or getattr(cls, "on_daemon", None)


def _after_first(signature: inspect.Signature) -> inspect.Signature:
    """`signature` without ``self`` and the half's first argument (the supervisor, the daemon)."""
    return signature.replace(parameters=list(signature.parameters.values())[2:])


def _with_self(signature: inspect.Signature) -> inspect.Signature:
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return signature.replace(parameters=[self_param, *signature.parameters.values()])


def _named(fn, name: str, op: Op, owner: str):
    fn.__name__ = name
    fn.__qualname__ = f"{owner}.{name}"
    fn.__signature__ = _with_self(op.signature)
    fn.__doc__ = op.doc
    return fn


class OpRegistry:
    """Op name -> op instance. The client, the server and fleetctl look ops up here; the
    façade, the served operations and the faces' operator methods are made from it."""

    def __init__(self, ops: Iterable[type[Op]] = ()):
        self._ops: dict[str, Op] = {}
        for op in ops:
            self.register(op)

    def register(self, op_cls: type[Op]) -> type[Op]:
        """Add an op class (usable as a class decorator). A duplicate name, or a second op
        with the same fleetctl command or client method, is an error."""
        op = op_cls()
        if op.name in self._ops:
            raise ValueError(f"op {op.name!r} is already registered")
        for other in self._ops.values():
            if op.command is not None and other.command == op.command:
                raise ValueError(f"op {op.name!r}: fleetctl {' '.join(op.command)} is op {other.name!r} already")
            if op.method is not None and other.method == op.method:
                raise ValueError(f"op {op.name!r}: client method {op.method} is op {other.name!r} already")
        if op.command is None and not op.no_command:
            raise ValueError(f"op {op.name!r} has no fleetctl command: say why in no_command")
        if op.method is None and not op.no_method:
            raise ValueError(f"op {op.name!r} has no client method: say why in no_method")
        if (op.method is not None or op.fleet) and op.signature is None:
            raise ValueError(f"op {op.name!r} has a method but no signature: give it on_loop, run or on_daemon")
        self._ops[op.name] = op
        return op_cls

    def get(self, name: str) -> Op:
        """The op of the wire called ``name``; ProtocolError(UnknownOp) listing the known ones if none."""
        op = self._ops.get(name)
        if op is None or not op.wire:
            raise ProtocolError(E_UNKNOWN_OP, f"unknown op {name!r} (known: {', '.join(self.names())})")
        return op

    def names(self) -> list[str]:
        """The ops of the wire, by name."""
        return sorted(name for name, op in self._ops.items() if op.wire)

    def __contains__(self, name: object) -> bool:
        op = self._ops.get(name)  # type: ignore[arg-type]
        return op is not None and op.wire

    def commands(self) -> list[Op]:
        """The ops fleetctl has a command for, in the order they were registered."""
        return [op for op in self._ops.values() if op.command is not None]

    # -- what the faces are made of
    def client_methods(self) -> dict[str, Callable[..., Any]]:
        """Method name -> function, for a class with ``_call(op_name, **args)`` (`fleet.Client`):
        each calls its op's `client` with the op's ``call``, under the op's signature."""
        return {op.method: self._client_method(op) for op in self._ops.values() if op.method is not None}

    @staticmethod
    def _client_method(op: Op) -> Callable[..., Any]:
        name = op.name

        def method(self, *args: Any, **kwargs: Any) -> Any:
            return op.client(functools.partial(self._call, name), *args, **kwargs)

        return _named(method, op.method, op, "Client")

    def facade(self) -> type:
        """`Operations`: the façade over a `fleet.runtime.loop.Supervisor`, a method per op
        with a caller's or loop half (named after the op), each run as the op says."""
        methods = {"__init__": _facade_init, "__doc__": _FACADE_DOC}
        for op in self._ops.values():
            if op.half is not None and op.half.__name__ in ("run", "on_loop"):
                methods[op.name] = _named(_facade_method(op), op.name, op, "Operations")
        return type("Operations", (), methods)

    def served(self, facade: type) -> type:
        """`ServedOperations`: fleetd's control handler, `facade` with the ops' served halves
        (`on_daemon`: what only a served fleet has, or adds)."""
        methods = {"__init__": _served_init, "__doc__": _SERVED_DOC}
        for op in self._ops.values():
            if getattr(op, "on_daemon", None) is not None:
                methods[op.name] = _named(_served_method(op), op.name, op, "ServedOperations")
        return type("ServedOperations", (facade,), methods)

    def fleet_methods(self, cls: type) -> type:
        """Give ``cls`` (`fleet.Fleet`, whose ``operations`` is the façade) the method of
        every op with ``fleet = True``, under the op's client method name and signature."""
        for op in self._ops.values():
            if not op.fleet:
                continue
            if op.method in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{op.method} is written by hand and made from op {op.name} too")
            setattr(cls, op.method, _named(_fleet_method(op), op.method, op, cls.__name__))
        return cls

    def client_class(self, cls: type) -> type:
        """Give ``cls`` (`fleet.Client`) a method for every op with one (`client_methods`)."""
        for name, method in self.client_methods().items():
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{name} is written by hand and made from op too")
            method.__qualname__ = f"{cls.__name__}.{name}"
            setattr(cls, name, method)
        return cls


_FACADE_DOC = """The operator ops a fleet offers, over its supervisor: each op's caller's half runs
here, and its loop half as a command on the supervisor's loop (the one owner of the
state). Every method returns JSON-serializable values; a bad argument raises the typed
FleetError its rule raises, and changes nothing."""

_SERVED_DOC = """fleetd's control handler: the fleet's operations (`Operations`, as the embedded
Fleet has them), with what only fleetd adds: its own section of the status, and its
clients' ``submit`` and ``collect``. Runs on the daemon's loop."""


def _facade_init(self, supervisor) -> None:
    self._sup = supervisor


def _served_init(self, daemon) -> None:
    self._sup = daemon.sup
    self._daemon = daemon


def _facade_method(op: Op):
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return op.run(self._sup, *args, **kwargs)

    return method


def _served_method(op: Op):
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return op.on_daemon(self._daemon, *args, **kwargs)

    return method


def _fleet_method(op: Op):
    name = op.name

    def method(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.operations, name)(*args, **kwargs)

    return method


def in_range(op: Op, name: str, value: Any, within) -> None:
    """InvalidArgs naming the argument, its value and its range (fleet.rules.ranges) unless
    `value` is None (not given) or in the range. JSON's 1e400 arrives as inf: refused."""
    if value is not None and not within.holds(value):
        raise op.bad(f"{name} {within.problem(value)}")


#: The registry of fleet's ops (each module of this package registers its own).
OPS = OpRegistry()
