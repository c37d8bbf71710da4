"""The README and docs/ cannot drift from the code: every block marked runnable runs as
written, every configuration block loads, the configuration reference lists every key the
loader knows, and the slot-transition table is the state machine's.

A block is marked by an HTML comment on the line before its fence (invisible when rendered):
``<!-- run -->`` runs it (``python`` in a fresh interpreter, ``sh`` under ``bash -eu``), in a
temporary folder that holds links to the repository's ``examples/`` and ``tools/``; ``<!-- run: fleetd -->``
runs it while a real fleetd of the demo config (``examples/fleet.toml``) serves, under a name of
the test's own that stands in for the docs' ``demo`` (a fixed name would meet another run's, or
a user's own fleet ``demo`` on the same host);
``<!-- run: after install -->`` is ``pip install -e '.[EXTRAS]' && COMMAND``: the extras must be
ones the suite's own install (the ``test`` extra) brings, and COMMAND runs as written;
``<!-- run: ci -->`` is the README's test command, which `.ci/run` runs;
``<!-- check: config -->`` loads a ``toml`` block with the config loader (`load_config`);
``<!-- sketch -->`` is not run, and the paragraph before it says in words that it is a sketch.
Every ``python`` and ``sh`` block carries one of these marks.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from fleet.rules import fsm
from fleet.runtime.config import load_config

from .daemons import served_fleetd

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- (run|run: fleetd|run: after install|run: ci|check: config|sketch) -->\n```(\w+)\n(.*?)^```",
                  re.M | re.S)
#: A fence and the line before it: every example (python, sh) must be marked.
FENCE = re.compile(r"^([^\n]*)\n```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(kind: str):
    for path in DOCS:
        text = path.read_text()
        for m in MARK.finditer(text):
            if m.group(1) == kind:
                line = text.count("\n", 0, m.start()) + 1
                yield pytest.param(m.group(2), m.group(3), id=f"{path.relative_to(REPO)}:{line}")


def run_block(lang: str, code: str, tmp_path, env=None) -> None:
    for folder in ("examples", "tools"):  # what the docs' commands name, as from the checkout
        (tmp_path / folder).symlink_to(REPO / folder)
    if lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    elif lang == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        raise AssertionError(f"a runnable block must be python or sh, not {lang!r}")
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # `python`: this one
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr


#: A block's own fleet name (``"fleet": {"name": "roles-doc"}``): the test runs it under a
#: name of its own instead (FLEET_FLEET__NAME overrides a dict config as it does a file), so
#: two runs of the suite on one host never meet on one table.
NAMED_FLEET = re.compile(r'"fleet":\s*\{"name":\s*"[^"]+"')


@pytest.mark.parametrize("lang, code", list(blocks("run")))
def test_a_runnable_block_runs_as_written(lang, code, tmp_path, fleet_name):
    env = None
    if NAMED_FLEET.search(code):
        env = dict(os.environ, FLEET_FLEET__NAME=fleet_name)
    run_block(lang, code, tmp_path, env=env)


def test_the_blocks_that_talk_to_fleetd_run_as_written(tmp_path):
    """One demo fleetd serves them all, in order, under a name of this test's own: each
    block's ``demo`` is that name."""
    demo = tomllib.loads((REPO / "examples" / "fleet.toml").read_text())
    with served_fleetd("demo", demo["roles"], posture=demo.get("posture"), limits=demo.get("limits")) as d:
        for n, param in enumerate(blocks("run: fleetd")):
            lang, code = param.values
            assert re.search(r"\bdemo\b", code), "a block that talks to fleetd names the demo fleet"
            where = tmp_path / str(n)
            where.mkdir()
            run_block(lang, re.sub(r"\bdemo\b", d.name, code), where, env=d.env)


@pytest.mark.parametrize("lang, code", list(blocks("check: config")))
def test_a_configuration_block_loads(lang, code):
    assert lang == "toml"
    load_config(tomllib.loads(code))


def _examples():
    """(where, language, the line before the fence, the text before it) of every fenced block
    in the README and docs/ (indented fences, inside list items, are output, not examples)."""
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start(2)) + 1
            yield f"{path.relative_to(REPO)}:{line}", m.group(2), m.group(1), text[:m.start()]


def test_every_example_is_run_or_says_it_is_a_sketch():
    unmarked, unsaid = [], []
    for where, lang, before, text in _examples():
        if lang not in ("python", "sh", "bash"):
            continue
        if not re.fullmatch(r"<!-- (run|run: fleetd|run: after install|run: ci|sketch) -->", before):
            unmarked.append(where)
        elif before == "<!-- sketch -->":
            paragraph = text.rstrip().rsplit("\n\n", 1)[-1]  # the paragraph before the mark
            if "sketch" not in paragraph.lower():
                unsaid.append(where)
    assert unmarked == [] and unsaid == []


def _installs():
    """Every `pip install` of the checkout the README and docs/ write (in blocks and in text)."""
    for path in DOCS:
        for m in re.finditer(r"pip install (?:-\w+ )*['\"]?\.(?:\[[\w,]+\])?['\"]?", path.read_text()):
            yield f"{path.relative_to(REPO)}", m.group(0)


def test_an_extra_installed_into_a_checkout_is_installed_editable():
    # a plain `pip install '.[x]'` would replace the editable install a checkout works with
    with_extras = [(where, cmd) for where, cmd in _installs() if "[" in cmd]
    assert with_extras and [(w, c) for w, c in with_extras if " -e " not in c] == []


def _extras() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _brought_by(extra: str, extras: dict) -> set:
    """The extras `extra` brings, itself included (``fleet[a,b]`` inside an extra)."""
    found = {extra}
    for dep in extras[extra]:
        m = re.fullmatch(r"fleet\[([\w,]+)\]", dep)
        for inner in (m.group(1).split(",") if m else ()):
            found |= _brought_by(inner, extras)
    return found


@pytest.mark.parametrize("lang, code", list(blocks("run: after install")))
def test_a_block_after_its_install_runs_as_written(lang, code, tmp_path):
    m = re.fullmatch(r"pip install -e '\.\[([\w,]+)\]' && (.+)\n", code)
    assert lang == "sh" and m, code
    extras = _extras()
    assert set(m.group(1).split(",")) <= _brought_by("test", extras)  # the suite's install has them
    run_block(lang, m.group(2), tmp_path)


def test_the_readmes_test_command_is_what_ci_runs():
    (param,) = list(blocks("run: ci"))
    lang, code = param.values
    assert code == "pip install -e '.[test]' && python -m pytest -n auto\n"
    ci = (REPO / ".ci" / "run").read_text()
    assert "<!-- run: ci -->" in ci and 'bash -c "$TEST_COMMAND"' in ci


def test_the_every_key_file_boots_and_runs_a_unit(tmp_path, fleet_name):
    """docs/configuration.md's file, under another fleet name and a store of this test's."""
    import fleet

    text = (REPO / "docs" / "configuration.md").read_text()
    path = tmp_path / "every.toml"
    path.write_text(re.search(r"## Every key\n.*?```toml\n(.*?)```", text, re.S).group(1))
    env = {"FLEET_FLEET__NAME": fleet_name, "FLEET_STORE__URL": f"sqlite://{tmp_path / 'store.db'}"}
    with fleet.Fleet.from_config(str(path), env=env) as f:
        assert f.submit("solver", "to be or not to be", key="k").result(120) == {"to": 2, "be": 2, "or": 1, "not": 1}
        assert f.ledger()["solved"] == 1


def test_the_marks_find_blocks():
    # the scan itself: a mark that stopped matching would make the tests above pass vacuously
    assert len(list(blocks("run"))) >= 3
    assert len(list(blocks("run: fleetd"))) >= 1
    assert len(list(blocks("check: config"))) >= 1
    assert len(list(blocks("run: after install"))) >= 1 and len(list(blocks("sketch"))) >= 1
    assert sum(1 for _where, lang, _b, _t in _examples() if lang in ("python", "sh")) >= 20


def _known(message: str, word: str) -> list[str]:
    return [k.strip() for k in message.split(f"{word}: ", 1)[1].split(",")]


def _refusal(config: dict) -> str:
    with pytest.raises(ValueError) as info:
        load_config(config)
    return str(info.value)


def test_the_configuration_reference_lists_every_key_the_loader_knows():
    """The loader names what it knows when it refuses an unknown key; the reference block of
    docs/configuration.md must list each of them under its section."""
    text = (REPO / "docs" / "configuration.md").read_text()
    reference = tomllib.loads(re.search(r"## Every key\n.*?```toml\n(.*?)```", text, re.S).group(1))
    sections = _known(_refusal({"no_such_section": {}}), "sections")
    missing = [s for s in sections if s not in reference]
    role = {"kind": "pooled", "handler": "m:f"}
    probes = {s: {s: {"no_such_key": 1}} for s in sections if s not in ("roles", "budget")}
    probes["roles.*"] = {"roles": {"r": {**role, "no_such_key": 1}}}
    probes["admission.lanes.*"] = {"admission": {"lanes": {"l": {"no_such_key": 1}}}}
    documented = {
        **{s: reference.get(s, {}) for s in sections},
        "roles.*": next(iter(reference["roles"].values())),
        "admission.lanes.*": next(iter(reference["admission"]["lanes"].values())),
    }
    for where, config in probes.items():
        missing += [f"{where}.{k}" for k in _known(_refusal(config), "known") if k not in documented[where]]
    store_role = next(iter(reference["store"]["roles"].values()))
    store_role_keys = ("environment", "provider", "tier", "priority", "preemptible", "queue_timeout")
    missing += [f"store.roles.*.{k}" for k in store_role_keys if k not in store_role]
    assert missing == []


def test_the_slot_transition_table_is_the_state_machine():
    text = (REPO / "docs" / "internals.md").read_text()
    rows = re.findall(r"^\| (T\d+) \| (\w+) \| `(\w+)` \| (\w+) \| ([\w, ]+) \| (yes|no) \|$", text, re.M)
    documented = {(tid, frm, ev, to, kinds, gated) for tid, frm, ev, to, kinds, gated in rows}
    actual = set()
    for (state, event), (nxt, tid, kinds, gated) in fsm.TRANSITIONS.items():
        names = "any" if kinds == fsm.ALL_KINDS else ", ".join(fsm.KIND_NAMES[k] for k in sorted(kinds))
        actual.add((tid, fsm.STATE_NAMES[state], fsm.EVENT_NAMES[event], fsm.STATE_NAMES[nxt], names,
                    "yes" if gated else "no"))
    assert documented == actual


def test_every_relative_link_resolves():
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert broken == []


def test_the_docs_cite_nothing_the_reader_does_not_have():
    # design documents outside the repository, cited by number or section
    cite = re.compile(r"reference 00\d|\b00\d §|§\s?\d")
    found = [f"{p.relative_to(REPO)}:{n}" for p in DOCS for n, line in enumerate(p.read_text().splitlines(), 1)
             if cite.search(line)]
    assert found == []
