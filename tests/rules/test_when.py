"""Times for people: UTC ISO 8601, to the second or the millisecond."""
from fleet.rules.when import utc


def test_seconds_and_milliseconds():
    assert utc(1_700_000_000) == "2023-11-14T22:13:20Z"
    assert utc(1_700_000_000.166, ms=True) == "2023-11-14T22:13:20.166Z"


def test_milliseconds_that_round_up_carry_into_the_second():
    assert utc(1_700_000_000.9996, ms=True) == "2023-11-14T22:13:21.000Z"


def test_no_time_is_a_dash():
    assert utc(None) == "-" and utc(0) == "-"
