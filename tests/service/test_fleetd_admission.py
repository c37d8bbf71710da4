"""The provider admission through fleetd: submit with a route over the socket, `fleetctl
admission show|close|reopen`, the bulkheads in `fleetctl status`, and closures that survive
a restart (the closure file in fleetd's state directory)."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest

import fleet
from fleet.service.control import PermissionDenied
from fleet.rules.errors import EXIT_NO_PERMISSION, EXIT_USAGE
from tests.daemons import BOUND_S, Fleetd, to_toml
from tests.uids import as_nobody

NOBODY = 65534
P1, P2 = fleet.Route("m1", "p1"), fleet.Route("m1", "p2")
DAILY = {"p1": [403, "Key limit exceeded (daily limit)", None]}


def _text(name: str) -> str:
    roles = {"llm": {"kind": "pooled", "handler": "tests.provider_handlers:call", "slots": 2, "peak_cpus": 1}}
    return to_toml({"fleet": {"name": name}, "roles": roles}) + (
        '[admission]\nprobe_every = 3600\nmax_refusals = 1\n'
        '[admission.alternatives]\nm1 = ["m1@p2"]\n'
        '[admission.providers.p1]\nmodels = ["m1"]\n'
        '[admission.providers.p2]\nmodels = ["m1"]\n'
        '[admission.lanes.stay]\npinned = true\n')


def _daemon(name: str, base_dir: str | None = None, args: tuple = ()) -> Fleetd:
    d = Fleetd(name, {}, base_dir=base_dir, args=args)
    d.write_config({}, text=_text(name))
    return d


def test_a_refusal_over_the_socket_closes_the_provider_and_the_closure_survives_a_restart(fleet_name):
    base = tempfile.mkdtemp(prefix="fd-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    os.chmod(base, 0o755)
    try:
        with _daemon(fleet_name, base_dir=base) as d:
            with d.connect() as client:
                with pytest.raises(fleet.UnitFailed) as info:
                    client.submit("llm", DAILY, route=P1).result(BOUND_S)
                assert info.value.reason == "Refused"
                # the same model on the other provider: admission moved it, the handler called that
                assert client.submit("llm", DAILY, route=P1).result(BOUND_S) == str(P2)
            (closure,) = d.ctl_json("admission", "show")["closures"]
            assert (closure["provider"], closure["cause"], closure["daily"]) == ("p1", "daily-limit", True)
            status = d.ctl("status")
            line = next(x for x in status.stdout.splitlines() if x.strip().startswith("m1@p1"))
            assert "closed (daily limit)" in line
            assert os.path.exists(os.path.join(base, "state", f"{fleet_name}.closures.json"))
            d.signal(signal.SIGTERM)
            assert d.wait() == 0
        with _daemon(fleet_name, base_dir=base) as again:
            (closure,) = again.ctl_json("admission", "show")["closures"]
            assert closure["provider"] == "p1"  # born with it: the spent key is not spent again
            with again.connect() as client:
                pinned = client.submit("llm", {}, route=P1, lane="stay")  # hard-pinned: it waits
                out = again.ctl("admission", "reopen", "p1")
                assert out.returncode == 0 and "p1: reopened" in out.stdout
                assert pinned.result(BOUND_S) == str(P1)
            assert again.ctl_json("admission", "show")["closures"] == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_operator_close_and_its_typed_refusals(fleet_name):
    with _daemon(fleet_name, args=("--socket-group", str(NOBODY))) as d:
        out = d.ctl("admission", "close", "nope", "--until", "+1h")
        assert out.returncode == 1 and "BadPool" in out.stderr and "unknown pool 'nope'" in out.stderr
        out = d.ctl("admission", "close", "p1", "--until", "2001-01-01")
        assert out.returncode == 1 and "BadPool" in out.stderr
        # named as typed (and in UTC), not as the epoch seconds it was parsed to
        assert "--until '2001-01-01' (2001-01-01T00:00:00Z) is not in the future" in out.stderr, out.stderr
        assert "978307200" not in out.stderr
        out = d.ctl("admission", "close", "p1", "--until", "tomorrow")
        assert out.returncode == EXIT_USAGE and "--until 'tomorrow'" in out.stderr
        out = d.ctl("admission", "close", "p1@x", "--until", "+1h")
        assert out.returncode == EXIT_USAGE and "InvalidArgs" in out.stderr
        for endless in ("inf", "nan", "1e400"):  # a closure ends: the host-group store refuses one that never does
            out = d.ctl("admission", "close", "p1", "--until", endless)
            assert out.returncode == EXIT_USAGE and "finite" in out.stderr, out.stderr
        assert d.ctl_json("admission", "show")["closures"] == []  # nothing changed

        out = d.ctl("admission", "close", "p1/key-a", "--until", "+35m", "--message", "rotating the key")
        assert out.returncode == 0 and "p1/key-a: closed until" in out.stdout
        (closure,) = d.ctl_json("admission", "show")["closures"]
        assert (closure["credential"], closure["cause"], closure["message"]) == ("key-a", "operator",
                                                                                "rotating the key")

        def child():
            client = d.connect()
            try:
                client.admission_reopen("p1/key-a")
                return "allowed"
            except PermissionDenied as exc:
                return [type(exc).__name__, exc.exit_code]
            finally:
                client.close()

        os.environ["RUNTIME_DIRECTORY"] = d.runtime_dir
        try:
            assert as_nobody(child) == ["PermissionDenied", EXIT_NO_PERMISSION]
        finally:
            del os.environ["RUNTIME_DIRECTORY"]
        assert len(d.ctl_json("admission", "show")["closures"]) == 1  # still closed

        # the provider's daily budget reading, fed over the socket (owner only): shown on its pools
        with d.connect() as client:
            from fleet.service.control import RemoteError

            with pytest.raises(RemoteError) as info:
                client.report_budget("nope", 1.0, 10.0)
            assert info.value.type == "BadBudget"
            assert client.report_budget("p2", 2.5, 10.0) == {"provider": "p2", "spent": 2.5, "limit": 10.0}
            assert client.submit("llm", {}, route=P2, age=3600).result(BOUND_S) == str(P2)  # age= travels too
            with pytest.raises(fleet.BadUnit, match="age"):
                client.submit("llm", {}, route=P2, age=-1).result(BOUND_S)
        row = next(b for b in d.ctl_json("admission", "show")["bulkheads"] if b["pool"] == str(P2))
        assert (row["budget_spent"], row["budget_limit"]) == (2.5, 10.0)


def test_fleetctl_admission_budget_feeds_the_reading_and_its_typed_refusals(fleet_name):
    # a bad amount or provider changes nothing; the reading is shown; the limit reached closes the provider
    with _daemon(fleet_name) as d:
        with d.connect() as client:  # a pool the admission knows: the reading shows on its row
            assert client.submit("llm", {}, route=P2).result(BOUND_S) == str(P2)
        for bad, code, says in (("-1", EXIT_USAGE, "finite amount"), ("nan", EXIT_USAGE, "finite amount")):
            out = d.ctl("admission", "budget", "p2", "--spent", bad)
            assert out.returncode == code and says in out.stderr, out.stderr
        out = d.ctl("admission", "budget", "nope", "--spent", "1")
        assert out.returncode == 1 and "BadBudget" in out.stderr
        out = d.ctl("admission", "budget", "p2", "--spent", "3.5", "--limit", "10")
        assert out.returncode == 0 and out.stdout == "p2: spent 3.5 today, limit 10\n", out
        row = next(b for b in d.ctl_json("admission", "show")["bulkheads"] if b["pool"] == str(P2))
        assert (row["budget_spent"], row["budget_limit"], row["state"]) == (3.5, 10.0, "open")
        assert d.ctl("admission", "budget", "p2", "--spent", "10", "--limit", "10").returncode == 0
        (spent,) = [c for c in d.ctl_json("admission", "show")["closures"] if c["provider"] == "p2"]
        assert (spent["cause"], spent["daily"]) == ("budget", True)


def test_fleetctl_admission_show_json_carries_the_coordinators_read_model(fleet_name):
    import time

    with _daemon(fleet_name) as d:
        assert d.ctl("admission", "close", "p1", "--until", "+1h").returncode == 0
        with d.connect() as client:
            before = time.time()
            waiting = client.submit("llm", {}, route=P1, lane="stay")  # pinned lane, closed pool: it waits
            for _ in range(200):  # the loop admits it on its next turn
                model = d.ctl_json("admission", "show")
                if any(r["waiting"] for r in model["lanes"]):
                    break
                time.sleep(0.05)
            after = time.time()
            (row,) = [r for r in model["lanes"] if (r["lane"], r["pool"]) == ("stay", str(P1))]
            assert row["waiting"] == 1 and before <= row["oldest_waiting_since"] <= after  # a time (UTC epoch)
            assert (row["guaranteed"], row["borrowed"], row["bound"]) == (0, 0, None)
            (pool,) = [b for b in model["bulkheads"] if b["pool"] == str(P1)]
            assert (pool["slow_start"], pool["free"], pool["state"]) == (True, 1, "closed")
            assert not waiting.done() and waiting.cancel()  # (a client waits for its units at its end)
