"""Whom a client believes, tried against another local user (uid 65534).

That user may start a fleetd under a name root is not using, plant ``/tmp/fleet-0``, or
leave junk under a fleet's segment name. Root's client must refuse that user's daemon
(SO_PEERCRED) before anything it sends is unpickled, refuse a table that user owns, and
never look for a socket in a directory that user could have made. (Root's fleetd boots
past whatever that user leaves under its names: tests/shm/test_squatting.py.)
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil

import numpy  # noqa: F401 - imported here: a forked child of uid 65534 cannot import it from root's home
import pytest

import fleet
from fleet.shm import segments as shm
from fleet.cli import fleetctl
from fleet.service.control import ControlClient, find_socket
from fleet.rules.errors import EXIT_OK, EXIT_UNTRUSTED_PEER, EXIT_USAGE
from fleet.shm.table import segment
from fleet.shm.table.segment import KIND as TABLE
from fleet.host.trust import InvalidTrust, UntrustedPeer
from tests.daemons import BOUND_S, Fleetd, remove_segments
from tests.fleets import unique_name
from tests.uids import NOBODY, NOGROUP, as_nobody

MARKING = {"mark": {"kind": "pooled", "handler": "tests.unpickle_marks:marking", "slots": 1, "peak_cpus": 1}}


@pytest.fixture(scope="module")
def others_fleetd():
    """A fleetd of uid 65534, its socket in its own directory, its table under its name."""
    name = unique_name("t")
    try:
        with Fleetd(name, MARKING, as_nobody=True) as d:
            assert os.stat(shm.path(name, TABLE)).st_uid == NOBODY
            yield d
    finally:
        remove_segments(name)  # that user's: killed at the end, its segments stay (root removes them)


def _socket(d: Fleetd) -> str:
    return os.path.join(d.runtime_dir, f"{d.name}.sock")


# ------------------------------------------------------------------ the daemon's uid (SO_PEERCRED)


def test_a_fleetd_of_another_uid_is_refused_before_anything_is_unpickled(others_fleetd, tmp_path):
    """Told the socket's path outright (no lookup to refuse it), root's client still refuses the
    daemon by its uid: the unit is never sent, so the worker's value never reaches us."""
    d, mark = others_fleetd, str(tmp_path / "unpickled")
    client = fleet.Client(d.name, _socket(d))
    try:
        with pytest.raises(fleet.UntrustedPeer) as err:  # the submit is not sent: its future fails
            client.submit("mark", mark).result(BOUND_S)
    finally:
        client.close()
    assert err.value.uid == NOBODY and "uid 65534" in str(err.value)
    assert err.value.what.startswith(f"the fleet daemon at {_socket(d)} (pid ")
    assert err.value.exit_code == EXIT_UNTRUSTED_PEER
    with ControlClient(_socket(d)) as control, pytest.raises(UntrustedPeer):
        control.call("ping")
    assert not os.path.exists(f"{mark}.0")
    # What was at stake: trusted on purpose, the same daemon's value runs code as root here.
    with fleet.Client(d.name, _socket(d), trust_uids=[NOBODY]) as trusting:
        assert trusting.submit("mark", mark).result(BOUND_S) == "marked"
    assert os.path.exists(f"{mark}.0")


# ------------------------------------------------------------------ the table's owner


def test_a_table_of_another_uid_is_not_believed(others_fleetd):
    """No socket of that name where root looks: the table would say where one is. It is
    another user's table, so neither connect nor fleetctl status believes it."""
    d = others_fleetd
    with pytest.raises(fleet.UntrustedPeer) as err:
        fleet.connect(d.name, env={}, boot_wait=0)
    assert err.value.uid == NOBODY and err.value.what == f"the table {shm.path(d.name, TABLE)}"

    refused = d.ctl("status", "--json")
    assert refused.returncode == EXIT_UNTRUSTED_PEER, refused.stderr
    assert "UntrustedPeer" in refused.stderr and "uid 65534" in refused.stderr and refused.stdout == ""

    trusted = d.ctl("status", "--json", "--trust-uid", str(NOBODY))
    assert trusted.returncode == EXIT_OK, trusted.stderr
    with fleet.connect(d.name, env={}, boot_wait=0, trust_uids=[NOBODY]) as client:
        assert client.path == _socket(d)


# ------------------------------------------------------------------ lookups


def test_a_socket_directory_of_another_uid_is_not_looked_into(others_fleetd):
    """RUNTIME_DIRECTORY names that user's directory: fleetctl refuses the socket in it."""
    d = others_fleetd
    refused = d.ctl("posture", "show")
    assert refused.returncode == EXIT_UNTRUSTED_PEER, refused.stderr
    assert f"directory {d.runtime_dir}" in refused.stderr and "uid 65534" in refused.stderr
    assert d.ctl("--trust-uid", "nobody", "posture", "show").returncode == EXIT_OK


@contextlib.contextmanager
def _planted(path: str):
    """``path`` must not exist (a fleet of root never makes it); removed afterwards."""
    assert not os.path.lexists(path), f"{path} exists already: this test plants it itself"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_tmp_fleet_dir_another_user_made_is_not_used(fleet_name):
    """Root's own fleetd binds in /run/fleet, so /tmp/fleet-0 is a name another user can take
    first and serve a fleetd from; root's lookup refuses the directory, naming its owner."""
    with _planted("/tmp/fleet-0") as planted:
        with Fleetd(fleet_name, MARKING, as_nobody=True, env={"RUNTIME_DIRECTORY": planted}):
            assert os.stat(planted).st_uid == NOBODY
            assert os.path.exists(f"{planted}/{fleet_name}.sock")
            for lookup in (lambda: fleet.connect(fleet_name, env={}, boot_wait=0),
                           lambda: ControlClient.for_fleet(fleet_name, env={})):
                with pytest.raises(fleet.UntrustedPeer) as err:
                    lookup()
                assert err.value.uid == NOBODY
                assert err.value.what == f"the socket {planted}/{fleet_name}.sock (directory {planted})"


def _socket_file(directory: str, name: str = "f1") -> str:
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, f"{name}.sock")
    open(path, "w").close()  # the lookup only asks whether it exists
    return path


def test_lookup_refuses_a_directory_of_another_uid_unless_trusted(tmp_path):
    base = str(tmp_path / "xdg")
    sock = _socket_file(os.path.join(base, "fleet"))
    os.chmod(tmp_path, 0o755)
    os.chown(os.path.dirname(sock), NOBODY, NOGROUP)
    with pytest.raises(UntrustedPeer) as err:
        find_socket("f1", {"XDG_RUNTIME_DIR": base})
    assert err.value.uid == NOBODY and "owned by uid 65534" in str(err.value)
    assert str(find_socket("f1", {"XDG_RUNTIME_DIR": base}, trust={0, os.geteuid(), NOBODY})) == sock


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775, 0o757])
def test_lookup_refuses_a_socket_directory_others_may_write_sticky_or_not(tmp_path, mode):
    """Sticky stops others replacing our socket, not adding theirs under a name not yet used."""
    sock = _socket_file(str(tmp_path / "run"))
    os.chmod(os.path.dirname(sock), mode)
    with pytest.raises(UntrustedPeer, match="writable by group or others") as err:
        find_socket("f1", {"RUNTIME_DIRECTORY": os.path.dirname(sock)})
    assert err.value.uid == os.geteuid()
    os.chmod(os.path.dirname(sock), 0o755)
    assert str(find_socket("f1", {"RUNTIME_DIRECTORY": os.path.dirname(sock)})) == sock


def test_lookup_refuses_a_way_to_the_socket_others_could_change(tmp_path):
    """An ancestor anyone may write (not sticky) lets them swap the directory below it."""
    above = tmp_path / "above"
    sock = _socket_file(str(above / "run"))
    os.chmod(above, 0o777)
    with pytest.raises(UntrustedPeer, match=f"directory {above}\\)") as err:
        find_socket("f1", {"RUNTIME_DIRECTORY": os.path.dirname(sock)})
    assert "writable by group or others (mode 777)" in str(err.value)
    os.chmod(above, 0o1777)  # sticky, like /tmp: nobody else may rename what we own in it
    assert str(find_socket("f1", {"RUNTIME_DIRECTORY": os.path.dirname(sock)})) == sock


def test_lookup_checks_the_directory_a_link_leads_to(tmp_path):
    safe = os.path.dirname(_socket_file(str(tmp_path / "safe")))
    loose = os.path.dirname(_socket_file(str(tmp_path / "loose")))
    os.chmod(loose, 0o777)
    os.symlink(safe, tmp_path / "to-safe")
    os.symlink(loose, tmp_path / "to-loose")
    assert str(find_socket("f1", {"RUNTIME_DIRECTORY": str(tmp_path / "to-safe")})) == f"{safe}/f1.sock"
    with pytest.raises(UntrustedPeer, match=f"directory {loose}\\)"):
        find_socket("f1", {"RUNTIME_DIRECTORY": str(tmp_path / "to-loose")})


def test_a_refused_directory_does_not_hide_a_later_safe_one(tmp_path):
    loose = os.path.dirname(_socket_file(str(tmp_path / "loose")))
    os.chmod(loose, 0o777)
    xdg = str(tmp_path / "xdg")
    good = _socket_file(os.path.join(xdg, "fleet"))
    assert str(find_socket("f1", {"RUNTIME_DIRECTORY": loose, "XDG_RUNTIME_DIR": xdg})) == good


@pytest.mark.parametrize("bad", [["65534"], [-1], [True], [2**32], 65534, "65534", [1.0]])
def test_trust_uids_must_be_uids(bad):
    with pytest.raises(InvalidTrust):
        fleet.connect("nosuchfleet", env={}, boot_wait=0, trust_uids=bad)
    with pytest.raises(InvalidTrust):
        ControlClient("/nonexistent.sock", trust_uids=bad)


def test_fleetctl_refuses_a_trust_uid_that_is_no_uid(fleet_name):
    for bad in ("no-such-user-here", str(2**32)):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exit_:
            fleetctl.main(["status", "--name", fleet_name, "--trust-uid", bad])
        assert exit_.value.code == EXIT_USAGE
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert fleetctl.main(["--trust-uid", "0", "plan", "--cpus", "4"]) == EXIT_USAGE
    assert "this command addresses no fleet" in err.getvalue()


# ------------------------------------------------------------------ boot and reclaim


def _plant_stale_table(name: str):
    def child():
        table = segment.create(name, 2, 1, 0)
        segment.publish(table)
        table.close()  # the child exits: its creator is gone, the table is stale
        return "planted"

    return child


def test_an_attach_maps_only_a_segment_of_a_trusted_uid(fleet_name):
    """The reader side of the table's owner check: status, the zygote and every reader attach."""
    from fleet.shm.table import snapshot

    assert as_nobody(_plant_stale_table(fleet_name)) == "planted"
    with pytest.raises(UntrustedPeer) as err:
        snapshot.read(fleet_name)
    assert err.value.uid == NOBODY and err.value.what == f"the table {shm.path(fleet_name, TABLE)}"
    snap, alive = snapshot.read(fleet_name, trust=frozenset({0, os.geteuid(), NOBODY}))
    assert snap.n_slots == 2 and not alive
