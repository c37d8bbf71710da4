"""fleetd's inlets: the batches service clients push into shared memory
(`fleet.shm.inlet`), taken and admitted by the supervisor's loop itself.

An inlet is opened on a client's submit connection (``open_inlet``) and lives as long
as it. At every turn the loop calls `Inlets.take` (`Supervisor.add_feed`), which takes
every batch waiting in every inlet and, for each, does what fleetd's control thread does
for a ``submit_batch`` v2 frame: the same rules (`SubmitBatchOp.check_plain`: the rules
`SubmitBatchOp.validate` applies, on units the ring typed already), the same
admission (`SubmitBatchOp.on_daemon`, which attaches the token's outcomes to the
connection), and the same reply, written on the connection (`control.Stream.write`) from
the loop's thread. So a batch's reply, its refusals and its outcomes are a frame's, and
the client reads them as such; only the way in differs.

An inlet whose ring makes no sense (its words, a frame's length, a message that does not
parse: a client writing anything but what `fleet.shm.inlet` says) is closed, and its
connection told so with an error frame of no request id, which a client takes as the
end of that connection; the batches it pushed before are admitted or answered already.
The connection stays the client's to close (its frames still go), as with any bad frame.

Thread-safety. The loop alone reads the inlets and closes them; the control thread
opens them and marks them gone when their connection closes. The set is a tuple
replaced whole under a lock, read by the loop without one.
"""
from __future__ import annotations

import logging
import threading

from fleet.service.control.errors import E_INTERNAL, E_INVALID_ARGS, ProtocolError
from fleet.service.control.ops.units import BATCH_VERSION, SubmitBatchOp
from fleet.service.control.server import ControlServer
from fleet.service.control.wire import encode_error
from fleet.shm import inlet as inlet_mod

log = logging.getLogger(__name__)

#: Most inlets open at once: each is a memfd of `inlet_mod.CAPACITY` bytes (its pages
#: touched only as far as its longest backlog); past this a client's batches go as frames.
MAX_INLETS = 256


class InletRefused(ProtocolError):
    """No inlet for this connection (one is open on it already, or fleetd holds its most)."""

    def __init__(self, message: str):
        super().__init__(E_INVALID_ARGS, message)


class _Open:
    __slots__ = ("inlet", "stream", "gone")

    def __init__(self, inlet, stream):
        self.inlet, self.stream, self.gone = inlet, stream, False


class Inlets:
    """The inlets of one fleetd (``daemon``: its served operations and its supervisor,
    started: its loop takes them from the next turn on, `Supervisor.add_feed`)."""

    def __init__(self, daemon, most: int = MAX_INLETS):
        self._daemon = daemon
        self._most = most
        self._lock = threading.Lock()
        self._open: tuple = ()  # read by the loop without the lock (replaced whole)
        self._op = SubmitBatchOp()
        self._replies: list = []  # (stream, reply frame) of the batches taken this turn (`flush`)
        self.taken = 0  # batches taken through inlets (how many went this way)
        daemon.sup.add_feed(self.take)

    def open(self, stream) -> inlet_mod.Inlet:
        """An inlet for the connection of ``stream`` (control thread: `OpenInletOp`)."""
        with self._lock:
            if any(one.stream is stream for one in self._open):
                raise InletRefused("open_inlet: this connection has its inlet already")
            if len(self._open) >= self._most:
                raise InletRefused(f"open_inlet: fleetd holds its most inlets ({self._most}); "
                                   "submit with frames")
            inlet = inlet_mod.Inlet.make()
            entry = _Open(inlet, stream)
            self._open = (*self._open, entry)
        stream.on_close(lambda: self._gone(entry))
        return inlet

    def _gone(self, entry: _Open) -> None:
        """Its connection closed (control thread): the loop closes the inlet at its next
        turn, after taking what it still holds (the client pushed it: its outcomes are
        held for the token's `collect`)."""
        entry.gone = True
        # a turn at once (a loop that has stopped turns the post away: `close` frees it)
        self._daemon.sup.door.intake.post(self.take)

    def take(self) -> None:
        """Every batch waiting in every inlet, admitted and answered (the loop, each turn)."""
        for entry in self._open:
            if not entry.gone and not entry.stream.room():
                # Its client does not read its replies: its batches wait in its ring (full,
                # its next ones go as frames, which the control thread holds back alike),
                # never in fleetd's memory.
                continue
            try:
                batch = entry.inlet.take()
                for tag, view in batch:
                    if tag != inlet_mod.BATCH:
                        raise inlet_mod.InletError(f"a message of tag {tag} (an inlet carries {inlet_mod.BATCH})")
                    self._batch(entry, view)
            except Exception as exc:  # noqa: BLE001 - one inlet's fault (or bug) must not stop the loop that serves all
                written_wrong = isinstance(exc, inlet_mod.InletError)
                log.warning("fleetd: closed a client's inlet: %s", exc, exc_info=not written_wrong)
                code = E_INVALID_ARGS if written_wrong else E_INTERNAL
                self._replies.append((entry.stream, encode_error(None, code, f"inlet closed: {exc}")))
                self._close(entry)
                continue
            if entry.gone:
                self._close(entry)

    def _batch(self, entry: _Open, view) -> None:
        """One batch: checked, admitted and answered as a ``submit_batch`` v2 frame is. Its
        units come typed from the ring (`inlet_mod.decode`), so the check is the rules alone
        (`SubmitBatchOp.check_plain`), and the admission is the op's own (`on_daemon`), run
        here: a batch crosses no frame's machinery (no schema, no call, no served method)."""
        rid, token, ack, fds, parcels, units = inlet_mod.decode(view)
        self.taken += 1
        op = self._op
        try:
            checked = op.check_plain(token, ack, units)
            if checked is None:  # a unit the plain rule does not take: the whole check says what
                checked = op.validate({"v": BATCH_VERSION, "token": token, "ack": ack, "fds": fds,
                                       "parcels": parcels,
                                       "units": [{"role": role, "payload": payload, "encoding": "pickle", "seq": seq}
                                                 for seq, role, payload in units]})["units"]
        except ProtocolError as exc:
            reply = encode_error(rid, exc.code, exc.message)
        else:
            reply = ControlServer.reply_of(rid, op.name, op.on_daemon, self._daemon, BATCH_VERSION, token, checked,
                                           ack, fds, parcels, entry.stream)
        self._replies.append((entry.stream, reply))

    def flush(self) -> None:
        """Write the replies of the batches taken this turn (the loop, at the end of its
        turn: `Books.on_delivered`): after the turn granted and sent their units, so the
        units are on their way before a client's reader is woken for the replies."""
        replies = self._replies
        if not replies:
            return
        self._replies = []
        for stream, reply in replies:
            stream.write(lambda reply=reply: reply)

    def _close(self, entry: _Open) -> None:
        with self._lock:
            self._open = tuple(one for one in self._open if one is not entry)
        entry.inlet.close()

    def close(self) -> None:
        """fleetd stops (its loop has): every inlet freed."""
        with self._lock:
            entries, self._open = self._open, ()
        for entry in entries:
            entry.inlet.close()

    def __len__(self) -> int:
        return len(self._open)
