"""``STATE_DIR/status.json``: what a node's heartbeat reports (round, rounds completed, bytes, ...) and when, kept on
its machine for its owner's monitoring, benches and tests, and readable while the coordinator is away.

The training loop only says that a new figure is due (:meth:`StatusFile.due`); a thread of the node takes the
snapshot and writes the file, so that the loop does not pay for it: gathering the figures, JSON and an atomic write
took 5-7 ms of a 3-node sync step (about 0.2 s) on 2 cores. Writes that fall due while one is under way, or within
``min_interval_s`` of the last, are one write: the file always holds a snapshot taken after the last :meth:`due`, at
most ``min_interval_s`` late.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Callable

from cotrain.checkpoint import atomic_write_bytes
from cotrain.outage import Outage

logger = logging.getLogger(__name__)


#: the least time between two writes. A write is due at every new round, and rounds of a small model come ten a
#: second: at 8 nodes on 2 cores the figures, their JSON and the file's atomic replacement were a tenth of a node's
#: Python time (py-spy). A reader polling the file sees figures at most this old
MIN_INTERVAL_S = 0.5


class StatusFile:
    """Writes ``snapshot()`` (a JSON-able dict) to ``path`` atomically, on a thread of its own, once after each
    :meth:`due` (at most once every ``min_interval_s``); :meth:`close` stops the thread and writes the last figures
    from the caller's thread."""

    def __init__(self, path: Path, snapshot: Callable[[], dict], min_interval_s: float = MIN_INTERVAL_S):
        self.path, self.snapshot, self.min_interval_s = path, snapshot, min_interval_s
        self.writes = 0
        self._outage = Outage("writing status.json", logger)
        self._due = threading.Event()
        self._closing = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # one write at a time: the thread's and close()'s
        self._thread = threading.Thread(target=self._run, name="status-file", daemon=True)
        self._thread.start()

    def due(self) -> None:
        """New figures to write (returns at once)."""
        self._due.set()

    def write(self) -> None:
        """Take the snapshot and write it now, on the caller's thread. A failure is logged (once per outage), never
        raised: the node trains on."""
        with self._lock:
            try:
                data = json.dumps(self.snapshot()).encode()
                atomic_write_bytes(self.path, data, durable=False)
            except OSError as e:  # a full disk, a folder gone: logged once per outage
                self._outage.failed(e, action="training on")
            except Exception as e:  # noqa: BLE001 - a bug in the figures: logged with its traceback, the thread lives
                self._outage.failed(e, expected=False, action="training on")
            else:
                self.writes += 1
                self._outage.succeeded()

    def close(self) -> None:
        """Stop the thread, then write the figures the node leaves with."""
        self._closed = True
        self._closing.set()
        self._due.set()
        self._thread.join(timeout=10)
        self.write()

    def _run(self) -> None:
        while True:
            self._due.wait()
            if self._closed:
                return
            self._due.clear()
            self.write()
            self._closing.wait(self.min_interval_s)  # what falls due meanwhile is written next, in one write
