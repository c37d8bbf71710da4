"""The names fleet's processes carry in ps and top (fleet.rules.titles): the rule itself."""
from __future__ import annotations

import pytest

from fleet.rules import titles


def test_a_worker_is_named_for_its_fleet_and_seat():
    t = titles.worker("prod", "solver-3")
    assert (t.cmdline, t.comm) == ("fleet-prod-solver-3", "fleet-solver-3")


def test_the_serial_seat_which_runs_every_role_is_named_serial():
    assert titles.worker("prod", "serial-0") == titles.Title("fleet-prod-serial-0", "fleet-serial-0")


@pytest.mark.parametrize("seat, comm", [
    ("pool_state_updater-3", "fleet-pool_st-3"),
    ("pool_state_updater-12", "fleet-pool_s-12"),
    ("abcdefg-0", "fleet-abcdefg-0"),  # 15 bytes: kept whole
    ("abcdefgh-0", "fleet-abcdefg-0"),  # one byte over: the role loses one
])
def test_a_command_name_fits_15_bytes_and_keeps_the_seats_number(seat, comm):
    got = titles.worker("f", seat).comm
    assert got == comm and len(got.encode()) <= titles.COMM_BYTES
    assert got.startswith(titles.PREFIX) and got.endswith("-" + seat.rsplit("-", 1)[1])


def test_every_seat_of_a_fleet_has_its_own_command_line():
    seats = [f"{role}-{n}" for role in ("solver", "sim", "pool_state_updater") for n in range(12)]
    assert len({titles.worker("prod", s).cmdline for s in seats}) == len(seats)


def test_the_fork_server_and_fleetd_have_names_of_their_own():
    assert titles.fork_server("prod") == titles.Title("fleet-prod-forkserver", "fleet-forksrv")
    d = titles.daemon("prod", ("--config", "/etc/fleet/prod.toml"))
    assert (d.cmdline, d.comm) == ("fleetd-prod --config /etc/fleet/prod.toml", "fleetd-prod")
    assert titles.daemon("a-very-long-fleet-name").comm == "fleetd-a-very-l"


def test_the_fork_servers_reload_checker_is_told_from_the_fork_server():
    check = titles.fork_server_check("prod")
    assert check == titles.Title("fleet-prod-forkserver-check", "fleet-fscheck")
    assert len(check.comm.encode()) <= titles.COMM_BYTES and check != titles.fork_server("prod")
