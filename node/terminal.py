"""What a node shows on a terminal: a live status line and download progress bars (rich); log lines when it runs as a
service."""

from __future__ import annotations

import contextlib
import logging
import sys

logger = logging.getLogger(__name__)


class TerminalStatus:
    """A live status line on a terminal (rich); nothing when the node runs as a service."""

    def __init__(self):
        self._status = None
        if sys.stderr.isatty():
            from rich.console import Console

            self._status = Console(stderr=True).status("training")
            self._status.start()

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(text)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()


@contextlib.contextmanager
def download_progress(what: str):
    """A progress bar on a terminal, a log line per quarter otherwise; yields the callback(received, total)."""
    if sys.stderr.isatty():
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), transient=True) as bar:
            task = bar.add_task(f"downloading {what}", total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total or None)
        return
    logged = [0]

    def log(done: int, total: int) -> None:
        quarter = 4 * done // total if total else 0
        if quarter > logged[0]:
            logged[0] = quarter
            logger.info("downloading %s: %d of %d bytes", what, done, total)

    yield log

