"""Shared fixtures. Every test gets its own fleet name, so segments never collide
under pytest-xdist, and whatever a test creates is removed even when it fails."""
from __future__ import annotations

import os
import signal

import pytest

from fleet.shm import dataplane
from fleet.shm.table import segment
from tests.daemons import remove_segments
from tests.fleets import unique_name


@pytest.fixture
def fleet_name(request):
    """A fleet name unique to this test; its table and data segments are unlinked afterwards,
    and anything else under its names in /dev/shm (another uid's too: a test's plants)."""
    name = unique_name("t")
    yield name
    segment.unlink(name)
    dataplane.unlink(name)
    remove_segments(name)


@pytest.fixture
def table(fleet_name):
    """A real table of this test's fleet, filled with `tests.fleet_tables`' known values."""
    from tests import fleet_tables as ft

    t = ft.create_table(fleet_name)
    ft.populate(t)
    yield t
    t.close()
    t.unlink()


@pytest.fixture
def reaper():
    """Collects child pids (or Popen/Process objects); kills what is still alive at teardown."""
    children = []
    yield children
    for child in children:
        pid = getattr(child, "pid", child)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
        try:
            if hasattr(child, "join"):
                child.join(5)
            elif hasattr(child, "wait"):
                child.wait(5)
            else:
                os.waitpid(pid, 0)
        except (ChildProcessError, OSError):
            pass


def _holds_one_worker_long(item) -> bool:
    """The VM suite's tests: one boot, shared, that keeps one xdist worker for minutes."""
    mark = item.get_closest_marker("xdist_group")
    return mark is not None and mark.args[:1] == ("vm",)


def pytest_collection_modifyitems(config, items):
    # The VM group is the longest piece of the suite and runs on one worker (`--dist
    # loadgroup`; see the pytest pin in pyproject.toml): collected first, it is handed out
    # first and runs beside the rest, instead of starting when the rest ends and adding its
    # whole length to the run. (A stable sort: every other test keeps its order.)
    items.sort(key=lambda item: 0 if _holds_one_worker_long(item) else 1)
