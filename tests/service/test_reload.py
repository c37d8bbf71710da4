"""A reload is checked as a boot would check it: TOML and schema, the budget sums, and every
role's handler resolved in the worker fork server (the process the workers are forked
from), not in the process that asks. A config a boot would refuse is refused with that
typed error and changes nothing; a valid one is applied, and "needs a restart" names only
what a valid change cannot apply live. Real fleets: an embedded Fleet, and a fleetd on
SIGHUP."""
from __future__ import annotations

import signal
import sys
import types

import psutil
import pytest

from fleet.rules.budget import BudgetOverQuota
from fleet.rules.errors import ConfigError
from tests import forking
from tests.daemons import BOUND_S, Fleetd, wait_until
from tests.fleets import config, role, running

#: The modules the hostile handlers below live in, written to a directory on sys.path.
MODULES = {
    "reload_hangs": "import time\nwhile True:\n    time.sleep(1)\ndef f(unit):\n    return 1\n",
    "reload_exits": "import os\nos._exit(3)\n",
    "reload_sysexit": "raise SystemExit(4)\n",
    "reload_noncallable": "f = 42\n",
}


def _roles(handler: str = "square", **fields) -> dict:
    return {"sq": {**role("square", slots=2), "handler": handler, **fields}}


def _cfg(name: str, handler: str = "tests.handlers:square", events: int = 4, **fields) -> dict:
    return config(name, _roles(handler, **fields), posture={"cordon_enter_events": events})


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for module, text in MODULES.items():
        (tmp_path / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))  # the fork server gets the asker's sys.path with each check
    monkeypatch.setattr("fleet.worker.zygote.CHECK_BOUND_S", 1)  # the hanging import's bound
    yield tmp_path
    for module in MODULES:
        sys.modules.pop(module, None)


def _zygote_children(f) -> set[int]:
    """The fork server's live children (its workers; a checker that outlived its check would show)."""
    return set(forking.live_children([f._sup.seats.workers.zygote.pid]))


# handler -> what the refusal says (each a ConfigError naming roles.sq.handler)
REFUSED = {
    "nosuch.module:f": "cannot import module 'nosuch.module': ModuleNotFoundError",
    "tests.handlers:nosuch": "module 'tests.handlers' has no callable 'nosuch'",
    "tests.handlers:_WARM": "module 'tests.handlers' has no callable '_WARM'",  # a dict: not callable
    "reload_noncallable:f": "module 'reload_noncallable' has no callable 'f'",
    "reload_sysexit:f": "cannot import module 'reload_sysexit': SystemExit: 4",
    "reload_exits:f": "importing 'reload_exits:f' in the worker fork server did not finish",
    "reload_hangs:f": "importing 'reload_hangs:f' in the worker fork server did not finish",
    # importable here (the asking process made it), not in the fork server: refused
    "reload_ghost:f": "cannot import module 'reload_ghost': ModuleNotFoundError",
    "tests.io_handlers:sleep_async": "is an async def handler; declare the role io_bound = true",
}


def test_an_embedded_reload_is_refused_when_the_fork_server_cannot_resolve_a_handler(fleet_name, modules,
                                                                                      monkeypatch):
    ghost = types.ModuleType("reload_ghost")
    ghost.f = lambda unit: 1
    monkeypatch.setitem(sys.modules, "reload_ghost", ghost)
    with running(_cfg(fleet_name)) as f:
        workers = _zygote_children(f)
        for handler, why in REFUSED.items():
            with pytest.raises(ConfigError) as err:
                f.reload(_cfg(fleet_name, handler, events=9), env={})
            assert err.value.path == "roles.sq.handler", (handler, err.value)
            assert why in str(err.value), (handler, str(err.value))
            assert f.posture_show()["policy"]["cordon_enter_events"] == 4, handler  # nothing applied
            # no worker replaced; the checker is gone once its answer is in (reaped by the fork server)
            wait_until(lambda: _zygote_children(f) == workers, f"the checker of {handler} reaped")
        assert f.submit("sq", 7).result(BOUND_S) == 49  # the fork server and its workers serve on
        result = f.reload(_cfg(fleet_name, events=9), env={})  # a good file still reloads
        assert result == {"applied": ["posture"], "needs_restart": []}
        assert f.posture_show()["policy"]["cordon_enter_events"] == 9


def test_an_embedded_reload_over_the_quota_is_refused_as_boot_refuses_it(fleet_name):
    with running(_cfg(fleet_name)) as f:  # no host has 1024 cores for one role and the loop's reserve
        with pytest.raises(BudgetOverQuota, match="declared shares sum to 1024 cores over a quota of"):
            f.reload(_cfg(fleet_name, events=9, peak_cpus=1024), env={})
        assert f.posture_show()["policy"]["cordon_enter_events"] == 4


def test_needs_a_restart_names_only_a_valid_change_that_cannot_apply_live(fleet_name):
    with running(_cfg(fleet_name)) as f:
        result = f.reload(_cfg(fleet_name, "tests.handlers:echo", events=9), env={})  # a valid new handler
        assert result == {"applied": ["posture"], "needs_restart": ["roles"]}
        assert f.submit("sq", 7).result(BOUND_S) == 49  # the running roles stay until a restart


def _log_lines(d: Fleetd, needle: str) -> list[str]:
    return [line for line in d.stderr().splitlines() if needle in line]


def test_sighup_refuses_a_handler_the_fork_server_cannot_resolve_in_one_line(fleet_name):
    bad = {"nosuch.module:f": REFUSED["nosuch.module:f"], "tests.handlers:nosuch": REFUSED["tests.handlers:nosuch"],
           "tests.handlers:_WARM": REFUSED["tests.handlers:_WARM"]}
    with Fleetd(fleet_name, _roles("tests.handlers:square"), posture={"cordon_enter_events": 4}) as d:
        workers = d.descendants()
        for n, (handler, why) in enumerate(bad.items(), start=1):
            d.write_config(_roles(handler), posture={"cordon_enter_events": 9})
            d.signal(signal.SIGHUP)
            d.wait_ready(count=n + 1)
            refusals = _log_lines(d, "reload refused, nothing changed: ConfigError: roles.sq.handler: ")
            assert len(refusals) == n and why in refusals[-1], (handler, refusals)
            assert d.ctl_json("posture", "show")["policy"]["cordon_enter_events"] == 4, handler
            # the requester's answer: systemctl status shows the STATUS= line
            assert "last reload refused: ConfigError: roles.sq.handler" in d.notify.messages[-1].get("STATUS", "")
        assert not _log_lines(d, "needs a restart") and "Traceback" not in d.stderr()
        wait_until(lambda: d.descendants() == workers, "no worker replaced, no checker left behind")
        d.write_config(_roles("tests.handlers:square"), posture={"cordon_enter_events": 9})
        d.signal(signal.SIGHUP)
        wait_until(lambda: _log_lines(d, "applied posture; needs a restart to change: nothing"), "the good reload")
        assert "last reload refused" not in d.notify.messages[-1].get("STATUS", "")
        with d.connect() as client:
            assert client.submit("sq", 5).result(BOUND_S) == 25
        d.signal(signal.SIGTERM)
        assert d.wait() == 0


def test_a_reload_while_the_fork_server_is_stopped_is_refused_within_its_bound(fleet_name, monkeypatch):
    import os

    from fleet.runtime.zygote_link import WorkerStartError

    monkeypatch.setattr("fleet.worker.zygote.CHECK_BOUND_S", 1)  # the answer is awaited 1 + 5 s
    with running(_cfg(fleet_name)) as f:
        zygote = f._sup.seats.workers.zygote.pid
        os.kill(zygote, signal.SIGSTOP)
        try:
            with pytest.raises(WorkerStartError, match="gave no answer to the handler check"):
                f.reload(_cfg(fleet_name, events=9), env={})
        finally:
            os.kill(zygote, signal.SIGCONT)
        assert f.posture_show()["policy"]["cordon_enter_events"] == 4  # nothing applied
        assert f.reload(_cfg(fleet_name, events=9), env={})["applied"] == ["posture"]  # answered again
        assert f.submit("sq", 3).result(BOUND_S) == 9


def test_a_checker_is_named_for_what_it_is_and_ended_past_its_bound(fleet_name, modules):
    import threading

    with running(_cfg(fleet_name)) as f:
        workers = _zygote_children(f)
        refused = []

        def reload_hanging():
            try:
                f.reload(_cfg(fleet_name, "reload_hangs:f"), env={})
            except ConfigError as exc:
                refused.append(exc)

        asker = threading.Thread(target=reload_hanging)
        asker.start()
        try:
            zygote = psutil.Process(f._sup.seats.workers.zygote.pid)
            forked = f"fleet-{fleet_name}-forkserver"  # what a fork carries until it names itself

            def named():
                out = []
                for p in zygote.children():
                    try:
                        if p.pid not in workers and p.cmdline()[:1] != [forked]:
                            out.append(p)
                    except psutil.Error:
                        pass  # gone meanwhile
                return out

            checker = wait_until(named, "the checker, named")[0]
            assert checker.cmdline()[0] == f"fleet-{fleet_name}-forkserver-check"  # never a second fork server
            assert checker.name() == "fleet-fscheck"
        finally:
            asker.join(BOUND_S)
        assert refused and "did not finish" in str(refused[0]), refused  # its bound (1 s here) ended it
        wait_until(lambda: _zygote_children(f) == workers, "the checker reaped")
