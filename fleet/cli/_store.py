"""What the store commands share: which store, opened how.

The store is named by ``--store URL``, else by ``$FLEET_STORE__URL`` (the
environment form of the config's ``[store] url``). Operator commands never create
a store: a url with no store behind it is StoreUnreachable (exit 90).
"""
from __future__ import annotations

import os
import socket

from fleet.rules.errors import EXIT_USAGE, FleetError

STORE_ENV = "FLEET_STORE__URL"


class NoStoreUrl(FleetError, ValueError):
    """Neither ``--store`` nor ``$FLEET_STORE__URL`` names a store."""

    exit_code = EXIT_USAGE


def add_store_argument(parser) -> None:
    parser.add_argument("--store", default=None, metavar="URL",
                        help=f"the store: sqlite:///path or postgresql://... (default: ${STORE_ENV})")


def store_url(args, env=None) -> str:
    env = os.environ if env is None else env
    url = args.store or env.get(STORE_ENV)
    if not url:
        raise NoStoreUrl(f"no store named: pass --store URL or set {STORE_ENV}")
    return url


def open_for_operator(args):
    """The store named by `args`, opened as ``fleetctl@HOST`` without creating it."""
    from admission.store import open_store

    return open_store(store_url(args), actor=f"fleetctl@{socket.gethostname()}", create=False)
