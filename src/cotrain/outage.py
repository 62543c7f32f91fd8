"""Lines that repeat, logged where an operator sees them without a line per repeat.

:class:`Outage`: a failure that repeats while something is away (the coordinator, the DHT). The first failure of an
outage is a warning; while it lasts, one reminder every ``remind_s`` seconds says for how long and how many attempts
failed; the first success after it says the outage is over. A failure nobody expected (a bug, not an unreachable
peer) is logged with its traceback, at error level, on the same schedule.

:class:`Repeats`: news that repeats while all goes well (a round's decision, a round done). The first of a kind is
logged, then one every ``every_s`` seconds with the count of those in between; the others go at debug level.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable, Optional


class Outage:
    """Tracks one kind of repeated failure (``what``: "heartbeat", "progress board", ...) for one logger.

    ``remind_s``: seconds between reminders while the failure lasts. A minute keeps a day-long outage to about
    1,500 lines; lower it when a dashboard scrapes logs for liveness.
    """

    def __init__(self, what: str, logger: logging.Logger, remind_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.logger, self.remind_s, self.clock = what, logger, remind_s, clock
        self.since: Optional[float] = None
        self.failures = 0  # in the current outage
        self._reminded = 0.0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, error: BaseException, expected: bool = True, action: str = "retrying") -> None:
        """Record a failed attempt; logs on the first and then every ``remind_s`` seconds."""
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since, self._reminded = now, now
            self._log(error, expected, f"{self.what} failed: {_describe(error)}; {action}")
        elif now - self._reminded >= self.remind_s:
            self._reminded = now
            self._log(error, expected, f"{self.what} still failing after {now - self.since:.0f}s "
                                       f"({self.failures} attempts): {_describe(error)}; {action}")

    def succeeded(self) -> None:
        """Record a success; ends an outage (and says so) if one was going on."""
        if self.since is not None:
            self.logger.info("%s works again after %.0fs (%d failed attempts)", self.what, self.clock() - self.since,
                             self.failures)
        self.since, self.failures = None, 0

    def _log(self, error: BaseException, expected: bool, message: str) -> None:
        if expected:
            self.logger.warning("%s", message)
        else:
            self.logger.error("%s", message, exc_info=(type(error), error, error.__traceback__))


_DIGITS = re.compile(r"\d+")


class Repeats:
    """Info lines of kinds that repeat (``kind``: what a line says without its counters, such as a round's reason
    for ending): one of a kind every ``every_s`` seconds at info level, the rest at debug level. A swarm of small
    models on loopback ends ten rounds a second, and two lines a round were twenty a second from every node.

    ``every_s``: 10 s keeps a steady node to a few lines a minute; 0 logs every line at info level. Kinds are
    remembered up to ``max_kinds`` (the oldest forgotten first), so that reasons naming peers do not grow it."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0, max_kinds: int = 64,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.every_s, self.max_kinds, self.clock = logger, every_s, max_kinds, clock
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (when one was last logged at info, how many since)

    def due(self, kind: str) -> Optional[int]:
        """Whether a line of ``kind`` goes at info level now: the number of lines of its kind that went at debug
        level since the last one did (0 for the first), or None (this one goes at debug level). Kinds are compared
        with their numbers taken out: "all 3 peers at round 17 reached their steps" is of the kind of round 18's."""
        kind = _DIGITS.sub("#", kind)
        now = self.clock()
        last = self._kinds.pop(kind, None)
        if last is not None and now - last[0] < self.every_s:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        self._kinds[kind] = (now, 0)  # the newest last
        while len(self._kinds) > self.max_kinds:
            del self._kinds[next(iter(self._kinds))]
        return 0 if last is None else last[1]

    def info(self, kind: str, message: str, *args) -> None:
        """``logger.info(message, *args)`` when a line of ``kind`` is due, with how many were quiet since; else
        ``logger.debug``."""
        quiet = self.due(kind)
        if quiet is None:
            self.logger.debug(message, *args)
        elif quiet:
            self.logger.info(message + " (and %d like it since, at debug level)", *args, quiet)
        else:
            self.logger.info(message, *args)


def _describe(error: BaseException) -> str:
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):  # a grpc call's error: its status code and details say it all
        return f"{code().name}: {details()}"
    return str(error) or type(error).__name__
