"""The launchers' signal blocks, in this process: :func:`uninterrupted` holds a signal back through a clean-up and
delivers it after, to the handler that was there before; :func:`signals_interrupt` turns SIGTERM into Ctrl-C."""

from __future__ import annotations

import os
import signal

import pytest

from cotrain.cli.launch import signals_interrupt, uninterrupted


@pytest.fixture
def received():
    """SIGTERM and SIGHUP recorded by a handler of the test's own, the previous handlers back after the test."""
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield got
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_a_signal_inside_the_block_is_delivered_after_it_not_during_it(received):
    steps = []
    with uninterrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        steps.append("clean-up ran on")
        assert received == []
    assert steps == ["clean-up ran on"]
    assert received == [signal.SIGTERM]


def test_only_the_first_of_several_signals_is_delivered_after_the_block(received):
    with uninterrupted():
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGHUP]


def test_nested_blocks_hold_the_signal_until_the_outer_one_ends(received):
    with uninterrupted():
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)
        assert received == []
    assert received == [signal.SIGTERM]


def test_a_block_ending_with_an_exception_lets_that_exception_go_on(received):
    with pytest.raises(ValueError):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the clean-up failed")
    assert received == []


def test_no_signal_no_delivery_and_the_handlers_come_back(received):
    before = signal.getsignal(signal.SIGTERM)
    with uninterrupted():
        pass
    assert received == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_launcher_ended_during_its_clean_up_ends_as_ctrl_c_does_after_it(received):
    with pytest.raises(KeyboardInterrupt):
        with signals_interrupt():
            with uninterrupted():
                os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("the held SIGTERM was not delivered after the clean-up")
