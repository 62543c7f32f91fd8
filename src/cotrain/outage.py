"""A failure that repeats while something is away (the coordinator, the DHT), logged where an operator sees it
without a line per attempt.

The first failure of an outage is a warning; while it lasts, one reminder every ``remind_s`` seconds says for how
long and how many attempts failed; the first success after it says the outage is over. A failure nobody expected
(a bug, not an unreachable peer) is logged with its traceback, at error level, on the same schedule.
"""

from __future__ import annotations

import logging
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


def _describe(error: BaseException) -> str:
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):  # a grpc call's error: its status code and details say it all
        return f"{code().name}: {details()}"
    return str(error) or type(error).__name__
