"""Which worker deaths the kernel's OOM killer caused (fleet.rules.oom), on a fake clock."""
from fleet.rules import oom
from fleet.rules.oom import CLAIM_MS, OomBooks

KILL = -9


def _read(books, now, count):
    return oom.observe(books, now, count)


def test_the_first_reading_is_a_baseline_not_a_kill():
    books = _read(OomBooks(), 0, 7)  # seven kills from before boot
    assert books.last == 7 and books.seen == ()
    assert oom.claim(books, 10, KILL, ours=False)[1] is False


def test_a_sigkill_death_after_the_counter_grew_claims_the_kill():
    books = _read(_read(OomBooks(), 0, 0), 100, 1)
    books, killed = oom.claim(books, 120, KILL, ours=False)
    assert killed and books.named == 1 and books.seen == ()
    # one kill names one death: the next SIGKILL is someone's kill -9
    assert oom.claim(books, 130, KILL, ours=False)[1] is False


def test_only_a_sigkill_the_supervisor_did_not_send_is_an_oom_kill():
    books = _read(_read(OomBooks(), 0, 0), 100, 1)
    assert oom.claim(books, 120, KILL, ours=True)[1] is False  # a timeout's kill
    assert oom.claim(books, 120, -15, ours=False)[1] is False  # SIGTERM
    assert oom.claim(books, 120, 1, ours=False)[1] is False  # an exit code
    assert oom.claim(books, 120, KILL, ours=False)[1] is True  # the kill is still there to claim


def test_two_workers_killed_at_once_are_both_named():
    books = _read(_read(OomBooks(), 0, 3), 100, 5)
    books, first = oom.claim(_read(books, 110, 5), 110, KILL, ours=False)
    books, second = oom.claim(_read(books, 111, 5), 111, KILL, ours=False)
    assert first and second and books.named == 2
    assert oom.claim(books, 112, KILL, ours=False)[1] is False


def test_a_kill_no_death_claims_expires_so_a_later_kill_9_is_not_named_oom():
    books = _read(_read(OomBooks(), 0, 0), 1000, 1)  # a process beside the fleet was killed
    assert oom.claim(books, 1000 + CLAIM_MS - 1, KILL, ours=False)[1] is True
    assert oom.claim(books, 1000 + CLAIM_MS, KILL, ours=False)[1] is False
    # expiry at a reading too
    assert _read(books, 1000 + CLAIM_MS, 1).seen == ()


def test_a_counter_that_went_back_is_a_new_baseline_and_unreadable_changes_nothing():
    books = _read(_read(OomBooks(), 0, 9), 100, 2)  # the group was made again
    assert books.last == 2 and books.seen == ()
    assert _read(books, 200, None).last == 2
    books = _read(_read(books, 300, None), 400, 3)
    assert books.seen == (400,)
