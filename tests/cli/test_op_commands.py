"""Every op of the registry is where it says it is, and nothing else is: its fleetctl
command (or the reason it has none) and its `fleet.Client` method (or the reason it has
none), and no fleetctl command that calls the daemon or Client method that sends an op
without an op behind it. Derived from the registry, so a new op is held to it at once."""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import io

import pytest

from fleet.cli import fleetctl, opcommands, views
from fleet.api.client import Client
from fleet.service.control.ops import OPS, Op, OpRegistry
from fleet.service.control.wire import Arg

#: Client's own API, not ops: the Executor's and the closing of the client itself.
CLIENT_OWN = {"submit", "map", "map_unordered", "shutdown", "close"}


def leaves(parser: argparse.ArgumentParser, words=()):
    """(words, leaf parser) for every command of ``parser``'s subcommand tree."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield tuple(words), parser
        return
    for word, child in subs[0].choices.items():
        yield from leaves(child, (*words, word))


def daemon_commands() -> dict[tuple[str, ...], Op]:
    """fleetctl's commands that call the daemon: words -> the op their run sends."""
    found = {}
    for words, parser in leaves(fleetctl.build_parser()):
        run = parser.get_default("_run")
        if words[0] in fleetctl.MODULE_OF:
            continue
        assert isinstance(run, functools.partial) and run.func is opcommands.run_op, words
        found[words] = run.args[0]
    return found


def test_every_op_with_a_command_is_that_fleetctl_command_and_no_other_command_calls_the_daemon():
    commands = daemon_commands()
    assert {words: op.name for words, op in commands.items()} == {op.command: op.name for op in OPS.commands()}
    assert OPS.commands(), "the registry lists no command"


@pytest.mark.parametrize("op", [op for op in OPS.commands()], ids=lambda op: op.name)
def test_each_ops_command_has_help_name_and_json(op, capsys):
    with pytest.raises(SystemExit) as info:
        fleetctl.main([*op.command, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and f"fleetctl {' '.join(op.command)}" in out
    assert "--name NAME" in out and "--trust-uid UID" in out and "--json" in out


def test_an_op_without_a_command_or_a_method_says_why():
    for name in OPS.names():
        op = OPS.get(name)
        assert op.command is not None or op.no_command.strip(), name
        assert op.method is not None or op.no_method.strip(), name


def test_every_op_with_a_method_is_that_client_method_and_every_other_public_method_is_the_clients_own():
    made = {}
    for name in OPS.names():
        op = OPS.get(name)
        if op.method is not None:
            made[op.method] = op
    public = {n for n in dir(Client) if not n.startswith("_") and callable(getattr(Client, n))}
    inherited = {n for n in public if n not in Client.__dict__}  # Executor's context manager
    assert public - inherited - CLIENT_OWN == set(made)
    for method, op in made.items():
        params = list(inspect.signature(getattr(Client, method)).parameters)
        assert params == ["self", *op.signature.parameters], method


@pytest.mark.parametrize("op", [OPS.get(n) for n in OPS.names() if OPS.get(n).method is not None],
                         ids=lambda op: op.name)
def test_each_client_method_sends_its_op(op):
    sent = []

    class Recorder(Client):
        def __init__(self):  # no socket: `_call` is what the methods reach
            pass

        def _call(self, name, **args):
            sent.append((name, args))
            return {"allowance": None, "starts": 0, "starving": []}

    method = getattr(Recorder(), op.method)
    required = [p for p in inspect.signature(method).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    samples = {"cause": "operator", "pool": "p", "until": 2e9, "provider": "p", "spent": 1.0, "lane": None,
               "wanted": 1, "unit": 7}
    if "route" in {p.name for p in required}:
        from admission.route import Route

        samples["route"] = Route("m", "p")
    method(**{p.name: samples[p.name] for p in required})
    assert [name for name, _ in sent] == [op.name]


def test_the_registry_refuses_an_op_without_a_command_or_method_and_a_command_given_twice():
    class Quiet(Op):
        name = "quiet"

    with pytest.raises(ValueError, match="no_command"):
        OpRegistry([Quiet])

    class Drain2(Op):
        name = "drain2"
        command = ("drain",)

    with pytest.raises(ValueError, match="fleetctl drain"):
        OpRegistry([OPS.get("drain").__class__, Drain2])

    class Mute(Op):
        name = "mute"
        no_command = "none"
        method = None

    with pytest.raises(ValueError, match="no_method"):
        OpRegistry([Mute])


def test_views_draw_only_ops_that_have_a_command():
    assert set(views.RENDER) <= {op.name for op in OPS.commands()}


def test_a_new_op_in_a_registry_becomes_a_command_and_a_method_of_every_face(monkeypatch, capsys):
    # What adding an op takes: its class, registered. fleetctl's list and help, the
    # client's method, the embedded Fleet's, the façade's and the wire's follow.
    class Wave(Op):
        name = "wave"
        summary = "Wave at the daemon."
        command = ("wave",)
        schema = {"times": Arg((int,), default=1)}
        fleet = True

        def on_loop(self, sup, times: int = 1) -> dict:
            """Wave `times` times, on the fleet's loop."""
            return {"waves": times, "on_loop": sup.on_loop}

    registry = OpRegistry([Wave])
    monkeypatch.setattr(opcommands, "OPS", registry)
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        fleetctl.main(["--help"])
    assert "wave" in out.getvalue() and "Wave at the daemon." in out.getvalue()

    class Loop:
        """A supervisor's `call`: what it is handed runs on its loop."""

        on_loop = False

        def call(self, fn, *args, view=False):
            self.on_loop = True
            try:
                return fn(*args)
            finally:
                self.on_loop = False

    facade = registry.facade()(Loop())
    assert facade.wave(times=3) == {"waves": 3, "on_loop": True}
    assert registry.get("wave").execute(facade, registry.get("wave").validate({})) == {"waves": 1, "on_loop": True}
    sent = []
    client = registry.client_class(type("Caller", (), {"_call": lambda self, name, **args: sent.append((name, args))}))
    client().wave(2)
    assert sent == [("wave", {"times": 2})]
    fleet_face = registry.fleet_methods(type("Embedded", (), {}))
    embedded = fleet_face()
    embedded.operations = facade
    assert embedded.wave() == {"waves": 1, "on_loop": True}
    for face in (type(facade), client, fleet_face):
        method = getattr(face, "wave")
        assert list(inspect.signature(method).parameters) == ["self", "times"]
        assert inspect.getdoc(method) == "Wave `times` times, on the fleet's loop."
