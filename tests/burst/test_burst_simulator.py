"""The provider simulator over real HTTP on 127.0.0.1: 429 above K with Retry-After, the daily-limit
403 until its reset, a top-up reopening the key, 402 when credit is spent, and its own counts.

Its clock is a fake (trace time set by hand; a latency lasts `real()` of it), so the refusal
schedule is tested at exact trace instants and nothing here depends on timing."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from fleet.burst.simulator import DAILY_LIMIT_MESSAGE, ProviderSimulator, closed_intervals
from fleet.burst.trace import FORMAT, VERSION, parse_lines


class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.hold = 0.0  # real seconds every round is held (the 429 test holds them to overlap)

    def mono(self):
        return self.t

    def real(self, trace_s):
        return self.hold


def header(**extra):
    h = {"format": FORMAT, "version": VERSION, "name": "sim", "start": "2026-10-04T00:00:00Z", "seed": 7,
         "pools": [{"model": "m", "provider": "p", "k": 2, "retry_after_s": 7,
                    "latency": {"median_s": 5, "sigma": 0}}],
         "keys": [{"credential": "day", "daily_limit_at": [100], "reset": 50},
                  {"credential": "topped", "daily_limit_at": [100], "reset": "midnight", "top_ups": [130]},
                  {"credential": "credit", "credit_requests": 2, "top_ups": [500]}]}
    h.update(extra)
    return parse_lines([json.dumps(h)]).header


@pytest.fixture
def sim():
    clock = FakeClock()
    s = ProviderSimulator(header(), clock).start()
    s.fake_clock = clock
    try:
        yield s
    finally:
        s.stop()


def call(sim, credential, model="m", provider="p", round_id="r"):
    return httpx.post(f"{sim.base_url}/{provider}/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {credential}", "X-Burst-Round": round_id},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_a_clean_round_is_a_chat_completion(sim):
    r = call(sim, "day")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["x_latency_s"] == pytest.approx(5.0)  # sigma 0, 1 in flight: the median


def test_above_k_in_flight_is_429_with_retry_after(sim):
    sim.fake_clock.hold = 1.5
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(call(sim, "free", round_id=f"r{i}")))
               for i in range(2)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    for _ in range(300):  # both in flight before the third asks
        if sim.counts()["m@p"]["max_concurrency"] == 2:
            break
        deadline.wait(0.01)
    third = call(sim, "free", round_id="r3")
    for t in threads:
        t.join()
    assert third.status_code == 429 and third.headers["retry-after"] == "7"
    assert sorted(r.status_code for r in results) == [200, 200]
    c = sim.counts()["m@p"]
    assert c == {"requests": 3, "200": 2, "429": 1, "402": 0, "403": 0, "max_concurrency": 2}


def test_daily_limit_is_403_until_its_reset(sim):
    clock = sim.fake_clock
    for t, want in ((99.9, 200), (100.0, 403), (149.9, 403), (150.0, 200)):
        clock.t = t
        r = call(sim, "day")
        assert r.status_code == want, t
        if want == 403:
            assert r.json()["error"]["message"] == DAILY_LIMIT_MESSAGE
    clock.t = 120
    assert call(sim, "other-key").status_code == 200  # only that key is spent
    assert sim.counts()["m@p"]["403"] == 2


def test_a_top_up_reopens_the_key_before_midnight(sim):
    clock = sim.fake_clock
    clock.t = 110
    assert call(sim, "topped").status_code == 403
    clock.t = 130
    assert call(sim, "topped").status_code == 200


def test_midnight_reset_is_the_next_utc_midnight():
    h = header()
    spans = closed_intervals(h.keys[0].__class__("k", None, (53220.0,), "midnight"), h.start)
    assert spans == [(53220.0, 86400.0)]


def test_spent_credit_is_402_until_a_top_up(sim):
    clock = sim.fake_clock
    assert [call(sim, "credit", round_id=f"c{i}").status_code for i in range(3)] == [200, 200, 402]
    assert call(sim, "credit").status_code == 402
    clock.t = 500
    assert call(sim, "credit").status_code == 200
    assert sim.counts()["m@p"]["402"] == 2


def test_latency_is_drawn_per_round_from_the_seed():
    clock = FakeClock()
    h = header(pools=[{"model": "m", "provider": "p", "k": 5, "latency": {"median_s": 5, "sigma": 0.5}}])
    draws = []
    for _ in range(2):
        with ProviderSimulator(h, clock) as s:
            draws.append([call(s, "x", round_id=f"r{i}").json()["x_latency_s"] for i in range(3)])
    assert draws[0] == draws[1] and len(set(draws[0])) == 3


def test_bad_requests_are_refused_and_not_counted_as_rounds(sim):
    assert httpx.post(f"{sim.base_url}/p/v1/chat/completions", content=b"[1]", timeout=30).status_code == 400
    assert call(sim, "x", model="unknown").status_code == 404
    assert httpx.get(f"{sim.base_url}/p/v1/chat/completions", timeout=30).status_code == 404
    assert sim.counts()["m@p"]["requests"] == 0


# --- the simulator in its own process (what a replay runs) ------------------------------------------

def _gone(pid: int, bound_s: float = 30.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within `bound_s` (a liveness bound)."""
    import os
    import time

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_the_replay_clock_places_a_host_instant_on_trace_time():
    # the admission's clock protocol: a refusal a worker met at a host instant backs its pool off
    # from that trace second, not from the one its outcome was heard at
    from fleet.burst.clock import ReplayClock

    clock = ReplayClock(60.0, 0.0)
    clock.start(1000.0)
    assert clock.mono_of(1000.5) == 30.0  # half a real second after trace time 0, at 60 x
    assert clock.mono_of(clock.real_at(12.0)) == pytest.approx(12.0)


def test_the_simulator_process_serves_the_same_rules_on_the_drivers_clock():
    import time

    from fleet.burst.clock import ReplayClock
    from fleet.burst.simulator_process import SimulatorProcess

    h = header()
    clock = ReplayClock(1.0, h.start)
    sim = SimulatorProcess(h, clock).start()
    try:
        pid = sim._proc.pid
        clock.start(time.monotonic() - 120.0)  # trace second ~120: inside key "day"'s closure [100, 150)
        sim.reset()  # carries the clock's new origin to the child
        r = call(sim, "day")
        assert r.status_code == 403 and r.json()["error"]["message"] == DAILY_LIMIT_MESSAGE
        assert sim.counts()["m@p"] == {"requests": 1, "200": 0, "429": 0, "402": 0, "403": 1, "max_concurrency": 0}
        (event,) = sim.events()
        assert event[1:] == ("m@p", 403, 0) and 100 <= event[0] < 150
        assert sim.key_closures()["day"] == [(100.0, 150.0)]
        clock.start(time.monotonic())  # trace second ~0: the key is open again
        sim.reset()
        assert sim.counts()["m@p"]["requests"] == 0
    finally:
        sim.stop()
    assert _gone(pid)


def test_the_simulator_process_exits_when_the_replay_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import json, sys, time\n"
        "from fleet.burst.clock import ReplayClock\n"
        "from fleet.burst.simulator_process import SimulatorProcess\n"
        "from fleet.burst.trace import parse_lines\n"
        f"h = parse_lines([{json.dumps(json.dumps(header().raw))}]).header\n"
        "sim = SimulatorProcess(h, ReplayClock(1.0, h.start)).start()\n"
        "print(sim._proc.pid, flush=True)\n"
        "time.sleep(600)\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": repo})
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child, 0.5)  # it serves while the replay lives
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    assert _gone(child)
