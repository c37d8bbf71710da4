"""The reload path under generated configs (hypothesis), against real running fleets: an
embedded Fleet reloading a TOML file, and a fleetd on SIGHUP. Whatever the file holds,
the reload never crashes the fleet; it is applied, or refused with a typed error naming
why; a refused one leaves the running config as it was; and an applied one is one a boot
would take (its handlers resolve, its declared peaks fit), the oracle that catches a reload
that waves through a file a restart would refuse. Example counts are bounded so each test
runs in seconds."""
from __future__ import annotations

import signal
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.rules.errors import FleetError
from fleet.runtime.config import load_config
from tests.daemons import BOUND_S, Fleetd, to_toml, wait_until
from tests.fleets import config, role, running

#: Handlers a boot resolves for any role; for an I/O-bound role only; for none.
GOOD = ("tests.handlers:square", "tests.handlers:echo", "tests.handlers:noop")
GOOD_IF_IO = ("tests.io_handlers:sleep_async",)
BAD = ("tests.handlers:nosuch", "nosuch_module:f", "tests.handlers:_WARM", "tests:handlers", "not a handler", "")

#: Numbers around and far past the ranges, and things that are not numbers.
junk_numbers = st.one_of(
    st.integers(-3, 0), st.sampled_from([1025, 4097, 10**6, 2**63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(), st.text(string.digits, max_size=3),
)
#: A valid role, as boot takes it.
roles_ok = st.fixed_dictionaries(
    {"handler": st.sampled_from(GOOD)},
    optional={"kind": st.sampled_from(["pooled", "pinned"]), "slots": st.integers(1, 4),
              "peak_cpus": st.sampled_from([1, 2]), "queue_bound": st.integers(1, 1000),
              "io_bound": st.booleans(), "lookahead": st.integers(0, 16),
              "cordon_class": st.sampled_from(["never", "floor", "deferrable"])},
)
#: What is wrong with a file, one thing at a time: (section, key, value) set in it (a
#: role's in each role), or None. A handler a boot refuses, a peak no host here has, an
#: async handler (good only on an I/O-bound role), any field out of range or of a wrong type.
faults = st.one_of(
    st.none(),
    st.tuples(st.just("roles"), st.just("handler"), st.sampled_from(BAD + GOOD_IF_IO)),
    st.tuples(st.just("roles"), st.just("peak_cpus"), st.just(1000)),
    st.tuples(st.just("roles"), st.sampled_from(["slots", "peak_cpus", "queue_bound", "lookahead", "timeout_s",
                                                 "io_bound", "kind", "cordon_class", "colour"]),
              st.one_of(junk_numbers, st.sampled_from(["keyed", "", "sometimes"]))),
    st.tuples(st.sampled_from(["posture", "fleet", "limits", "budget", "nonsense"]),
              st.sampled_from(["cordon_enter_events", "cordon_duty_percent", "cpus", "profile", "max_payload_bytes",
                               "sq", "oversubscribe", "x"]), st.one_of(junk_numbers, st.just("turbo"))),
)


def configs(name: str):
    """A config dict around the running one (role ``sq``): valid, or with one thing wrong."""
    @st.composite
    def build(draw):
        cfg = {"fleet": {"name": name},
               "roles": draw(st.dictionaries(st.sampled_from(["sq", "other"]), roles_ok, min_size=1, max_size=2)),
               "posture": {"cordon_enter_events": draw(st.integers(1, 10))}}
        fault = draw(faults)
        if fault is not None:
            section, key, value = fault
            for table in (cfg["roles"].values() if section == "roles" else [cfg.setdefault(section, {})]):
                table[key] = value
        return cfg
    return build()


def texts(name: str):
    """The file's text: a generated config as TOML; now and then cut short or with junk after it."""
    toml = configs(name).map(to_toml)
    return st.one_of(
        toml, toml, toml,
        st.tuples(toml, st.integers(0, 400)).map(lambda t: t[0][:t[1]]),
        st.tuples(toml, st.text(max_size=20)).map(lambda t: t[0] + t[1]),
    )


def would_boot(cfg) -> bool:
    """Whether a boot would take an accepted file (the oracle): every handler is one it
    resolves, and the declared peaks fit (1000 cores fits no host here)."""
    if not cfg.budget.oversubscribe and sum(r.peak_cpus or 0 for r in cfg.roles) >= 1000:
        return False
    for fields in cfg.roles:
        handler = fields.handler
        io_ok = handler in GOOD_IF_IO and fields.io_bound
        if handler is not None and handler not in GOOD and not io_ok:
            return False
    return True


FUZZ = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _base(name: str) -> dict:
    return config(name, {"sq": role("square", slots=2)}, posture={"cordon_enter_events": 4})


def _state(f) -> tuple:
    return f.posture_show()["policy"], [(r.name, r.queue_bound) for r in f._sup.roles], f.config


def test_an_embedded_fleet_reloads_any_file_to_applied_or_a_typed_refusal(fleet_name, tmp_path):
    path = str(tmp_path / "fleet.toml")
    seen = {"applied": 0, "refused": 0}
    with running(_base(fleet_name)) as f:

        @FUZZ
        @given(text=texts(fleet_name))
        def reload_one(text):
            with open(path, "w") as out:
                out.write(text)
            before = _state(f)
            try:
                result = f.reload(path, env={})
            except FleetError as exc:  # refused: typed, with a reason, and nothing changed
                assert str(exc).strip(), type(exc).__name__
                assert _state(f) == before, str(exc)
                seen["refused"] += 1
                return
            assert set(result) == {"applied", "needs_restart"}, result
            assert all(isinstance(x, str) for x in result["applied"] + result["needs_restart"]), result
            assert would_boot(load_config(path, env={})), (text, result)
            seen["applied"] += 1

        reload_one()
        assert seen["applied"] and seen["refused"], seen  # both outcomes were exercised
        assert f.submit("sq", 6).result(BOUND_S) == 36  # and the fleet serves on


# ------------------------------------------------------------------ fleetd on SIGHUP
def _outcomes(d: Fleetd) -> list[str]:
    """fleetd's one line per reload: refused with why, or what it applied."""
    return [line for line in d.stderr().splitlines() if " fleet.service.daemon: " in line
            and ("reload refused, nothing changed: " in line or ": reload from " in line)]


def test_fleetd_answers_every_sighup_with_one_line_and_keeps_running(fleet_name):
    with Fleetd(fleet_name, {"sq": role("square", slots=2)}, posture={"cordon_enter_events": 4}) as d:
        count = {"n": 0}

        @settings(FUZZ, max_examples=25)
        @given(text=texts(fleet_name))
        def sighup(text):
            d.write_config({}, text=text)
            count["n"] += 1
            d.signal(signal.SIGHUP)
            d.wait_ready(count=count["n"] + 1)  # READY=1 again: the reload was handled
            lines = wait_until(lambda: len(_outcomes(d)) >= count["n"] and _outcomes(d), "the reload's line")
            assert len(lines) == count["n"], lines[-2:]  # exactly one line for this reload
            line = lines[-1]
            if "reload refused" in line:
                assert line.split("reload refused, nothing changed: ", 1)[1].split(": ", 1)[1].strip(), line
            else:  # applied: a file a boot would take
                assert would_boot(load_config(d.config_path, env={})), (text, line)
            assert d.proc.poll() is None and "Traceback" not in d.stderr(), d.stderr()[-2000:]

        sighup()
        assert " ERROR " not in d.stderr(), d.stderr()[-2000:]
        with d.connect() as client:
            assert client.submit("sq", 5).result(BOUND_S) == 25
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
