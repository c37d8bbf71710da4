"""Rules for the tests themselves: no test asserts how long something took.

A wall-clock bound in an assertion fails on a loaded machine and passes on a broken
rule that happens to be quick; it measures the machine, not the code. Tests assert
behaviour (order, counts, the state reached, an event observed, a fake clock's
readings); a figure worth keeping as a speed measure lives in tools/bench/. Waiting
with a deadline for something to happen is fine: ``while not done(): assert
time.monotonic() < deadline`` compares a reading with a deadline, not a duration.
"""
from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).parent

#: The clocks of the `time` module: a difference of two of their readings is a duration.
CLOCKS = frozenset({"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns",
                    "process_time", "process_time_ns", "thread_time", "thread_time_ns"})
#: CPU clocks read as a call on some object: ``resource.getrusage(...)``, ``os.times()``,
#: ``psutil.Process(pid).cpu_times()``.
CPU_CLOCKS = frozenset({"getrusage", "times", "cpu_times"})


def _clock_names(tree: ast.Module) -> set[str]:
    """Names a module bound to a clock (``from time import monotonic as now``)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "time"
            for a in node.names if a.name in CLOCKS}


class _Scope:
    """One test (or helper) function, or the module's top level: which of its names hold
    a clock reading, and which hold a duration (or a rate) computed from readings."""

    def __init__(self, body: ast.AST, clock_names: set[str]):
        self.clock_names = clock_names
        self.readings: set[str] = set()
        self.durations: set[str] = set()
        assigns = [n for n in ast.walk(body) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
        for node in assigns:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for name, value in _pairs(target, node.value):
                    if self.is_reading(value):
                        self.readings.add(name)
        changed = True
        while changed:  # a name computed from a duration is one too (took = end - t0; rate = n / took)
            changed = False
            for node in assigns:
                if self.has_duration(node.value):
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                        for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                            if name not in self.durations:
                                self.durations.add(name)
                                changed = True

    def is_clock_call(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Attribute):
            return (f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time") or f.attr in CPU_CLOCKS
        return isinstance(f, ast.Name) and f.id in self.clock_names

    def is_reading(self, node: ast.AST) -> bool:
        """A clock call, a name bound to one, or a part of one (``before.ru_utime``, ``times[0]``)."""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return self.is_clock_call(node) or (isinstance(node, ast.Name) and node.id in self.readings)

    def is_difference(self, node: ast.AST) -> bool:
        """``a - b`` with a clock reading in one side and something not constant as the other."""
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
            return False
        for one, other in ((node.left, node.right), (node.right, node.left)):
            if self.mentions_reading(one) and not isinstance(other, ast.Constant):
                return True
        return False

    def has_duration(self, node: ast.AST) -> bool:
        return any(self.is_difference(n) or (isinstance(n, ast.Name) and n.id in self.durations)
                   for n in ast.walk(node))

    def mentions_reading(self, node: ast.AST) -> bool:
        return any(self.is_reading(n) for n in ast.walk(node))

    def timed(self, compare: ast.Compare) -> bool:
        """A comparison that bounds a duration: an operand is a difference of readings (or
        a name holding one), or a reading moved by an offset is compared with another
        reading (``t0 + 0.05 < t``, the same bound written the other way round)."""
        operands = [compare.left, *compare.comparators]
        if any(self.has_duration(op) for op in operands):
            return True
        with_readings = [op for op in operands if self.mentions_reading(op)]
        return len(with_readings) >= 2 and any(
            isinstance(op, ast.BinOp) and isinstance(op.op, (ast.Add, ast.Sub)) for op in with_readings)


def _pairs(target: ast.AST, value: ast.AST):
    """(name, value) for each name an assignment binds, element by element for tuples."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _pairs(t, v)


def timed_assertions(source: str) -> list[tuple[int, str]]:
    """(line, assertion) for every assert in ``source`` that bounds a measured duration."""
    tree = ast.parse(source)
    clock_names = _clock_names(tree)
    top = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                        ast.ClassDef))], type_ignores=[])
    bodies = [top, *_outermost_functions(tree)]
    found = []
    for body in bodies:
        scope = _Scope(body, clock_names)
        for node in ast.walk(body):
            if isinstance(node, ast.Assert) and any(
                    isinstance(c, ast.Compare) and scope.timed(c) for c in ast.walk(node.test)):
                found.append((node.lineno, ast.unparse(node.test)))
    return sorted(set(found))


def _outermost_functions(node: ast.AST):
    """The functions not defined inside another (a nested helper is in its enclosing scope)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child
        else:
            yield from _outermost_functions(child)


def test_no_test_asserts_how_long_something_took():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = timed_assertions(path.read_text())
        if found:
            offenders[str(path.relative_to(TESTS.parent))] = found
    assert offenders == {}


PLANTED = {
    "a difference of readings": "def test():\n    t0 = time.monotonic()\n    work()\n"
                                "    assert time.monotonic() - t0 < 2.0\n",
    "a duration in a name": "def test():\n    t0 = time.perf_counter()\n    work()\n"
                            "    took = time.perf_counter() - t0\n    assert took < 1, took\n",
    "a rate": "def test():\n    t0, c0 = time.monotonic(), cpu()\n    time.sleep(1)\n"
              "    used = (cpu() - c0) / (time.monotonic() - t0)\n    assert used < 0.05\n",
    "an imported clock": "from time import monotonic as now\n\ndef test():\n    start = now()\n"
                         "    assert now() - start >= 0.1\n",
    "a reading moved by an offset": "def test():\n    t0 = time.monotonic()\n    stamps = run()\n"
                                    "    t1 = time.monotonic()\n"
                                    "    assert any(t0 + 0.05 < t < t1 - 0.05 for t in stamps)\n",
    "a clock read in a nested helper": "def test():\n    t0 = time.monotonic()\n    def late():\n"
                                       "        return time.monotonic() - t0\n    run()\n"
                                       "    assert late() < 1 and time.monotonic() - t0 < 1\n",
    "CPU time from rusage": "def test():\n    before = resource.getrusage(resource.RUSAGE_SELF)\n    spin()\n"
                            "    after = resource.getrusage(resource.RUSAGE_SELF)\n"
                            "    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)\n"
                            "    assert cpu < 0.5\n",
    "CPU time of a process": "def test():\n    c0 = sum(proc.cpu_times()[:2])\n    time.sleep(1)\n"
                             "    assert sum(proc.cpu_times()[:2]) - c0 < 0.05\n",
    "against a value read elsewhere": "def test():\n    h = header()\n"
                                      "    assert abs(h.created_ns - time.time_ns()) < 60e9\n",
}

ALLOWED = {
    "a deadline": "def test():\n    deadline = time.monotonic() + 30\n    while not done():\n"
                  "        assert time.monotonic() < deadline, 'never done'\n        time.sleep(0.01)\n",
    "a reading between two readings": "def test():\n    before = time.time_ns()\n    h = make()\n"
                                      "    assert before <= h.created_ns <= time.time_ns()\n",
    "a clock outside an assertion": "def test():\n    os.utime(p, (time.time() - 60, time.time() - 60))\n"
                                    "    assert stale(p)\n",
    "a fake clock's arithmetic": "def test():\n    clock = FakeClock()\n    clock.advance(5)\n"
                                 "    assert clock.now - 1000.0 == 5\n",
    "a duration only in the message": "def test():\n    t0 = time.monotonic()\n    run()\n"
                                      "    assert not burn.done(), f'{time.monotonic() - t0:.2f} s'\n",
}


def test_the_scan_catches_each_shape_of_a_timed_assertion():
    for what, source in PLANTED.items():
        assert timed_assertions(source), what


def test_the_scan_lets_deadlines_and_fake_clocks_be():
    for what, source in ALLOWED.items():
        assert timed_assertions(source) == [], what


# --- fleet names ------------------------------------------------------------------------
# A fleet's name names its shared memory (/dev/shm/fleet.<name>) and its socket: two test
# runs on one host that booted the same name would tear down each other's fleet. Tests
# name their fleets with `tests.fleets.unique_name` (or the `fleet_name` fixture).

#: Calls whose first argument names a fleet that boots.
FLEET_MAKERS = frozenset({"config", "Fleetd", "_fleet", "_daemon"})  # served_fleetd takes a prefix
#: The docs' own fleet: their blocks run as written, and they call it demo.
SHARED_NAMES = {"tests/test_docs.py": {"demo"}}


def fixed_fleet_names(source: str) -> list[tuple[int, str]]:
    """(line, name) for each literal fleet name given to a call that boots a fleet
    (`FLEET_MAKERS`, and ``name=`` of a replay)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        args = []
        if called in FLEET_MAKERS and node.args:
            args.append(node.args[0])
        if called == "replay":
            args += [k.value for k in node.keywords if k.arg == "name"]
        found += [(node.lineno, a.value) for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return found


def test_no_test_boots_a_fleet_under_a_fixed_name():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        rel = str(path.relative_to(TESTS.parent))
        found = [(line, name) for line, name in fixed_fleet_names(path.read_text())
                 if name not in SHARED_NAMES.get(rel, set())]
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_the_name_scan_catches_a_literal_name_and_lets_a_unique_one_be():
    assert fixed_fleet_names('with _fleet("refbudget", clock) as f:\n    pass\n') == [(1, "refbudget")]
    assert fixed_fleet_names('cfg = config("admkeep", roles)\nrep = replay(t, name="tu")\n') == [
        (1, "admkeep"), (2, "tu")]
    assert fixed_fleet_names('cfg = config(unique_name("admkeep"), roles)\nd = Fleetd(fleet_name, {})\n'
                             'rep = replay(t, name=unique_name("tu"))\n') == []
