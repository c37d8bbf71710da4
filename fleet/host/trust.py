"""Whom a client believes: the uids whose daemons, tables and socket directories it trusts.

Any local user may start a fleetd under a name nobody else uses yet, or make a directory
a lookup goes through (``/tmp/fleet-0``) before its owner does. A client that followed
either would unpickle whatever that user's workers send back, in the client's process.
So a client believes only what belongs to its own uid, to root, or to a uid it was told
to trust (``fleet.connect(name, trust_uids=...)``, ``fleetctl --trust-uid``):

* the daemon at the other end of its socket (SO_PEERCRED), checked before a byte is
  sent to it or read from it;
* the shared table it reads a socket path or a status from (the segment's owner),
  checked before anything in it is read;
* every directory on the way to a socket it looks up (`fleet.service.control.paths`).

A refusal is `UntrustedPeer`, naming what was refused and the uid it belongs to.
This module imports nothing but the error base, so every room may use it.
"""
from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from fleet.rules.errors import EXIT_UNTRUSTED_PEER, EXIT_USAGE, FleetError

#: Largest uid the kernel hands out: uid_t is 32 bits and (uid_t)-1 means "no uid".
MAX_UID = 2**32 - 2


class UntrustedPeer(FleetError):
    """A daemon, table or socket directory belongs to a uid this client does not trust
    (or is a directory others may write); nothing was sent to it or read from it.

    ``what`` names the refused thing (e.g. ``fleet daemon at /run/fleet/a.sock (pid 7)``),
    ``uid`` the uid it belongs to.
    """

    exit_code = EXIT_UNTRUSTED_PEER

    def __init__(self, what: str, uid: int, why: str):
        self.what, self.uid = what, uid
        super().__init__(f"refusing {what} (uid {uid}): {why}")


class InvalidTrust(FleetError, ValueError):
    """A uid given to trust is not a uid."""

    exit_code = EXIT_USAGE


def trusted_uids(extra: Iterable[int] = (), *, euid: int | None = None) -> frozenset[int]:
    """Our euid, root, and ``extra`` (each an int in [0, MAX_UID]; else InvalidTrust)."""
    if isinstance(extra, (str, bytes, int)):
        raise InvalidTrust(f"trust_uids must be a collection of uids, not {type(extra).__name__} {extra!r}")
    uids = set()
    for uid in extra:
        if type(uid) is not int or not 0 <= uid <= MAX_UID:
            raise InvalidTrust(f"trust_uids: {uid!r} is not a uid (an int in [0, {MAX_UID}])")
        uids.add(uid)
    return frozenset({os.geteuid() if euid is None else euid, 0, *uids})


def check_owner(what: str, uid: int, trusted: Collection[int]) -> None:
    """Raise UntrustedPeer unless ``uid`` (the owner of ``what``) is in ``trusted``."""
    if uid not in trusted:
        raise UntrustedPeer(what, uid, f"trusted are only uids {', '.join(map(str, sorted(trusted)))} "
                                       "(ours, root, and those given in trust_uids or --trust-uid)")
