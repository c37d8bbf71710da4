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
