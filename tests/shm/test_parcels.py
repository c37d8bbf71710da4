"""Parcels (fleet.shm.parcels): a message written once beside the ring, mapped by its
receiver, removed by its one owner; names only of their own shape, files only of this uid."""
from __future__ import annotations

import os
import stat

import pytest

from fleet.shm import parcels
from fleet.shm.segments import SHM_DIR
from tests.fleets import unique_name


@pytest.fixture
def fleet_name():
    name = unique_name("pc")
    yield name
    parcels.sweep(name)
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(f"fleet.{name}"):
            os.unlink(os.path.join(SHM_DIR, entry))


def test_a_parcel_holds_its_parts_aligned_owner_only(fleet_name):
    parts = [b"head", bytes(range(256)) * 5, b"z" * 3]
    name, offsets = parcels.write(fleet_name, parts)
    assert offsets == [0, 64, 64 + 1280] and all(off % parcels.ALIGN == 0 for off in offsets)
    st = os.lstat(os.path.join(SHM_DIR, name))
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert name.startswith(f"fleet.{fleet_name}.p{os.getpid()}.")
    mm = parcels.open_(name, take=False)
    assert [bytes(mm[o:o + len(p)]) for o, p in zip(offsets, parts)] == parts
    assert parcels.count(fleet_name) == 1  # kept: its sender owns it
    mm.close()
    assert parcels.remove(name) and not parcels.remove(name)
    assert parcels.count(fleet_name) == 0


def test_a_kept_parcel_maps_private_and_a_taken_one_is_gone_at_once(fleet_name):
    name, _ = parcels.write(fleet_name, [b"a" * 100])
    private = parcels.open_(name, take=False)
    private[0:1] = b"b"  # copy-on-write: the parcel itself is as it was sent
    taken = parcels.open_(name, take=True)
    assert bytes(taken[0:2]) == b"aa" and parcels.count(fleet_name) == 0
    taken[0:1] = b"c"
    assert bytes(taken[0:1]) == b"c"
    private.close(), taken.close()
    with pytest.raises(parcels.ParcelError, match="cannot open the parcel"):
        parcels.open_(name, take=True)


@pytest.mark.parametrize("name", ["../etc/passwd", "fleet.x.data", "fleet.x.p1.zz", "fleet.a/b.p1.0123456789abcdef"])
def test_only_a_parcel_shaped_name_is_opened_or_removed(name):
    with pytest.raises(parcels.ParcelError, match="is not a parcel's name"):
        parcels.open_(name, take=True)
    with pytest.raises(parcels.ParcelError):
        parcels.remove(name)


def test_a_link_under_a_parcels_name_is_not_followed(fleet_name, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"secret" * 100)
    name = f"fleet.{fleet_name}.p1.0123456789abcdef"
    os.symlink(target, os.path.join(SHM_DIR, name))
    with pytest.raises(parcels.ParcelError):
        parcels.open_(name, take=True)
    assert target.read_bytes() == b"secret" * 100


def test_sweep_takes_a_creators_parcels_or_all_of_a_fleets(fleet_name):
    other = unique_name("pd")
    try:
        mine, _ = parcels.write(fleet_name, [b"x"])
        dead = f"fleet.{fleet_name}.p999999.0123456789abcdef"
        open(os.path.join(SHM_DIR, dead), "wb").close()
        theirs, _ = parcels.write(other, [b"y"])
        assert parcels.sweep(fleet_name, 999999) == [dead]
        assert parcels.count(fleet_name) == 1
        assert parcels.sweep(fleet_name) == [mine]
        assert parcels.count(other) == 1  # another fleet's: untouched
    finally:
        parcels.sweep(other)


def test_sweep_orphans_takes_only_parcels_of_fleets_without_a_table(fleet_name):
    live, gone = f"{fleet_name}a", f"{fleet_name}b"
    table = os.path.join(SHM_DIR, f"fleet.{live}")
    open(table, "wb").close()
    try:
        kept, _ = parcels.write(live, [b"x"])
        orphan, _ = parcels.write(gone, [b"y"])
        assert parcels.sweep_orphans(fleet_name) == [orphan]
        assert parcels.count(live) == 1
    finally:
        os.unlink(table)
        parcels.sweep(live)
        parcels.sweep(gone)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ino(name: str) -> int:
    return os.stat(os.path.join(SHM_DIR, name)).st_ino


def test_a_warm_parcel_is_written_again_once_its_unit_solved_and_removed_otherwise(fleet_name):
    warm = parcels.Warm(fleet_name)
    try:
        first = b"a" * (1 << 20)
        name, offsets = warm.write([b"head", first])
        ino = _ino(name)
        warm.end(name, reuse=True)
        assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 1
        again, offsets = warm.write([b"head", b"b" * (1 << 20)])  # same size: the same pages
        assert again != name and _ino(again) == ino and parcels.count(fleet_name, warm=True) == 0
        mm = parcels.open_(again, take=False)
        assert bytes(mm[offsets[1]:offsets[1] + 4]) == b"bbbb" and bytes(mm[0:4]) == b"head"
        mm.close()
        big, _ = warm.write([b"c" * (3 << 20)])  # over twice its size: a parcel of its own
        assert _ino(big) != ino
        warm.end(again, reuse=False)  # not solved: removed, never written again
        warm.end(big, reuse=True)
        assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 1
    finally:
        warm.close()
    assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 0


def test_warm_parcels_are_held_up_to_their_keep_and_let_go_when_idle(fleet_name):
    clock = Clock()
    warm = parcels.Warm(fleet_name, keep=(3 << 20) - 1, clock=clock)
    try:
        names = [warm.write([b"x" * (1 << 20)])[0] for _ in range(3)]
        for name in names:
            warm.end(name, reuse=True)
        assert parcels.count(fleet_name, warm=True) == 2  # a third passes the keep: the first goes
        assert not os.path.exists(os.path.join(SHM_DIR, parcels._warm_name(names[0])))
        clock.now = parcels.WARM_IDLE_S
        name, _ = warm.write([b"y" * 100])  # too small for them; they are let go meanwhile
        assert parcels.count(fleet_name, warm=True) == 0 and warm.free_bytes() == 0
        warm.end(name, reuse=True)
        assert parcels.count(fleet_name, warm=True) == 1
    finally:
        warm.close()
    assert parcels.count(fleet_name, warm=True) == 0


def test_sweep_takes_warm_parcels_too(fleet_name):
    warm = parcels.Warm(fleet_name)
    name, _ = warm.write([b"x" * 100])
    warm.end(name, reuse=True)
    assert parcels.count(fleet_name, warm=True) == 1
    assert len(parcels.sweep(fleet_name, os.getpid())) == 1
    assert parcels.count(fleet_name, warm=True) == 0
    warm.close()


# --- lent parcels: a worker's results, copied out by the supervisor and given back ----------
def _inode(name):
    return os.stat(os.path.join(SHM_DIR, name)).st_ino


def test_a_lent_parcel_given_back_is_written_into_again(fleet_name):
    lender = parcels.Lender(fleet_name)
    name, offsets, lent = lender.write([b"head", bytes(300_000)])
    assert lent and parcels.count(fleet_name) == 1
    inode = _inode(name)
    assert parcels.give_back(name)  # its receiver is done: back under its warm name
    assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 1
    again, _offsets, lent = lender.write([b"next", b"y" * 290_000])
    assert lent and again != name and _inode(again) == inode  # the same pages, a fresh name
    fd, size = parcels.open_fd(again, take=False)
    try:
        assert parcels.read(fd, 64, 290_000) == b"y" * 290_000
    finally:
        os.close(fd)
    assert lender.held() == 1
    parcels.sweep(fleet_name)


def test_a_lent_parcel_is_never_removed_before_it_is_given_back(fleet_name):
    lender = parcels.Lender(fleet_name, keep=2)
    names = [lender.write([bytes(100_000)]) for _ in range(5)]
    # two kept and lent; the rest, with none given back, go as parcels their receiver takes
    assert [lent for _n, _o, lent in names] == [True, True, False, False, False]
    assert all(os.path.exists(os.path.join(SHM_DIR, n)) for n, _o, _l in names)
    assert lender.held() == 2
    parcels.give_back(names[0][0])
    bigger, _offsets, lent = lender.write([bytes(900_000)])  # no fit: the one given back makes room
    assert lent and lender.held() == 2 and parcels.count(fleet_name, warm=True) == 0
    assert os.path.exists(os.path.join(SHM_DIR, names[1][0]))  # still lent: left alone
    parcels.sweep(fleet_name)


def test_a_lent_parcel_its_receiver_removed_is_let_go_to_make_room(fleet_name):
    # A stray result's parcel is removed by the supervisor (codec.drop_parcel), never given
    # back: its lender lets it go when it needs the room, as it does one given back.
    lender = parcels.Lender(fleet_name, keep=2)
    first, _o, lent = lender.write([bytes(100_000)])
    second, _o, _lent = lender.write([bytes(100_000)])
    assert lent and lender.held() == 2
    parcels.remove(first)  # dropped by its receiver
    third, _o, lent = lender.write([bytes(900_000)])  # no fit: the dropped one makes room
    assert lent and lender.held() == 2 and parcels.count(fleet_name) == 2
    assert os.path.exists(os.path.join(SHM_DIR, second))  # still lent: left alone
    assert not os.path.exists(os.path.join(SHM_DIR, first))
    parcels.sweep(fleet_name)


def _memory_of(array):
    """What an array's memory belongs to: the end of its chain of bases (a mapping, a bytearray, ...)."""
    import numpy as np

    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_a_value_from_a_lent_parcel_is_built_over_it_and_the_parcel_goes_back_once_dropped(fleet_name):
    # No copy out: the value is built over the parcel (the worker's write is its one copy),
    # which stays the value's while it lives, and goes back to its writer once it is gone.
    import mmap

    import numpy as np

    from fleet.worker import codec

    lender = parcels.Lender(fleet_name)
    n = 100_000
    body, name = codec.pack(np.arange(n, dtype=np.float64), "the result", fleet_name, take=True,
                            writer=lender.write, lend=True)
    got = codec.loads(body, "the result")
    assert isinstance(_memory_of(got), mmap.mmap) and got.flags.writeable
    assert parcels.count(fleet_name) == 1 and parcels.count(fleet_name, warm=True) == 0  # still the value's
    got[0] = -1.0
    # the writer's next value of that size goes to another parcel: this one is not back
    body, again = codec.pack(np.zeros(n), "the result", fleet_name, take=True, writer=lender.write, lend=True)
    assert again != name and lender.held() == 2
    codec.loads(body, "the result")  # dropped at once: its parcel goes back
    assert parcels.count(fleet_name) == 1 and parcels.count(fleet_name, warm=True) == 1
    assert got[0] == -1.0 and got[1] == 1.0 and got[-1] == n - 1
    view = got[10:20]  # a view holds the parcel as the array does
    del got
    assert parcels.count(fleet_name) == 1 and view[0] == 10.0
    del view
    assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 2
    # and the writer writes into them again
    codec.loads(codec.pack(np.ones(n), "the result", fleet_name, take=True, writer=lender.write, lend=True)[0],
                "the result")
    assert lender.held() == 2 and parcels.count(fleet_name, warm=True) == 2
    parcels.sweep(fleet_name)


def test_a_child_forked_while_a_value_lives_does_not_give_its_parcel_back(fleet_name):
    # The child's copy of the value (and of its finalizer) goes with the child: dropping it
    # there must not hand the parent's parcel back to its writer (nor would the child's
    # exit: the same finalizer runs then, and checks the same pid).
    import numpy as np

    from fleet.worker import codec

    lender = parcels.Lender(fleet_name)
    body, _name = codec.pack(np.arange(100_000, dtype=np.float64), "the result", fleet_name, take=True,
                             writer=lender.write, lend=True)
    got = codec.loads(body, "the result")
    pid = os.fork()
    if pid == 0:  # the child drops its copy
        code = 1
        try:
            del got
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert parcels.count(fleet_name) == 1 and parcels.count(fleet_name, warm=True) == 0  # still the parent's
    del got
    assert parcels.count(fleet_name) == 0 and parcels.count(fleet_name, warm=True) == 1
    parcels.sweep(fleet_name)


FULL_MAP = """
    import json, mmap, sys
    sys.path.insert(0, {repo!r})
    import numpy as np
    from fleet.shm import parcels
    from fleet.worker import codec

    lender = parcels.Lender({fleet!r})
    body, _name = codec.pack(np.arange(1 << 17, dtype=np.float64), "the result", {fleet!r}, take=True,
                             writer=lender.write, lend=True)
    # Take every mapping this process may still make (vm.max_map_count): one page each, in
    # alternating protections, so that no two merge into one.
    held = []
    while True:
        try:
            held.append(mmap.mmap(-1, 4096, prot=mmap.PROT_READ | (mmap.PROT_WRITE if len(held) % 2 else 0)))
        except OSError:  # the count is reached
            break
    try:
        codec.loads(body, "the result")
        failed = ""
    except codec.CodecError as exc:
        failed = str(exc)
    said = {{"mappings": len(held), "failed": failed, "back": parcels.count({fleet!r}, warm=True),
             "out": parcels.count({fleet!r})}}
    del held
    print(json.dumps(said))
    parcels.sweep({fleet!r})
"""


def test_a_value_whose_parcel_cannot_be_mapped_fails_clearly_and_its_parcel_goes_back(fleet_name, tmp_path):
    # A process at its count of mappings (vm.max_map_count): the value cannot be built over
    # its parcel (nor copied: memory that large is a mapping too), so it fails, saying why,
    # and its parcel goes back to its writer rather than stay lent to nobody.
    import json
    import subprocess
    import sys
    import textwrap

    from tests.daemons import REPO

    script = tmp_path / "full_map.py"
    script.write_text(textwrap.dedent(FULL_MAP).format(repo=REPO, fleet=fleet_name))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["mappings"] > 1000, said  # the count was reached
    assert "the result cannot be unpickled here" in said["failed"] and "Cannot allocate memory" in said["failed"]
    assert (said["back"], said["out"]) == (1, 0), said


def _resident_kib(mm) -> int:
    """The KiB of `mm` this process has mapped (its Rss line in /proc/self/smaps)."""
    import ctypes

    start = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{start:x}" or line.startswith(f"{start:08x}-"):
            return next(int(ln.split()[1]) for ln in lines[i + 1:] if ln.startswith("Rss:"))
    raise AssertionError("the mapping is not in /proc/self/smaps")


@pytest.mark.parametrize("numpy_loaded", [True, False])
def test_a_populated_mapping_has_every_page_mapped_at_once(numpy_loaded, monkeypatch, fleet_name):
    # Mapped now, not faulted page by page at its first write; with numpy, by a read of a
    # byte per page that lets other threads run (MAP_POPULATE holds the GIL meanwhile).
    import sys

    if not numpy_loaded:
        monkeypatch.delitem(sys.modules, "numpy", raising=False)
    size = 8 << 20
    name, _offsets, fd = parcels.write(fleet_name, [b"x" * size], keep_fd=True)
    try:
        mm = parcels.populated(fd, size)
        try:
            assert _resident_kib(mm) == size // 1024
            assert mm[:1] == b"x" and mm[size - 1:] == b"x"
        finally:
            mm.close()
    finally:
        os.close(fd)
        parcels.remove(name)
