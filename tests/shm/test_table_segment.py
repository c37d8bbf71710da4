"""Creating, attaching and reclaiming the table segment; bad headers; names."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import posix_ipc
import pytest

from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm.table import (
    BadFleetName,
    SlotTable,
    TableCorrupt,
    TableInUse,
    TableNotFound,
    TableVersionError,
)
from fleet.shm.table import layout as L
from fleet.shm.table import segment as seg


def _shm_path(name):
    return f"/dev/shm/fleet.{name}"


def _raw(name):
    """The segment's bytes as the kernel holds them."""
    with open(_shm_path(name), "rb") as f:
        return f.read()


def _my_start_ticks() -> int:
    """This process's start time in clock ticks since boot: field 22 of /proc/self/stat
    (read here as proc(5) describes it, not by the code under test)."""
    with open("/proc/self/stat") as f:
        after_comm = f.read().rsplit(")", 1)[1].split()
    return int(after_comm[22 - 3])  # fields 1 and 2 (pid, comm) precede the split


def test_header_identifies_the_table(fleet_name):
    before = time.time_ns()
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 8) as t:
        after = time.time_ns()
        h = t.segment.header
        assert int(h["magic"]) == L.MAGIC and int(h["version"]) == L.LAYOUT_VERSION
        assert int(h["creator_pid"]) == os.getpid()
        assert int(h["creator_start"]) == _my_start_ticks()
        assert before <= int(h["created_ns"]) <= after  # when it was made
        assert len(bytes(h["boot_id"])) == 16 and bytes(h["boot_id"]) != bytes(16)
        assert os.stat(_shm_path(fleet_name)).st_size == int(h["total_size"])
        for key in ("posture_off", "ledger_off", "roles_off", "slots_off", "bulkheads_off"):
            assert int(h[key]) % L.LINE == 0


def test_two_tables_differ_in_boot_id(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2) as t:
        first = t.snapshot().boot_id
    seg.unlink(fleet_name)
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2) as t:
        assert t.snapshot().boot_id != first


def test_live_creator_refuses_a_second_create_naming_its_pid(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as t:
        t.apply(0, "LEASE", REFERENCE_ROLES.code("resolve"))
        before = _raw(fleet_name)
        with pytest.raises(TableInUse) as info:
            SlotTable.create(fleet_name, REFERENCE_ROLES, 4)
        assert info.value.pid == os.getpid() and str(os.getpid()) in str(info.value)
        assert info.value.exit_code == 82
        assert _raw(fleet_name) == before


def test_stale_table_of_a_dead_creator_is_reclaimed_and_logged(fleet_name, reaper, caplog):
    code = (
        "import os, sys, time\n"
        "from fleet.shm.table import SlotTable\n"
        "from fleet.rules.roles import REFERENCE_ROLES\n"
        f"t = SlotTable.create({fleet_name!r}, REFERENCE_ROLES, 4)\n"
        "t.apply(0, 'LEASE', 2)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    reaper.append(child)
    pid = int(child.stdout.readline())
    with pytest.raises(TableInUse):
        SlotTable.create(fleet_name, REFERENCE_ROLES, 4)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    with caplog.at_level(logging.WARNING, logger="fleet.shm.table.segment"):
        with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as t:
            assert t.state(0)[0] == 0  # a fresh table, not the dead one's
            assert int(t.segment.header["creator_pid"]) == os.getpid()
    assert any(f"creator pid {pid} is gone" in r.getMessage() for r in caplog.records)


def test_pid_reuse_is_not_mistaken_for_the_creator(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2) as t:
        # Same pid, another start time: the process that created the table is gone.
        t.segment.header["creator_start"] = int(t.segment.header["creator_start"]) + 1
        with SlotTable.create(fleet_name, REFERENCE_ROLES, 2) as fresh:
            assert int(fresh.segment.header["creator_start"]) == _my_start_ticks()


def _raw_segment(name, size, mtime=None):
    shm = posix_ipc.SharedMemory(f"/fleet.{name}", posix_ipc.O_CREX, size=size)
    shm.close_fd()
    if mtime is not None:
        os.utime(_shm_path(name), (mtime, mtime))


def test_uninitialised_segment_young_is_in_use_old_is_reclaimed(fleet_name):
    _raw_segment(fleet_name, 4096)
    with pytest.raises(TableInUse):
        SlotTable.create(fleet_name, REFERENCE_ROLES, 2)
    os.utime(_shm_path(fleet_name), (time.time() - 60, time.time() - 60))
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2) as t:
        assert int(t.segment.header["magic"]) == L.MAGIC


def test_attach_missing_table(fleet_name):
    with pytest.raises(TableNotFound, match="not running"):
        SlotTable.attach(fleet_name)


def _corrupt(fleet_name, field, value):
    t = SlotTable.create(fleet_name, REFERENCE_ROLES, 4)
    t.segment.header[field] = value
    t.close()
    return _raw(fleet_name)


@pytest.mark.parametrize(
    "field,value,error,words",
    [
        ("magic", 0x1234, TableCorrupt, "bad magic"),
        ("version", 99, TableVersionError, "layout version 99"),
        ("n_slots", 0, TableCorrupt, "n_slots"),
        ("n_slots", 5, TableCorrupt, "bulkheads_off"),  # in range, but the offsets no longer add up
        ("n_roles", 200, TableCorrupt, "n_roles"),
        ("slots_off", 8, TableCorrupt, "slots_off"),
        ("header_size", 1, TableCorrupt, "header_size"),
    ],
)
def test_attach_refuses_a_corrupt_header_and_writes_nothing(fleet_name, field, value, error, words):
    before = _corrupt(fleet_name, field, value)
    with pytest.raises(error, match=words):
        SlotTable.attach(fleet_name)
    assert _raw(fleet_name) == before


def test_attach_refuses_a_segment_shorter_than_its_header_says(fleet_name):
    _raw_segment(fleet_name, 8192)
    with pytest.raises(TableCorrupt):
        SlotTable.attach(fleet_name)
    assert os.stat(_shm_path(fleet_name)).st_size == 8192


def test_attach_never_resizes(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 16) as owner:
        size = os.stat(_shm_path(fleet_name)).st_size
        reader = SlotTable.attach(fleet_name, writable=False)
        assert os.stat(_shm_path(fleet_name)).st_size == size == reader.segment.size
        assert reader.snapshot().n_slots == 16
        owner.apply(3, "LEASE", REFERENCE_ROLES.code("resolve"))
        assert reader.snapshot().slot(3)["state"] == "Leased"
        reader.close()


def test_read_only_attach_cannot_write(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2):
        reader = SlotTable.attach(fleet_name, writable=False)
        with pytest.raises((ValueError, TypeError)):
            reader.slots[0] = np.uint64(1)
        reader.close()


@pytest.mark.parametrize("name", ["", "a/b", "../x", "-lead", "x" * 64, "sp ace", None, 5])
def test_bad_fleet_names(name):
    with pytest.raises(BadFleetName):
        seg.segment_name(name)


@pytest.mark.parametrize("n_slots", [0, L.MAX_SLOTS + 1])
def test_table_size_limits(fleet_name, n_slots):
    with pytest.raises(seg.TableError, match="n_slots"):
        SlotTable.create(fleet_name, REFERENCE_ROLES, n_slots)
    assert not os.path.exists(_shm_path(fleet_name))


def test_unlink_leaves_nothing(fleet_name):
    t = SlotTable.create(fleet_name, REFERENCE_ROLES, 2)
    t.close()
    assert t.unlink() is True
    assert not os.path.exists(_shm_path(fleet_name))
    assert seg.unlink(fleet_name) is False


def test_word_packing_round_trips():
    for fields in [(0, 0, 0, 0), (4, 255, L.KEY_MASK, L.GEN_MASK), (2, 7, 12345, 99)]:
        assert L.unpack_word(L.pack_word(*fields)) == fields
    assert L.unpack_word(L.pack_word(1, 1, 1, L.GEN_MASK + 1))[3] == 0


def test_boot_metadata_is_stored_once_and_read_by_attachers(fleet_name):
    meta = {"plan": {"binding": "serial", "quota_cpus": 2.0}, "seats": [{"name": "serial-0", "cpus": [1]}]}
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2, meta=meta) as owner:
        reader = SlotTable.attach(fleet_name, writable=False)
        assert reader.meta == meta == reader.snapshot().meta == owner.meta
        reader.close()


def test_metadata_too_large_is_refused_and_leaves_no_table(fleet_name):
    with pytest.raises(seg.TableError, match="metadata"):
        SlotTable.create(fleet_name, REFERENCE_ROLES, 2, meta={"x": "y" * L.META_SIZE})
    assert not os.path.exists(_shm_path(fleet_name))


def test_corrupt_metadata_is_a_typed_error(fleet_name):
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 2, meta={"a": 1}) as t:
        off = int(t.segment.header["meta_off"])
        t.segment.mm[off : off + 1] = b"?"
        with pytest.raises(TableCorrupt, match="metadata"):
            SlotTable.attach(fleet_name).meta


def test_a_segment_shorter_than_a_header_is_corrupt(fleet_name):
    _raw_segment(fleet_name, 64)
    with pytest.raises(TableCorrupt, match="64 bytes"):
        SlotTable.attach(fleet_name)
