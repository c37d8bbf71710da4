"""Nobody takes a fleet's name: whatever another local user (uid 65534) puts under it in
/dev/shm, root's fleet boots, its readers find its real table, and the plant is left
exactly as it was (`fleet.shm.segments`: names are protected by ownership).

Every plant is a real file system object made by a forked child running as uid 65534:
junk, an empty file, zero-filled files (small and large), a real segment of that user's
own run of the fleet, a symlink, a FIFO and a directory, under the table's name and
under the data segment's.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy  # noqa: F401 - imported here: a forked child of uid 65534 cannot import it from root's home
import pytest

from fleet.rules.roles import REFERENCE_ROLES
from fleet.shm import segments as shm
from fleet.shm.dataplane import KIND as DATA
from fleet.shm.dataplane import DataSegment, DataSegmentInUse
from fleet.shm.table import SlotTable, TableInUse, TableNotFound, snapshot
from fleet.shm.table import segment
from fleet.shm.table.segment import KIND as TABLE
from fleet.host.trust import UntrustedPeer
from tests.daemons import BOUND_S, Fleetd, segments
from tests.uids import NOBODY, as_nobody
from tests import require

pytestmark = pytest.mark.root

KINDS = {"table": TABLE, "data": DATA}
MARKING = {"mark": {"kind": "pooled", "handler": "tests.unpickle_marks:marking", "slots": 1}}


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        require.lacking("needs root to plant files as uid 65534")


# --- what uid 65534 plants -------------------------------------------------------------------------


def _file(content: bytes = b"", size: int | None = None):
    def plant(where, fleet, kind):
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, content)
            if size is not None:
                os.ftruncate(fd, size)  # zeros, as far as any reader can tell
        finally:
            os.close(fd)

    return plant


def _own_run(where, fleet, kind):
    """That user's own run of the fleet, under the plain name; the child exits: stale."""
    if kind is TABLE:
        table = segment.create(fleet, 2, 1, 0)
        segment.publish(table)
        table.close()
    else:
        DataSegment.create(fleet, 1, 4096, 4096).close()


def _symlink_to(target):
    def plant(where, fleet, kind):
        os.symlink(target, where)

    return plant


def _fifo(where, fleet, kind):
    os.mkfifo(where, 0o666)


def _directory(where, fleet, kind):
    os.mkdir(where, 0o777)
    with open(os.path.join(where, "inside"), "w") as f:
        f.write("a file of the squatter's")


PLANTS = {
    "junk": _file(b"not a fleet segment " * 64),
    "empty": _file(),
    "zero-filled": _file(size=4096),
    "zero-filled 64 MiB": _file(size=64 << 20),
    "its own run of the fleet": _own_run,
    "symlink": None,  # to a file of root's: made per test
    "fifo": _fifo,
    "directory": _directory,
}


def _plant(name, kind, how, tmp_path):
    where = shm.path(name, kind)
    planter = PLANTS[how]
    if planter is None:
        target = tmp_path / "roots-file"
        target.write_text("root's own\n")
        planter = _symlink_to(str(target))

    def child():
        planter(where, name, kind)
        return "planted"

    assert as_nobody(child) == "planted"
    st = os.lstat(where)
    assert st.st_uid == NOBODY
    return where, _fingerprint(where)


def _fingerprint(where):
    """What must not change: the object itself, its owner, type, mode, size and bytes."""
    st = os.lstat(where)
    if stat.S_ISREG(st.st_mode):
        with open(where, "rb") as f:  # root reads it here to compare; the code under test never does
            body = f.read(1 << 16)
    elif stat.S_ISLNK(st.st_mode):
        body = (os.readlink(where), open(where).read())
    elif stat.S_ISDIR(st.st_mode):
        body = sorted(os.listdir(where))
    else:
        body = None
    return st.st_ino, st.st_uid, st.st_mode, st.st_size, body


def _remove(where):
    if os.path.isdir(where) and not os.path.islink(where):
        shutil.rmtree(where, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where)


@pytest.fixture
def planted(fleet_name, tmp_path, request):
    """(where, fingerprint) of a plant; removed (root may) however the test ends."""
    made = []

    def plant(kind, how):
        made.append(shm.path(fleet_name, kind))
        return _plant(fleet_name, kind, how, tmp_path)

    yield plant
    for where in made:
        _remove(where)


# --- in process: each kind of plant, under each segment's name --------------------------------------


@pytest.mark.parametrize("how", list(PLANTS))
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_a_plant_under_a_segments_name_neither_stops_its_creation_nor_is_touched(fleet_name, planted, kind_name,
                                                                                  how, caplog):
    kind = KINDS[kind_name]
    where, before = planted(kind, how)
    make = {"table": lambda: SlotTable.create(fleet_name, REFERENCE_ROLES, 4),
            "data": lambda: DataSegment.create(fleet_name, 1, 4096, 4096)}[kind_name]
    created = make()  # a FIFO would block an open, a link lead elsewhere: neither is opened
    try:
        found = shm.locate(fleet_name, kind)
        assert found.alternate and found.st.st_uid == os.geteuid() and found.entry.startswith(os.path.basename(where))
        assert stat.S_IMODE(found.st.st_mode) == 0o600
        assert f"is held by uid {NOBODY}" in caplog.text and found.path in caplog.text
        # the readers find this one, not the plant
        if kind is TABLE:
            snap, alive = snapshot.read(fleet_name)
            assert alive and snap.n_slots == 4
            assert snap.boot_id == bytes(created.segment.header["boot_id"]).hex()
        else:
            with DataSegment.attach(fleet_name) as again:
                created.tasks(0).push(7, b"through the real one")
                assert again.tasks(0).pop()[1] == b"through the real one"
        # one live segment per uid: a second creation is refused, naming this process
        with pytest.raises((TableInUse, DataSegmentInUse)) as info:
            make()
        assert str(os.getpid()) in str(info.value)
    finally:
        created.close()
        created.unlink()
    assert _fingerprint(where) == before  # left exactly as it was
    assert segments(fleet_name) == [os.path.basename(where)]  # and nothing of ours left behind


def test_a_reader_never_believes_a_squatters_table_under_any_of_the_names(fleet_name, planted):
    """uid 65534 plants real-looking tables of this fleet under the plain name and under an
    alternate name; with root's fleet up, root's readers read root's table; without it,
    they read nothing (the plant is named, not believed)."""
    where, _ = planted(TABLE, "its own run of the fleet")
    alternate = f"{where}{shm.ALTERNATE}{'0' * 16}"

    def child():
        os.link(where, alternate)  # the same stale table of uid 65534, a second name
        return "planted"

    assert as_nobody(child) == "planted"
    try:
        with pytest.raises(UntrustedPeer) as err:
            snapshot.read(fleet_name)
        assert err.value.uid == NOBODY
        with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as ours:
            snap, alive = snapshot.read(fleet_name)
            assert alive and snap.n_slots == 4 and snap.creator_pid == os.getpid()
            ours.unlink()
    finally:
        _remove(alternate)


def test_a_squatters_live_table_never_outranks_our_stopped_one(fleet_name):
    """uid 65534 runs a live table under the plain name; our fleet ran beside it (on an
    alternate name) and died. Status reads ours -- stale, and says so -- never theirs."""
    r, w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the squatter: a live table of uid 65534, held until told
        os.close(w)
        try:
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            theirs = segment.create(fleet_name, 2, 1, 0)
            segment.publish(theirs)
            os.write(up_w, b"u")
            os.read(r, 1)
            theirs.close()
            segment.unlink(fleet_name)
        finally:
            os._exit(0)
    os.close(r)
    os.close(up_w)
    try:
        assert os.read(up_r, 1) == b"u"
        _stale_table_of_ours(fleet_name)
        assert [f.alternate for f in shm.names_of(fleet_name, TABLE)] == [False, True]  # theirs, ours
        snap, alive = snapshot.read(fleet_name)
        assert (snap.n_slots, alive, snap.creator_pid != pid) == (4, False, True)
    finally:
        os.close(up_r)
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_a_fifo_alone_under_the_name_is_no_fleet_and_never_blocks_a_reader(fleet_name, planted):
    planted(TABLE, "fifo")
    with pytest.raises(TableNotFound):
        snapshot.read(fleet_name)


# --- this uid's own segments: still one live, still reclaimed when stale ---------------------------


def _stale_table_of_ours(name):
    """A table this uid made in a child that then exited (so its creator is gone)."""
    code = ("from fleet.rules.roles import REFERENCE_ROLES; from fleet.shm.table import SlotTable;"
            f"t = SlotTable.create({name!r}, REFERENCE_ROLES, 4); t.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=BOUND_S)


def test_a_stale_segment_of_our_own_uid_on_an_alternate_name_is_reclaimed(fleet_name, planted, caplog):
    planted(TABLE, "junk")
    _stale_table_of_ours(fleet_name)
    [stale] = [f for f in shm.names_of(fleet_name, TABLE) if f.st.st_uid == os.geteuid()]
    assert stale.alternate
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as table:
        mine = shm.locate(fleet_name, TABLE)
        assert "reclaimed stale fleet table" in caplog.text and stale.path in caplog.text
        assert [f.entry for f in shm.names_of(fleet_name, TABLE) if f.st.st_uid == os.geteuid()] == [mine.entry]
        table.unlink()


def test_a_stale_segment_of_our_own_uid_under_the_plain_name_is_reclaimed(fleet_name):
    _stale_table_of_ours(fleet_name)
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as table:
        assert not shm.locate(fleet_name, TABLE).alternate  # the plain name, taken back
        table.unlink()


def test_a_second_boot_gives_way_to_one_that_made_its_segment_meanwhile(fleet_name, planted):
    """The race after the look: another live segment of ours appeared while we made ours."""
    planted(TABLE, "junk")
    code = ("import sys; from fleet.rules.roles import REFERENCE_ROLES; from fleet.shm.table import SlotTable;"
            f"t = SlotTable.create({fleet_name!r}, REFERENCE_ROLES, 4); print('up', flush=True); sys.stdin.read()")
    racer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert racer.stdout.readline() == "up\n"
        mine = "fleet." + fleet_name + shm.ALTERNATE + "f" * 16  # as if made just after the look
        with pytest.raises(TableInUse) as info:
            shm._give_way_to_a_racer(fleet_name, TABLE, mine)
        assert info.value.pid == racer.pid
    finally:
        racer.stdin.close()
        racer.wait(BOUND_S)


def test_another_user_runs_the_same_fleet_name_beside_ours(fleet_name):
    """The other way round: root's live table under the plain name does not stop uid 65534's
    fleet of that name either; each uid's readers read their own."""
    with SlotTable.create(fleet_name, REFERENCE_ROLES, 4) as ours:
        def child():
            theirs = SlotTable.create(fleet_name, REFERENCE_ROLES, 2)
            try:
                found = shm.locate(fleet_name, TABLE)
                return [found.alternate, found.st.st_uid, snapshot.read(fleet_name)[0].n_slots]
            finally:
                theirs.close()
                theirs.unlink()

        assert as_nobody(child) == [True, NOBODY, 2]
        assert snapshot.read(fleet_name)[0].n_slots == 4
        ours.unlink()
    assert segments(fleet_name) == []


def test_the_sweep_of_per_process_names_takes_stale_alternates_too(fleet_name, planted):
    planted(TABLE, "junk")
    _stale_table_of_ours(fleet_name)
    [stale] = [f.entry for f in shm.names_of(fleet_name, TABLE) if f.st.st_uid == os.geteuid()]
    assert shm.reclaim_stale_of(fleet_name) == [stale]
    assert segments(fleet_name) == [f"fleet.{fleet_name}"]  # the plant alone


def test_the_sweep_knows_every_kind_whatever_its_caller_imported(fleet_name):
    """A process that imported only the segments module (no table, no data plane) sweeps
    a stale table and a stale data segment of a dead process of ours."""
    code = ("from fleet.rules.roles import REFERENCE_ROLES; from fleet.shm.table import SlotTable;"
            "from fleet.shm.dataplane import DataSegment;"
            f"t = SlotTable.create({fleet_name!r}, REFERENCE_ROLES, 4); t.close();"
            f"d = DataSegment.create({fleet_name!r}, 1, 4096, 4096); d.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=BOUND_S)
    assert sorted(segments(fleet_name)) == [f"fleet.{fleet_name}", f"fleet.{fleet_name}.data"]
    sweep = ("import json, sys; from fleet.shm import segments;"
             f"print(json.dumps(sorted(segments.reclaim_stale_of({fleet_name!r}))));"
             "assert 'fleet.shm.dataplane' in sys.modules")
    out = subprocess.run([sys.executable, "-c", sweep], check=True, timeout=BOUND_S, capture_output=True, text=True)
    assert json.loads(out.stdout) == [f"fleet.{fleet_name}", f"fleet.{fleet_name}.data"]
    assert segments(fleet_name) == []


# --- a real fleetd, with both names taken -----------------------------------------------------------


@pytest.mark.parametrize("table_plant, data_plant", [("fifo", "zero-filled"), ("its own run of the fleet", "symlink"),
                                                     ("junk", "directory")])
def test_root_fleetd_boots_serves_and_is_read_under_a_squatted_name(fleet_name, planted, table_plant, data_plant):
    table_at, table_before = planted(TABLE, table_plant)
    data_at, data_before = planted(DATA, data_plant)
    d = Fleetd(fleet_name, MARKING)
    try:
        d.start()
        with d.connect() as client:
            assert client.submit("mark", os.path.join(d.dir, "m")).result(BOUND_S) == "marked"
        status = d.ctl("status", "--json")  # reads the table, asks the fleet nothing
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["alive"] and doc["creator_pid"] == d.proc.pid and doc["fleet"] == fleet_name
        assert "is held by uid 65534" in d.stderr()
        d.signal(15)
        assert d.wait() == 0, d.stderr()
    finally:
        d.cleanup()
    assert _fingerprint(table_at) == table_before and _fingerprint(data_at) == data_before
    assert sorted(segments(fleet_name)) == sorted([os.path.basename(table_at), os.path.basename(data_at)])
