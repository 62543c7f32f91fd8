"""Outage: one warning when a repeated failure starts, a reminder per interval, one line when it is over."""

import logging

from cotrain.outage import Outage


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
