"""Which room depends on which.

fleet/ is built in wings, each on the ones below it (docs/internals.md, "Layout"): a
module imports only from its own wing or from a wing below, so no arrow points up and
no two wings lean on each other. `admission/` stands under them all and alone: it
imports nothing of fleet. And the runtime never imports its command line (the CLI
formats what the runtime gathers, never the other way round).
"""
from __future__ import annotations

import ast
import collections
import pathlib
import subprocess
import sys

import fleet

ROOT = pathlib.Path(fleet.__file__).parent
TREE = ROOT.parent

#: The wings of fleet/, lowest first.
WINGS = ("rules", "host", "shm", "worker", "runtime", "service", "api", "cli", "burst")
#: fleet/'s top-level modules and the room each stands in: the leaves every wing may
#: import (the version; where the package lives; the C extensions built from native/ at install) and the public
#: face (fleet/__init__.py), which re-exports the user's API from the wings up to api
#: and which the tools above it use as a user does.
TOP = {"_version": "leaves", "_root": "leaves", "_native": "leaves", "_rings": "leaves", "_chunk": "leaves", "_codec": "leaves",
       "_table": "leaves",
       "__init__": "face"}
#: Every room, lowest first: a module may need its own room and the rooms before it.
FLOORS = ("admission", "leaves", "rules", "host", "shm", "worker", "runtime", "service", "api", "face", "cli", "burst")
#: The rooms of the supervisor's process and above it: what a worker or the fork server
#: (fleet/worker/) never imports, directly or through another module.
SUPERVISOR_SIDE = FLOORS[FLOORS.index("runtime"):]


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


def lazy_imports(source: str):
    """The modules a package's face loads on first use: the values of its ``_LAZY`` table
    (name -> the module that defines it), which no import statement shows."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)):
            yield from (v.value for v in node.value.values if isinstance(v, ast.Constant))


def modules() -> dict[str, pathlib.Path]:
    """Every module and package of fleet/ and admission/ by dotted name, and fleet's C
    extensions (built or not)."""
    found = {}
    for pkg in ("fleet", "admission"):
        for path in (TREE / pkg).rglob("*.py"):
            parts = path.relative_to(TREE).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found | {f"fleet.{m}": ROOT / m for m in TOP if m != "__init__"}


KNOWN = modules()


def room(module: str) -> str | None:
    """The room a module of ours stands in; None for a top-level module of fleet/ TOP does not place."""
    parts = module.split(".")
    if parts[0] == "admission":
        return "admission"
    if len(parts) == 1:
        return TOP["__init__"]
    return parts[1] if parts[1] in WINGS else TOP.get(parts[1])


def needs(module: str, source: str) -> set[str]:
    """The modules of ours `module` (`source` is its text) needs, anywhere in it: an import
    names the longest module of ours it reaches (``from fleet import _native`` needs
    fleet._native; ``from fleet import Fleet`` and ``import fleet``, the face), and a
    ``_LAZY`` table needs what it loads."""
    is_package = KNOWN.get(module, pathlib.Path()).name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    named = list(lazy_imports(source))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            named += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            named += [f"{mod}.{a.name}" if f"{mod}.{a.name}" in KNOWN else mod for a in node.names]
    found = set()
    for name in named:
        parts = name.split(".")
        reached = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in KNOWN), None)
        if reached is not None and reached != module:
            found.add(reached)
    return found


def upward(module: str, source: str) -> list[str]:
    """What `module` needs from a room above its own (or from a module with no room)."""
    floor = FLOORS.index(room(module))
    return sorted(m for m in needs(module, source) if room(m) is None or FLOORS.index(room(m)) > floor)


def room_graph() -> collections.Counter:
    """(room, room it needs) -> how many modules' needs point that way, between different rooms."""
    edges = collections.Counter()
    for module, path in KNOWN.items():
        if path.suffix == ".py":
            for need in needs(module, path.read_text()):
                if room(need) != room(module):
                    edges[room(module), room(need)] += 1
    return edges


def cycle(edges) -> list[str]:
    """A cycle among the rooms `edges` ((from, to) pairs) join, as its rooms in order; [] when none."""
    after = collections.defaultdict(set)
    for a, b in edges:
        after[a].add(b)
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(after[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(after):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_every_module_of_fleet_stands_in_a_room():
    tops = {p.name.split(".")[0] for p in ROOT.iterdir()
            if p.suffix in (".py", ".so") or (p / "__init__.py").is_file()}
    assert sorted(t for t in tops if t not in WINGS and t not in TOP) == []
    assert [w for w in WINGS if not (ROOT / w / "__init__.py").is_file()] == []
    assert sorted(set(WINGS) | set(TOP.values()) | {"admission"}) == sorted(FLOORS)


def test_no_module_imports_from_a_room_above_its_own():
    offenders = {}
    for module, path in KNOWN.items():
        if path.suffix == ".py":
            bad = upward(module, path.read_text())
            if bad:
                offenders[module] = bad
    assert offenders == {}


def test_no_two_rooms_lean_on_each_other():
    assert cycle(room_graph()) == []


def test_the_floor_scan_catches_an_arrow_up():
    # A rule that once reached up into the client, from inside a function.
    assert upward("fleet.rules.planted", "def plan(q):\n    from fleet.api.client import connect\n") == [
        "fleet.api.client"]
    assert upward("fleet.runtime.planted", "from ..burst import record\n") == ["fleet.burst.record"]
    # The version read through the face is an arrow up; through its leaf, or a C extension, it is not.
    assert upward("fleet.shm.planted", "from fleet import __version__\n") == ["fleet"]
    assert upward("fleet.shm.planted", "from fleet._version import __version__\nfrom fleet import _native\n") == []
    # What a lazy table loads counts as an import.
    assert upward("fleet.host.planted", '_LAZY = {"Fleet": "fleet.api.fleet"}\n') == ["fleet.api.fleet"]
    # A top-level module of fleet/ that TOP does not place has no room.
    assert room("fleet.stray") is None and room("fleet._version") == "leaves"
    # Down and sideways are allowed.
    assert upward("fleet.cli.planted", "import fleet\nfrom fleet.api import client\nfrom . import views\n") == []


def test_the_cycle_scan_finds_two_rooms_leaning_on_each_other():
    assert cycle({("shm", "rules"), ("rules", "host"), ("host", "shm")}) == ["host", "shm", "rules", "host"]
    assert cycle({("shm", "rules"), ("host", "rules"), ("shm", "host")}) == []


def test_admission_imports_nothing_of_fleet():
    offenders = {}
    for module, path in KNOWN.items():
        if room(module) == "admission":
            bad = sorted(m for m in needs(module, path.read_text()) if room(m) != "admission")
            if bad:
                offenders[module] = bad
    assert offenders == {}
    assert upward("admission.planted", "from fleet.rules.errors import FleetError\n") == ["fleet.rules.errors"]


def test_admission_runs_where_fleet_cannot_be_imported():
    """Every module of admission/ imports, and a pool admits and reads a refusal, with
    fleet made unimportable: the package stands alone."""
    names = sorted(m for m in KNOWN if room(m) == "admission")
    script = (
        "import importlib, sys\n"
        "sys.modules['fleet'] = None  # any import of fleet now raises ImportError\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "import admission\n"
        "pool = admission.AdmissionPool(clock=admission.ManualClock())\n"
        "route = admission.Route('m', 'p')\n"
        "print(pool.admit(1, route).action)\n"
        "from admission.pool import signal_for\n"
        "pool.report(1, signal_for(admission.Refused(429, 'slow down', retry_after=5)))\n"
        "print(pool.census()['bulkheads'][0]['state'])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=TREE,
                         env={"PYTHONPATH": str(TREE), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["admit", "backoff"]


def test_worker_side_modules_import_nothing_of_the_supervisors():
    """The process boundary: what runs in a worker or the fork server (fleet/worker/)
    needs no module of the supervisor's rooms, directly (the floor scan) or through
    the modules it imports: a fresh interpreter that imports every worker-side module
    has loaded none of them."""
    names = sorted(m for m in KNOWN if room(m) == "worker")
    assert "fleet.worker.zygote" in names and "fleet.worker.process" in names
    assert {m: bad for m in names if (bad := sorted(n for n in needs(m, KNOWN[m].read_text())
                                                   if room(n) in SUPERVISOR_SIDE))} == {}
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=TREE)
    assert out.returncode == 0, out.stderr
    # The package itself loads with any of its modules: its eager imports are rules' and
    # admission's, and what they load is in the list too.
    loaded = [m for m in out.stdout.split() if m in KNOWN and room(m) in SUPERVISOR_SIDE and m != "fleet"]
    assert loaded == []


def test_the_boundary_scan_finds_a_worker_module_reaching_the_supervisor():
    assert upward("fleet.worker.planted", "def run():\n    from fleet.runtime.loop import Supervisor\n") == [
        "fleet.runtime.loop"]
    assert room("fleet.worker.io.runner") == "worker" and "runtime" in SUPERVISOR_SIDE and "shm" not in SUPERVISOR_SIDE


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


# One owner per piece of state (docs/internals.md, "The supervisor's owners"): a module of
# the supervisor's rooms works on another object through what it offers, never through its
# private fields (an attribute spelled with a leading underscore on anything but self, cls,
# super() or a module). The few that remain, each with its reason:
PRIVATE_READS = {
    ("fleet/runtime/zygote_link.py", "link._boot"): "ZygoteLink.start boots the link it just made (its own class)",
    ("fleet/runtime/provider_gate.py", "pool._budget"): "the admission pool offers no reading of its budget table",
}


def private_reaches(source: str) -> list[str]:
    """``obj._field`` in `source` where obj is not self, cls, super() or a module it imports."""
    tree = ast.parse(source)
    modules = {a.asname or a.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append(f"{ast.unparse(owner)}.{node.attr}")
    return sorted(found)


def test_no_supervisor_room_reaches_into_another_objects_private_fields():
    # The supervisor's rooms, and the ops' halves that run on its loop.
    offenders = {}
    for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "service" / "control" / "ops").rglob("*.py")]):
        rel = str(path.relative_to(TREE))
        found = [f for f in private_reaches(path.read_text()) if (rel, f) not in PRIVATE_READS]
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_the_private_scan_finds_a_room_writing_the_supervisors_field():
    # How the rooms of the supervisor once worked: a function of the supervisor's fields.
    assert private_reaches("def close(sup, u):\n    sup._units.pop(u)\n    sup._dispatch()\n") == [
        "sup._dispatch", "sup._units"]
    assert private_reaches("import threading\nclass A:\n    def f(self):\n        self._x = super()._y\n"
                           "        threading._register_atexit(f)\n") == []


def test_every_package_is_one_the_install_ships():
    """pyproject.toml lists fleet's packages by name (a wheel holds those and no others): a
    new room's folder is in the list, or a non-editable install lacks it."""
    import tomllib

    listed = set(tomllib.loads((TREE / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(TREE).parts) for pkg in ("fleet", "admission")
             for p in (TREE / pkg).rglob("__init__.py")}
    assert sorted(found - listed) == [] and sorted(listed - found) == []
