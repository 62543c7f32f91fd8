"""Outage: one warning when a repeated failure starts, a reminder per interval, one line when it is over. Repeats:
one line of a kind per interval, with the count of those in between."""

import logging

from cotrain.outage import Outage, Repeats


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def records(caplog, level):
    return [r for r in caplog.records if r.name == "t" and r.levelno == level]


def test_an_outage_logs_once_then_reminds_then_says_it_is_over(caplog):
    caplog.set_level(logging.INFO, logger="t")
    clock = Clock()
    outage = Outage("heartbeat", logging.getLogger("t"), remind_s=60, clock=clock)
    for _ in range(100):  # a failure every second for 100 s
        outage.failed(ConnectionError("refused"))
        clock.now += 1
    assert outage.down and outage.failures == 100
    assert len(records(caplog, logging.WARNING)) == 2  # the first failure and one reminder at 60 s
    outage.succeeded()
    assert not outage.down and outage.failures == 0
    assert len(records(caplog, logging.INFO)) == 1
    outage.succeeded()  # success without an outage says nothing
    assert len(records(caplog, logging.INFO)) == 1
    outage.failed(ConnectionError("refused"))  # a new outage warns again at once
    assert len(records(caplog, logging.WARNING)) == 3


def test_an_unexpected_failure_is_an_error_with_its_traceback(caplog):
    caplog.set_level(logging.INFO, logger="t")
    outage = Outage("progress board", logging.getLogger("t"))
    try:
        raise KeyError("bug")
    except KeyError as e:
        outage.failed(e, expected=False)
    [record] = records(caplog, logging.ERROR)
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_repeats_log_one_line_of_a_kind_per_interval_and_count_the_rest(caplog):
    caplog.set_level(logging.DEBUG, logger="t")
    clock = Clock()
    news = Repeats(logging.getLogger("t"), every_s=10, clock=clock)
    for n in range(25):  # ten rounds a second for 2.5 s, then one more after 10 s
        news.info("done with 3", "round %d done", n)
        clock.now += 0.1
    assert [r.getMessage() for r in records(caplog, logging.INFO)] == ["round 0 done"]
    assert len(records(caplog, logging.DEBUG)) == 24
    news.info("a peer left", "round %d: %s", 25, "a peer left")  # another kind: at once
    clock.now = 12.0
    news.info("done with 3", "round %d done", 26)
    assert [r.getMessage() for r in records(caplog, logging.INFO)] == [
        "round 0 done", "round 25: a peer left", "round 26 done (and 24 like it since, at debug level)"]


def test_repeats_remember_a_bounded_number_of_kinds():
    clock = Clock()
    news = Repeats(logging.getLogger("t"), every_s=10, max_kinds=3, clock=clock)
    assert [news.due(f"peer {name} left") for name in "abcde"] == [0, 0, 0, 0, 0]
    assert news.due("peer e left") is None  # remembered: quiet
    assert news.due("peer a left") == 0  # forgotten (the oldest): loud again
    assert news.due("round 17: all 3 peers ready") == 0
    assert news.due("round 18: all 4 peers ready") is None  # a kind is its words: its numbers are taken out
    every = Repeats(logging.getLogger("t"), every_s=0, clock=clock)
    assert [every.due("x"), every.due("x")] == [0, 0]  # 0 s: every line at info level
