"""The shared-memory lifecycle both segments use (fleet.shm.segments): modes, names that cannot
collide across fleets, and a reclaim that only unlinks a stale segment of its own kind
and fleet. Real segments throughout; the uid checks are in test_shm_access.py."""
from __future__ import annotations

import gc
import logging
import os
import stat
import struct
import time

import posix_ipc
import pytest

from fleet.shm import dataplane as dp
from fleet.shm import segments as shm
from fleet.shm.dataplane import DataSegment
from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm.table import SlotTable, TableCorrupt, TableError, TableInUse
from fleet.shm.table import segment as seg
from tests.uids import NOGROUP, unused_gid

TABLE, DATA = seg.KIND, dp.KIND
KINDS = {"table": TABLE, "data": DATA}


def _create(kind, name, **kwargs):
    if kind is TABLE:
        return SlotTable.create(name, REFERENCE_ROLES, 2, **kwargs)
    return DataSegment.create(name, 1, 4096, 4096, **kwargs)


def _mode(path):
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _raw(path):
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------------------ modes


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o777])
@pytest.mark.parametrize("kind", KINDS)
def test_segments_are_owner_only_whatever_the_umask(fleet_name, kind, umask):
    old = os.umask(umask)
    try:
        made = _create(KINDS[kind], fleet_name)
    finally:
        os.umask(old)
    try:
        assert _mode(shm.path(fleet_name, KINDS[kind])) == (0o600, os.geteuid(), os.getegid())
    finally:
        made.close()


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_the_table_readers_group_may_read_it(fleet_name, umask):
    gid = unused_gid()
    old = os.umask(umask)
    try:
        table = SlotTable.create(fleet_name, REFERENCE_ROLES, 2, readers_group=gid)
    finally:
        os.umask(old)
    with table:
        assert _mode(shm.path(fleet_name, TABLE)) == (0o640, os.geteuid(), gid)


def test_a_readers_group_by_name(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2, readers_group="nogroup"):
        assert _mode(shm.path(fleet_name, TABLE))[2] == NOGROUP


def test_an_unknown_group_is_refused_and_leaves_nothing(fleet_name):
    with pytest.raises(TableError, match="group 'no-such-group-here' does not exist"):
        SlotTable.create(fleet_name, REFERENCE_ROLES, 2, readers_group="no-such-group-here")
    assert not shm.exists(fleet_name, TABLE)


def test_the_data_segment_is_never_given_to_a_group(fleet_name):
    with pytest.raises(dp.DataPlaneError, match="never shared with a group"):
        shm.create(fleet_name, DATA, 4096, readers_group=unused_gid())
    assert not shm.exists(fleet_name, DATA)


@pytest.mark.parametrize("kind, group", [("table", None), ("table", "gid"), ("data", None)])
def test_access_is_final_before_the_segment_has_a_size(fleet_name, monkeypatch, kind, group):
    """No window: created owner-only, group then mode set on the fd while it is still empty."""
    gid = unused_gid() if group else None
    seen = []

    def spy(call, real):
        def wrapped(fd, *args):
            st = os.fstat(fd)
            seen.append((call, stat.S_IMODE(st.st_mode), st.st_gid, st.st_size))
            return real(fd, *args)

        return wrapped

    for call in ("fchown", "fchmod", "ftruncate"):
        monkeypatch.setattr(os, call, spy(call, getattr(os, call)))
    old = os.umask(0)  # nothing narrows the create mode: what the code asks for is what it gets
    try:
        made = _create(KINDS[kind], fleet_name, **({"readers_group": gid} if gid else {}))
    finally:
        os.umask(old)
    made.close()
    me = os.getegid()
    if gid is None:
        assert seen == [("fchmod", 0o600, me, 0), ("ftruncate", 0o600, me, 0)]
    else:
        assert seen == [("fchown", 0o600, me, 0), ("fchmod", 0o600, gid, 0), ("ftruncate", 0o640, gid, 0)]


def _mappings(path):
    with open("/proc/self/maps") as f:
        return [line.split()[1] for line in f if line.rstrip().endswith(path)]


def test_a_read_only_attach_maps_read_only(fleet_name):
    SlotTable.create(fleet_name, REFERENCE_ROLES, 2).close()
    gc.collect()  # the owner's numpy views went with it
    path = shm.path(fleet_name, TABLE)
    assert _mappings(path) == []
    reader = seg.attach(fleet_name, writable=False)
    try:
        assert _mappings(path) == ["r--s"]
    finally:
        reader.close()
    writer = seg.attach(fleet_name, writable=True)
    try:
        assert _mappings(path) == ["rw-s"]  # the check can tell them apart
    finally:
        writer.close()


# ------------------------------------------------------------ names across fleets


def test_a_fleet_named_like_another_fleets_data_segment_cannot_touch_it(fleet_name):
    """Fleet 'qa6.data' once "reclaimed" live fleet qa6's data segment as a stale table."""
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2):
        data = DataSegment.create(fleet_name, 1, 4096, 4096)
        try:
            data.tasks(0).push(7, b"the live fleet's payload")
            path = shm.path(fleet_name, DATA)
            before, inode = _raw(path), os.stat(path).st_ino
            with pytest.raises(ValueError):  # InvalidFleetName: the name itself is refused
                SlotTable.create(f"{fleet_name}.data", REFERENCE_ROLES, 2)
            with pytest.raises(ValueError):
                DataSegment.create(f"{fleet_name}.data", 1, 4096, 4096)
            assert os.stat(path).st_ino == inode and _raw(path) == before
            again = DataSegment.attach(fleet_name)
            assert again.tasks(0).pop() == (7, b"the live fleet's payload")
            again.close()
        finally:
            data.close()


# ---------------------------------------------------------------------- reclaim


def _plant(fleet, at, header, *, owner=None, pid=0, start=0, magic=None, size=8192, age_s=0.0, fill=b""):
    """A raw segment under `at`'s name for `fleet`, holding a header laid out as `header`'s."""
    buf = bytearray(size)
    buf[: len(fill)] = fill
    struct.pack_into("<Q", buf, 0, header.magic if magic is None else magic)
    if owner is not None:
        name = owner.encode()
        buf[header.name_off : header.name_off + len(name)] = name
    struct.pack_into("<q", buf, header.pid_off, pid)
    struct.pack_into("<Q", buf, header.start_off, start)
    s = posix_ipc.SharedMemory(shm.segment_name(fleet, at), posix_ipc.O_CREX, mode=0o600, size=size)
    os.pwrite(s.fd, bytes(buf), 0)
    s.close_fd()
    path = shm.path(fleet, at)
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def _dead_creator():
    """(pid, start) of a creator that is gone: our pid with another start time (pid reuse)."""
    return os.getpid(), shm.process_start_time(os.getpid()) + 1


def _live_creator():
    return os.getpid(), shm.process_start_time(os.getpid())


@pytest.mark.parametrize("at, header, what", [("table", "data", "a fleet data segment"),
                                              ("data", "table", "a fleet table")])
def test_reclaim_refuses_a_segment_of_another_kind(fleet_name, at, header, what):
    pid, start = _dead_creator()
    path = _plant(fleet_name, KINDS[at], KINDS[header], owner=fleet_name, pid=pid, start=start, age_s=60)
    before = _raw(path)
    with pytest.raises(KINDS[at].errors.corrupt, match=f"not a fleet {KINDS[at].label} \\({what}\\)"):
        _create(KINDS[at], fleet_name)
    assert _raw(path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_reclaim_refuses_another_fleets_segment(fleet_name, kind):
    pid, start = _dead_creator()
    path = _plant(fleet_name, KINDS[kind], KINDS[kind], owner="someone-else", pid=pid, start=start, age_s=60)
    before = _raw(path)
    with pytest.raises(KINDS[kind].errors.corrupt, match="of fleet 'someone-else'"):
        _create(KINDS[kind], fleet_name)
    assert _raw(path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_reclaim_refuses_a_foreign_segment(fleet_name, kind):
    path = _plant(fleet_name, KINDS[kind], KINDS[kind], magic=0x0123456789ABCDEF, age_s=60)
    with pytest.raises(KINDS[kind].errors.corrupt, match="magic 0x0123456789abcdef"):
        _create(KINDS[kind], fleet_name)
    # no magic and no creator, but not empty either: not ours to remove
    os.unlink(path)
    path = _plant(fleet_name, KINDS[kind], KINDS[kind], magic=0, fill=b"\0" * 8 + b"someone's data", age_s=60)
    with pytest.raises(KINDS[kind].errors.corrupt, match="no magic, no creator"):
        _create(KINDS[kind], fleet_name)
    assert b"someone's data" in _raw(path)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("published", [True, False])
def test_reclaim_takes_a_stale_segment_of_its_kind_and_fleet(fleet_name, kind, published, caplog):
    pid, start = _dead_creator()
    _plant(fleet_name, KINDS[kind], KINDS[kind], owner=fleet_name, pid=pid, start=start,
           magic=None if published else 0)
    with caplog.at_level(logging.WARNING):
        made = _create(KINDS[kind], fleet_name)
    made.close()
    words = f"creator pid {pid} is gone" + ("" if published else " (it died before publishing it)")
    assert any(words in r.getMessage() and KINDS[kind].label in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("published", [True, False])
def test_a_live_creator_is_never_reclaimed(fleet_name, kind, published):
    pid, start = _live_creator()
    path = _plant(fleet_name, KINDS[kind], KINDS[kind], owner=fleet_name, pid=pid, start=start,
                  magic=None if published else 0, age_s=3600)  # old, unpublished: still its creator's
    before = _raw(path)
    with pytest.raises(KINDS[kind].errors.in_use) as info:
        _create(KINDS[kind], fleet_name)
    assert info.value.pid == pid and _raw(path) == before


# ---------------------------------------------------------- the rule, without I/O


def _head(kind, *, magic=None, owner=None, pid=0, start=0):
    buf = bytearray(kind.header_size)
    struct.pack_into("<Q", buf, 0, kind.magic if magic is None else magic)
    if owner is not None:
        buf[kind.name_off : kind.name_off + len(owner)] = owner.encode()
    struct.pack_into("<q", buf, kind.pid_off, pid)
    struct.pack_into("<Q", buf, kind.start_off, start)
    return bytes(buf)


def test_stale_reason_of_an_empty_segment_depends_on_its_age():
    empty = bytes(TABLE.header_size)
    with pytest.raises(TableInUse):
        shm.stale_reason(empty, "f", TABLE, age_s=shm.UNINITIALISED_GRACE_S / 2)
    assert shm.stale_reason(empty, "f", TABLE, age_s=shm.UNINITIALISED_GRACE_S * 2) == "it was never initialised"
    assert shm.stale_reason(b"\0" * 16, "f", TABLE, age_s=60) == "it was never initialised"  # shorter than a header
    with pytest.raises(TableCorrupt):
        shm.stale_reason(b"\0" * 8 + b"x", "f", TABLE, age_s=60)


def test_stale_reason_asks_whether_the_recorded_creator_lives():
    asked = []

    def alive(pid, start):
        asked.append((pid, start))
        return pid == 41

    assert shm.stale_reason(_head(TABLE, owner="f", pid=40, start=9), "f", TABLE, age_s=0, alive=alive) == (
        "creator pid 40 is gone")
    with pytest.raises(TableInUse):
        shm.stale_reason(_head(TABLE, owner="f", pid=41, start=9), "f", TABLE, age_s=99, alive=alive)
    assert asked == [(40, 9), (41, 9)]
    with pytest.raises(TableCorrupt, match="magic but no creator"):
        shm.stale_reason(_head(TABLE, owner="f"), "f", TABLE, age_s=99, alive=alive)
