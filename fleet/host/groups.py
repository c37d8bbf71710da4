"""Which group a name or number means: the one rule the shared-memory segments and the
control socket both use for ``--socket-group`` (pure; no fleet imports)."""
from __future__ import annotations

import grp


def resolve_gid(group: int | str) -> int:
    """The gid of a group given by number or name; ValueError saying what is wrong."""
    if isinstance(group, int) and not isinstance(group, bool):
        if group < 0:
            raise ValueError(f"group id {group} is not valid")
        return group
    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"group {group!r} does not exist") from None
    raise ValueError(f"group must be a name or a gid, got {type(group).__name__}")
