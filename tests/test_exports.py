"""The public faces, `fleet` and `admission`: each one's ``__all__`` is its user's API, pinned.

In the shape of trio's ``test_exports.py``: the expected lists are written out below, so
that a change to a face is a visible diff here; every name in a face imports and is
documented for users (in code, in README.md or docs/ outside the internals); and nothing
public is missing: a face offers no public name it does not export, and every name the
docs show users taking from it is exported.
"""
from __future__ import annotations

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import admission
import fleet

REPO = pathlib.Path(__file__).resolve().parent.parent
USER_DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "internals.md")]

FLEET_API = [
    "BadUnit", "BelowHostFloor", "BootRefused", "BudgetOverQuota", "Client", "ConfigError", "Draining", "Executor",
    "Fleet",
    "FleetClosed", "FleetConnectionLost", "FleetError", "NotInsideUnit", "NotRunning", "Outcome", "PayloadTooLarge",
    "PayloadUnpicklable", "PostureCauseError", "PostureRetuneError", "QueueFull", "QuotaTooSmallForPinnedRoles",
    "Refused", "RequestIdReused", "RoleBroken", "RoleStopped", "Route", "SubmitRefused", "SubmitUncertain",
    "Suppress", "Unit", "UnitBroken", "UnitError", "UnitFailed", "UnitSuppressed", "UnknownRoleError",
    "UntrustedPeer", "connect", "current_fleet", "current_unit", "report_cost", "runtime_status",
]
ADMISSION_API = ["AdmissionPool", "ManualClock", "Policy", "Refused", "Route", "ScaledClock"]

FACES = [pytest.param(fleet, FLEET_API, id="fleet"), pytest.param(admission, ADMISSION_API, id="admission")]


def code_in(markdown: str) -> str:
    """The code of a markdown text: its fenced blocks and inline code spans."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.S | re.M)
    return "\n".join(fenced + re.findall(r"`([^`]+)`", rest))


USER_CODE = "\n".join(code_in(p.read_text()) for p in USER_DOCS)


def shown_from(face: str, code: str) -> set[str]:
    """The names `code` takes from package `face`: ``face.Name`` (a class, or a callable
    called), and ``from face import a, b``; not its submodules, nor dotted config keys
    (``fleet.cpus``) and file names (``fleet.toml``)."""
    package = pathlib.Path(sys.modules[face].__file__).parent
    names = set(re.findall(rf"(?<![\w.]){face}\.([A-Z]\w*)", code))
    names |= set(re.findall(rf"(?<![\w.]){face}\.([a-z_]\w*)\(", code))
    for wrapped, line in re.findall(rf"^\s*from {face} import (?:\(([\w ,\n]+)\)|([\w ,]+))", code, flags=re.M):
        names |= {part.split(" as ")[0].strip() for part in (wrapped or line).split(",") if part.strip()}
    return {n for n in names
            if not n.startswith("_") and not (package / n).is_dir() and not (package / f"{n}.py").is_file()}


@pytest.mark.parametrize("face, expected", FACES)
def test_the_face_exports_exactly_the_users_api(face, expected):
    assert len(set(face.__all__)) == len(face.__all__), "a name exported twice"
    assert sorted(face.__all__) == sorted(expected)


@pytest.mark.parametrize("face, expected", FACES)
def test_every_exported_name_imports_from_a_fresh_interpreter(face, expected):
    script = (f"from {face.__name__} import *\n"
              "import inspect\n"
              "print(' '.join(sorted(n for n, v in dict(globals()).items()\n"
              "                      if not n.startswith('__') and not inspect.ismodule(v))))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == sorted(expected)


@pytest.mark.parametrize("face, expected", FACES)
def test_every_exported_name_is_documented_for_users(face, expected):
    undocumented = [n for n in face.__all__ if not re.search(rf"(?<![\w.]){n}\b", USER_CODE)
                    and not re.search(rf"{face.__name__}\.{n}\b", USER_CODE)]
    assert undocumented == []


@pytest.mark.parametrize("face, expected", FACES)
def test_the_face_offers_no_public_name_it_does_not_export(face, expected):
    offered = {n for n in dir(face) if not n.startswith("_") and not inspect.ismodule(getattr(face, n))}
    assert sorted(offered - set(face.__all__)) == []


@pytest.mark.parametrize("face, expected", FACES)
def test_every_name_the_docs_take_from_the_face_is_exported(face, expected):
    assert sorted(shown_from(face.__name__, USER_CODE) - set(face.__all__)) == []


def test_the_doc_scan_sees_what_users_are_shown():
    # the scan itself: names written as users write them, and what is not a name of the face
    code = code_in("Catch `fleet.UnitFailed`; call `fleet.connect(\"demo\")`.\n\n```python\n"
                   "from fleet import Executor as Pool, Suppress\nfleet.api.examples\n```\n"
                   "Set `fleet.cpus`; see `fleet.toml`.\n")
    assert shown_from("fleet", code) == {"UnitFailed", "connect", "Executor", "Suppress"}
    assert shown_from("fleet", USER_CODE) >= {"Executor", "Fleet", "connect", "Refused", "Route"}
    assert shown_from("admission", USER_CODE) >= {"AdmissionPool", "ManualClock", "ScaledClock"}


def test_the_version_is_the_package_metadatas():
    from importlib import metadata

    assert fleet.__version__ == metadata.version("fleet")
