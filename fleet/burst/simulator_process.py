"""The provider simulator in a process of its own, so it never shares the replay driver's GIL.

A replay at thousands of rounds a second makes the simulator parse, decide and answer
thousands of HTTP requests a second; in the driver's process that work would take the
interpreter from the thread that has to release arrivals on time. `SimulatorProcess`
runs the same `ProviderSimulator` (same rules, same seeded draws, same counts) in a
child ``python -m fleet.burst.simulator_process`` and offers the driver the same calls
(`start`, `stop`, `reset`, `counts`, `events`, `calls`, `key_closures`, `base_url`).

The two processes talk JSON lines over the child's stdin and stdout: first the header,
seed and clock; the child answers with the port it bound (127.0.0.1:0, ephemeral);
then one request line per call, one reply line each. Trace time crosses the boundary
as the clock's origin: the host monotonic clock is the same in every process, so
`reset` sends the driver's ``clock.t0`` and the child's clock runs from the same
instant at the same speed.

The child never outlives the replay: `stop` closes its stdin (the child stops serving
and exits) and kills it if it has not exited within `STOP_S`; if the replay process
dies instead, the child reads end-of-file on stdin and exits the same way. It ignores
SIGINT: a Ctrl-C reaches the whole process group, and the replay, which stops on it, stops
the child in its turn.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from fleet.burst.clock import ReplayClock
from fleet.burst.simulator import SimulatorError
from fleet.burst.trace import Header

START_S = 30.0
STOP_S = 10.0


class SimulatorProcess:
    """The driver's handle on a simulator child process (see the module docstring)."""

    def __init__(self, header: Header, clock: ReplayClock, *, seed: int | None = None):
        self.header, self.clock = header, clock
        self.seed = header.seed if seed is None else seed
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one request and its reply at a time

    def start(self) -> "SimulatorProcess":
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen([sys.executable, "-m", "fleet.burst.simulator_process"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        try:
            hello = self._call({"header": self.header.raw, "seed": self.seed, "speed": self.clock.speed,
                                "start_wall": self.clock.start_wall, "t0": self.clock.t0}, timeout=START_S)
        except SimulatorError:
            self.stop()
            raise
        if "port" not in hello:
            self.stop()
            raise SimulatorError(f"provider simulator could not listen on 127.0.0.1: {hello.get('error')}")
        self.port = int(hello["port"])
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Fresh counts and key usage, and the clock's current origin (call after ``clock.start``)."""
        self._call({"op": "reset", "t0": self.clock.t0})

    def counts(self) -> dict:
        return self._call({"op": "counts"})["counts"]

    def events(self) -> list[tuple]:
        return [tuple(e) for e in self._call({"op": "events"})["events"]]

    def calls(self) -> dict[str, list]:
        return {k: [tuple(x) for x in v] for k, v in self._call({"op": "calls"})["calls"].items()}

    def key_closures(self) -> dict[str, list[tuple[float, float]]]:
        return {k: [tuple(x) for x in v] for k, v in self._call({"op": "key_closures"})["key_closures"].items()}

    def _call(self, request: dict, timeout: float = START_S) -> dict:
        proc = self._proc
        if proc is None:
            raise SimulatorError("the provider simulator is not running")
        with self._lock:
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = _readline(proc, timeout)
            except OSError as exc:
                raise SimulatorError(f"the provider simulator went away: {exc}") from None
        if not line:
            raise SimulatorError(f"the provider simulator exited (status {proc.poll()})")
        return json.loads(line)


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One reply line, or '' if the child does not answer within `timeout` (it is then killed)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            return ""
    return proc.stdout.readline()


def _serve() -> int:
    """The child: serve the simulator until stdin ends."""
    import signal

    from fleet.burst.simulator import ProviderSimulator
    from fleet.burst.trace import parse_header

    # Ctrl-C reaches the whole process group: the replay stops on it and then closes our stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    setup = json.loads(sys.stdin.readline() or "null")
    if setup is None:
        return 0
    clock = ReplayClock(setup["speed"], setup["start_wall"])
    clock.t0 = setup["t0"]
    sim = ProviderSimulator(parse_header(setup["header"]), clock, seed=setup["seed"])
    out = sys.stdout

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        sim.start()
    except SimulatorError as exc:
        reply({"error": str(exc)})
        return 1
    try:
        reply({"port": sim.port})
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            if op == "reset":
                clock.t0 = req["t0"]
                sim.reset()
                reply({"ok": True})
            elif op == "counts":
                reply({"counts": sim.counts()})
            elif op == "events":
                reply({"events": sim.events()})
            elif op == "calls":
                reply({"calls": sim.calls()})
            elif op == "key_closures":
                reply({"key_closures": sim.key_closures()})
            else:
                reply({"error": f"unknown op {op!r}"})
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
