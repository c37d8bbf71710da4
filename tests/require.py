"""What a test needs of the host: root, a cgroup hierarchy, PSI, two CPUs. Where it is
missing the test skips with one line saying why; where the host is known to have it all
(`.ci/run` sets ``FLEET_REQUIRE_HOST=1``; hosted CI runners set ``CI``) it fails instead,
so a CI machine that lost a capability shows red rather than a quiet skip."""
from __future__ import annotations

import os

import pytest

REQUIRE = "FLEET_REQUIRE_HOST"


def required() -> bool:
    """Must every host capability a test needs be there?"""
    return os.environ.get(REQUIRE) == "1" or bool(os.environ.get("CI"))


def lacking(why: str) -> None:
    """The host lacks what the test needs (`why`): skip it, or fail it where it is required."""
    if required():
        pytest.fail(f"{REQUIRE}=1: {why}")
    pytest.skip(why)


#: A test that takes a core with a busy process, or that needs its fleet's CPUs to go calm
#: once its own busy process stops: they run on one xdist worker, one at a time (`--dist
#: loadgroup`), so one test's noise is never another's contention that never clears.
NOISE_ALONE = pytest.mark.xdist_group("cpu-noise")
