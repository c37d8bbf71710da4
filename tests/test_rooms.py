"""Which room depends on which: the runtime never imports its command line (the
CLI formats what the runtime gathers, never the other way round)."""
from __future__ import annotations

import ast
import pathlib

import fleet

ROOT = pathlib.Path(fleet.__file__).parent


def imports(source: str, package: str):
    """Every module `source` (a module of `package`) imports, anywhere in it
    (function-local imports too), as absolute dotted names."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)


def cli_imports(source: str, package: str) -> list[str]:
    return sorted({m for m in imports(source, package) if m == "fleet.cli" or m.startswith("fleet.cli.")})


def test_runtime_modules_never_import_the_cli():
    offenders = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        if "cli" in rel.parts:
            continue
        bad = cli_imports(path.read_text(), ".".join(rel.parts[:-1]))
        if bad:
            offenders[str(rel)] = bad
    assert offenders == {}


def test_the_scan_finds_a_function_local_import_of_the_cli():
    # How the daemon once read its status: from inside a method.
    source = "def status(self):\n    from .cli.cmd_status import gather\n    return gather(self.name)\n"
    assert cli_imports(source, "fleet") == ["fleet.cli.cmd_status", "fleet.cli.cmd_status.gather"]
    assert cli_imports("from . import status\n", "fleet") == []


# The control wire format (frames, request and reply envelopes, outcome records) is
# defined in fleet/service/control/ and nowhere else: these names and envelope shapes are its.
WIRE_NAMES = {"MAX_FRAME", "Request", "Reply", "encode_request", "decode_request", "encode_reply",
              "decode_reply", "encode_error", "encode_outcome", "decode_outcome"}
WIRE_SHAPES = ({"id", "op", "args"}, {"id", "ok"}, {"seq", "kind"})


def wire_definitions(source: str) -> list[str]:
    """What ``source`` defines of the wire format: a wire name (def, class or
    assignment) or a dict literal shaped like a request, reply or outcome record."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in WIRE_NAMES:
            found.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [t.id for t in targets if isinstance(t, ast.Name) and t.id in WIRE_NAMES]
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            found += ["{" + ", ".join(sorted(shape)) + "}" for shape in WIRE_SHAPES if shape <= keys]
    return found


def test_no_module_outside_fleet_control_defines_the_wire_format():
    offenders = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        if rel.parts[:3] == ("fleet", "service", "control"):
            continue
        found = wire_definitions(path.read_text())
        if found:
            offenders[str(rel)] = found
    assert offenders == {}


def test_the_wire_scan_finds_an_encoder_and_an_envelope_outside_the_package():
    # How the daemon once encoded outcome records itself.
    source = ("def encode_outcome(seq, role, fut):\n    return [{'seq': seq, 'role': role, 'kind': 'solved'}]\n"
              "def reply(i):\n    return {'id': i, 'ok': True, 'result': 1}\n")
    assert wire_definitions(source) == ["encode_outcome", "{id, ok}", "{kind, seq}"]
    assert wire_definitions("x = {'id': 1, 'name': 'a'}\n") == []


def test_the_internals_doc_names_what_every_module_of_fleet_owns():
    """The room map of docs/internals.md lists every module and package of fleet/, and
    nothing that is gone: a new room comes with its line."""
    doc = (ROOT.parent / "docs" / "internals.md").read_text()
    section = doc.split("## fleet/, room by room", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    folders = {"cli", "burst", "shm/table", "service/control"}  # listed whole
    present = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
               if p.name != "__init__.py" and not any(str(p.relative_to(ROOT)).startswith(f + "/") for f in folders)}
    present |= {f + "/" for f in folders}
    assert listed == present
