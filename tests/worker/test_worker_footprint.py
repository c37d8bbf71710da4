"""A worker's own memory (issue 49, item 3: a worker's USS no more than a
ProcessPoolExecutor worker's). A worker is a fork of the zygote; a page becomes its own
when it writes to it. So what a worker needs is made in the zygote before the fork:
every module it imports (an import after the fork costs ~1 MiB: the import machinery's
caches and objects written all over shared pages) and its seat's `Worker` itself
(`fleet.worker.zygote.Zygote.boot`). Checked in real workers of a real Executor, from
inside: an audit hook the main module installs (the zygote imports it before forking,
so every worker inherits it) records each import with the pid that made it; and the
Worker a fork runs is one the zygote froze out of the collector's sight at boot
(`gc.freeze`), which an object made after the fork is not."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.daemons import REPO

SCRIPT = """
    import gc, json, os, sys
    sys.path.insert(0, {repo!r})

    IMPORTS = []  # (pid, module) of each import: the zygote's, then each worker's own copy

    def _hook(event, args):
        if event == "import":
            IMPORTS.append((os.getpid(), args[0]))

    sys.addaudithook(_hook)

    def report(_=None):
        from fleet.worker import inside

        worker_made_before_freeze = not any(o is inside._CHILDREN for o in gc.get_objects())
        return {{"imported_after_fork": sorted({{m for pid, m in IMPORTS if pid == os.getpid()}}),
                 "worker_made_in_zygote": worker_made_before_freeze}}

    if __name__ == "__main__":
        import fleet

        with fleet.Executor(max_workers=1) as ex:
            list(ex.map(abs, range(50)))
            list(ex.map(abs, range(50), chunksize=5))
            ex.submit(pow, 2, 8).result()
            print(json.dumps(ex.submit(report).result()))
"""


def _script_says(tmp_path, source: str):
    """What a script (one of this module's, run as a program's main module) printed last, as JSON."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(source).format(repo=REPO))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_workers_fork_imports_nothing_and_runs_the_worker_the_zygote_made(tmp_path):
    assert _script_says(tmp_path, SCRIPT) == {"imported_after_fork": [], "worker_made_in_zygote": True}


def test_the_zygote_makes_a_batchs_forks_first_and_reports_them_after():
    """What the zygote writes between two forks (its reports, the bell) would be the earlier
    worker's own memory: a batch's forks come first, in order, then their reports and one
    ring; a message of another kind reports the forks before it first, and an exit ends."""
    from fleet.worker.zygote import Zygote

    events = []
    z = Zygote(sock=None)
    z.fork = lambda seat, cpus, channel=None: events.append(("fork", seat)) or 100 + seat
    z.send = lambda **msg: events.append((msg["op"], msg["seat"], msg["pid"]))
    z.tell = lambda: events.append(("tell",))
    z.check = lambda msg, fd: events.append(("check",))
    fork = [{"op": "fork", "seat": seat, "cpus": [0]} for seat in range(3)]
    assert z.handle([fork[0], fork[1], {"op": "check", "roles": []}, fork[2]]) is None
    assert events == [("fork", 0), ("fork", 1), ("forked", 0, 100), ("forked", 1, 101), ("tell",), ("check",),
                      ("fork", 2), ("forked", 2, 102), ("tell",)]
    events.clear()
    assert z.handle([fork[0], {"op": "exit"}, fork[1]]) == 0
    assert events == [("fork", 0), ("forked", 0, 100), ("tell",)]


FAULTS = """
    import json, os, sys
    sys.path.insert(0, {repo!r})
    import fleet

    def minor_faults(pid):
        return int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[7])

    def nbytes(b):
        return len(b)

    if __name__ == "__main__":
        data = [os.urandom(1 << 20) for _ in range(64)]
        with fleet.Executor(max_workers=2) as ex:
            # Four values per unit, fixed: a batch the map sizes itself follows its timing
            # (fleet.rules.pace), and one past 16 MiB of values went past the heap's warmed
            # trim threshold (seen: 37-193 faults per value). Four are 4 MiB, within the
            # thresholds warm_allocator sets.
            list(ex.map(nbytes, data, chunksize=4))  # each worker's first large values: its allocator settles
            # Read from here, every worker's: a probe unit reports only the worker it ran on,
            # and which worker runs which unit is the dispatcher's choice.
            pids = sorted(ex._sup.pids().values())
            before = {{pid: minor_faults(pid) for pid in pids}}
            list(ex.map(nbytes, data * 3, chunksize=4))
            after = {{pid: minor_faults(pid) for pid in pids}}
            same = sorted(ex._sup.pids().values()) == pids  # no worker replaced meanwhile
        print(json.dumps({{"per_value": sum(after[p] - before[p] for p in pids) / (3 * len(data)),
                           "workers": len(pids), "same": same}}))
"""


def test_a_worker_takes_1_mib_values_without_mapping_fresh_pages_for_each(tmp_path):
    # A 1 MiB `bytes` argument is read into memory of the worker's own (256 pages). Started
    # from glibc's defaults, a worker mapped, faulted in and unmapped that memory for every
    # value (~250 minor faults per value, measured with the warm-up removed); the fork server
    # warms the allocator once (`fleet.worker.zygote.warm_allocator`): under 1 per value.
    got = _script_says(tmp_path, FAULTS)
    assert got["workers"] == 2 and got["same"] and got["per_value"] < 32, got


REHEARSED = """
    import dis, json, sys
    sys.path.insert(0, {repo!r})

    def specialised():
        # The functions each unit runs in a worker (its loop, the codec, pickle's C core
        # has none), read by the worker's first unit: which of them run bytecode that
        # Python specialised (names outside dis.opmap: RESUME_QUICK, LOAD_ATTR_*, ...),
        # as a function does only after it ran a few times.
        from fleet.worker import codec
        from fleet.worker.process import Worker

        path = [Worker._tasks, Worker._message, Worker._task, Worker._execute, Worker._run_one, Worker._finish,
                Worker._send, codec.pack]
        return {{fn.__qualname__: any(i.opname not in dis.opmap for i in dis.get_instructions(fn, adaptive=True))
                 for fn in path}}

    if __name__ == "__main__":
        import fleet

        with fleet.Executor(max_workers=1) as ex:
            print(json.dumps(ex.submit(specialised).result()))
"""


def test_a_workers_first_unit_runs_code_the_fork_server_specialised(tmp_path):
    # The fork server runs a worker's loop over scratch memory before it forks
    # (fleet.worker.rehearsal): its workers inherit that code specialised, so their first
    # units do not write it into pages of their own (~130 KiB of each worker's USS). Read
    # by the worker's very first unit, which the path has run once by then: unrehearsed,
    # none of it would be.
    got = _script_says(tmp_path, REHEARSED)
    assert got and all(got.values()), got


REHEARSAL = """
    import json, os, sys, threading
    sys.path.insert(0, {repo!r})
    from fleet.worker import rehearsal

    fds, threads = sorted(os.listdir("/proc/self/fd")), threading.active_count()
    solved = [rehearsal.rehearse("probe-rehearsal", lend=True), rehearsal.rehearse("probe-rehearsal", lend=False, units=3)]
    print(json.dumps({{"solved": solved, "units": rehearsal.UNITS,
                       "named": [e for e in os.listdir("/dev/shm") if "probe-rehearsal" in e],
                       "fds_left": sorted(set(os.listdir("/proc/self/fd")) - set(fds)),
                       "threads_left": threading.active_count() - threads}}))
"""


def test_the_rehearsal_runs_its_units_in_memory_of_its_own(tmp_path):
    # Nothing of a fleet's is touched and nothing is left: no segment in /dev/shm, no
    # descriptor, no thread; every unit solved through the worker's real path. (In a
    # process of its own: what other tests do meanwhile is not its to count.)
    got = _script_says(tmp_path, REHEARSAL)
    assert got == {"solved": [got["units"], 3], "units": got["units"], "named": [], "fds_left": [], "threads_left": 0}


def test_a_failed_rehearsal_is_logged_and_the_forks_go_on(monkeypatch, caplog):
    import types

    from fleet.worker import rehearsal
    from fleet.worker.zygote import Zygote

    def broken(fleet, *, lend):
        raise RuntimeError("rehearsal: LEASE refused: illegal")

    monkeypatch.setattr(rehearsal, "rehearse", broken)
    monkeypatch.setattr("gc.freeze", lambda: None)  # this test process's objects stay in the collector's sight
    z = Zygote(sock=None)
    z.name, z.setup = "probe", types.SimpleNamespace(lend=True)
    with caplog.at_level("WARNING", logger="fleet.worker.zygote"):
        z.rehearse()  # returns: the workers start unrehearsed
    assert "the workers' rehearsal failed" in caplog.text and "LEASE refused" in caplog.text
