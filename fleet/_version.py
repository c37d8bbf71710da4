"""fleet's version, in one place: the package metadata (pyproject.toml reads it from here),
`fleet.__version__`, the table's meta that `fleetctl status` shows, and the numba cache
key. This module imports nothing, so that every wing may read it."""

__version__ = "0.1.0"
