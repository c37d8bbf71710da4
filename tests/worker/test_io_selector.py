"""The I/O seat's selector: epoll waits whose timeouts are nanoseconds, not whole
milliseconds (fleet.worker.io.selector), and otherwise what `selectors.EpollSelector` reports.

Real epoll instances, pipes, socket pairs and signals. The precision is checked on
what the selector hands the kernel (with a fake clock where it reads one), never as a
wall-clock bound.
"""
from __future__ import annotations

import asyncio
import errno
import os
import selectors
import signal
import socket
import threading
import time
import types

import pytest

from fleet.worker.io import selector as io_selector
from fleet.worker.io.selector import PreciseEpollSelector, new_event_loop, timeout_ns
from tests.fleets import running, unique_name
from tests.runtime.test_io_roles import io_role

WAIT_S = 30.0  # a deadline: what a test waits for comes long before it


@pytest.fixture
def waits(monkeypatch):
    """The timeouts (ns) each wait handed the kernel; the real call still does the wait."""
    seen = []
    real = io_selector._wait

    def spy(epfd, out, max_events, ns):
        seen.append(ns)
        return real(epfd, out, max_events, ns)

    monkeypatch.setattr(io_selector, "_wait", spy)
    return seen


@pytest.fixture
def selector():
    sel = PreciseEpollSelector()
    yield sel
    sel.close()


def test_a_timeout_becomes_nanoseconds_rounded_up_never_to_a_whole_millisecond():
    assert timeout_ns(None) == -1
    assert timeout_ns(0) == 0 and timeout_ns(-3.0) == 0
    assert timeout_ns(0.0015) == 1_500_000
    assert timeout_ns(0.0100002) == 10_000_200  # epoll_wait would have waited 11 ms
    assert timeout_ns(0.4e-9) == 1  # a positive wait is never rounded down to a mere look
    assert timeout_ns(2) == 2_000_000_000


def test_the_kernel_gets_the_timeout_as_asked(selector, waits):
    assert selector.select(0.0015) == []  # nothing registered: the wait ends on its timeout
    assert waits == [1_500_000]
    assert selector.precise


def test_the_wait_lets_the_other_threads_of_the_process_run(selector, monkeypatch):
    """An I/O seat's plain handlers run on threads of the loop's process: the loop's
    wait must not hold the GIL. A thread that needs the GIL writes to the pipe the
    selector waits on once the wait has begun: a wait that held the GIL would see
    nothing until its timeout ran out."""
    r, w = os.pipe()
    waiting = threading.Event()
    real = io_selector._wait

    def wait(*args):
        waiting.set()
        return real(*args)

    def writer():
        waiting.wait(WAIT_S)
        time.sleep(0.05)  # off the GIL; to go on it needs it back, which only a wait that let go of it gives
        os.write(w, b"x")

    monkeypatch.setattr(io_selector, "_wait", wait)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        selector.register(r, selectors.EVENT_READ, "pipe")
        ready = [(key.data, events) for key, events in selector.select(WAIT_S)]
    finally:
        thread.join()
        os.close(r)
        os.close(w)
    assert ready == [("pipe", selectors.EVENT_READ)], "no other thread ran while the selector waited"


def test_an_asyncio_timer_is_waited_for_to_the_nanosecond(waits):
    loop = new_event_loop()
    try:
        assert isinstance(loop._selector, PreciseEpollSelector)
        loop.run_until_complete(asyncio.sleep(0.0123))
    finally:
        loop.close()
    # asyncio asks for what is left of the 12.3 ms: a fraction of a millisecond, not a ceiling
    assert any(ns > 0 and ns % 1_000_000 for ns in waits), waits


def test_readiness_is_reported_as_epoll_selector_reports_it(selector):
    r, w = os.pipe()
    a, b = socket.socketpair()
    plain = selectors.EpollSelector()
    try:
        for sel in (selector, plain):
            sel.register(r, selectors.EVENT_READ, "pipe")
            sel.register(a, selectors.EVENT_READ | selectors.EVENT_WRITE, "sock")

        def ready(sel):
            return sorted((key.data, events) for key, events in sel.select(0))

        assert ready(selector) == ready(plain) == [("sock", selectors.EVENT_WRITE)]
        os.write(w, b"x")
        b.send(b"y")
        assert ready(selector) == ready(plain) == [
            ("pipe", selectors.EVENT_READ), ("sock", selectors.EVENT_READ | selectors.EVENT_WRITE)]
        os.close(w)  # a hung-up pipe reads as readable (EOF), as with epoll_wait
        selector.unregister(a)
        plain.unregister(a)
        assert ready(selector) == ready(plain) == [("pipe", selectors.EVENT_READ)]
    finally:
        plain.close()
        os.close(r)
        a.close()
        b.close()


def test_more_ready_fds_than_one_wait_reports_come_in_the_next_waits(selector):
    pipes = [os.pipe() for _ in range(io_selector.MAX_EVENTS + 10)]
    try:
        for r, w in pipes:
            selector.register(r, selectors.EVENT_READ, r)
            os.write(w, b"x")
        first = selector.select(0)
        assert len(first) == io_selector.MAX_EVENTS
        seen = {key.data for key, _ in first}
        for key, _ in first:
            os.read(key.fd, 1)  # drained: level-triggered, they stop being ready
        rest = selector.select(0)
        assert {key.data for key, _ in rest} == {r for r, _ in pipes} - seen
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)


def test_a_signal_runs_its_handler_and_the_wait_goes_on_for_what_is_left(selector, monkeypatch):
    """A signal 10 ms into a 200 ms wait: its handler runs, then the kernel is asked for
    what is left by the selector's clock, a fake one that moves 20 ms per interrupted
    wait: exactly 180 ms."""
    clock = {"ns": 10**12}
    waits = []
    real = io_selector._wait

    def wait(epfd, out, max_events, ns):
        waits.append(ns)
        n = real(epfd, out, max_events, ns)
        if n == -errno.EINTR:
            clock["ns"] += 20_000_000
        return n

    monkeypatch.setattr(io_selector, "_wait", wait)
    monkeypatch.setattr(io_selector, "time", types.SimpleNamespace(monotonic_ns=lambda: clock["ns"]))
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        for _ in range(20):  # a signal that came before the wait began interrupted nothing: again
            waits.clear()
            fired.clear()
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            assert selector.select(0.2) == []
            if len(waits) > 1:
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert fired, "the handler ran"
    assert waits == [200_000_000, 180_000_000]  # waited again, for what was left


def test_a_signal_handler_that_raises_ends_the_wait_with_its_exception(selector):
    class Stop(Exception):
        pass

    def handler(*_):
        raise Stop

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(Stop):
            selector.select(5.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM])
def test_a_kernel_without_epoll_pwait2_gets_whole_millisecond_waits_from_then_on(selector, monkeypatch, caplog, err):
    """No kernel here lacks the call, so its refusal (old kernel: ENOSYS; a seccomp
    filter: EPERM) is injected at the one C call; the fallback is the stdlib's."""
    calls = []
    monkeypatch.setattr(io_selector, "_wait", lambda *args: calls.append(args) or -err)
    r, w = os.pipe()
    try:
        selector.register(r, selectors.EVENT_READ, "pipe")
        os.write(w, b"x")
        with caplog.at_level("INFO", logger="fleet.worker.io.selector"):
            assert [(k.data, e) for k, e in selector.select(0.001)] == [("pipe", selectors.EVENT_READ)]
        assert not selector.precise and len(calls) == 1
        assert "not offered" in caplog.text
        selector.select(0.001)
        assert len(calls) == 1  # not asked again
    finally:
        os.close(r)
        os.close(w)


def test_any_other_failure_is_raised_as_oserror(selector, monkeypatch):
    monkeypatch.setattr(io_selector, "_wait", lambda *args: -errno.EBADF)
    with pytest.raises(OSError) as info:
        selector.select(0.001)
    assert info.value.errno == errno.EBADF
    assert selector.precise


def test_a_process_that_set_its_own_loop_policy_keeps_it():
    class Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self):
            return asyncio.SelectorEventLoop(selectors.PollSelector())

    old = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(Policy())
    try:
        loop = new_event_loop()
        assert isinstance(loop._selector, selectors.PollSelector)
        loop.close()
    finally:
        asyncio.set_event_loop_policy(old)
    loop = new_event_loop()
    assert isinstance(loop._selector, PreciseEpollSelector)
    loop.close()


def test_an_io_seat_runs_its_units_on_the_precise_selector():
    cfg = {"fleet": {"name": unique_name("iosel")}, "roles": {"io": io_role("loop_selector", slots=4)}}
    with running(cfg) as f:
        assert f.submit("io").result(timeout=120) == "PreciseEpollSelector"
