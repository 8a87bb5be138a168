"""SQLite: the WAL is copied back into the database by a thread of its own, never inside a committing transaction.

With SQLite's default, the commit that takes the WAL past 1,000 pages copies the WAL back into the database, and
syncs it, before it returns. Measured on the dedupe path (random keys: about 950 pages dirtied by a call of 1,000
ids), that was a checkpoint in nearly every commit and a third of the call's time, paid by the batch writer while
requests waited. Each engine of ``engines.get_engine`` turns it off on its connections (``wal_autocheckpoint=0``)
and runs a ``Checkpointer``: a PASSIVE checkpoint every ``INTERVAL`` seconds on a connection of its own, which waits
for no writer and makes none wait (when another process's checkpointer is at it, the call returns busy and the next
one catches up). Once a checkpoint has copied the whole WAL, the next writer starts it again from its beginning and
``journal_size_limit`` cuts the file back, so the WAL stays about as large as ``INTERVAL`` of writes.

Under writes that never pause, a PASSIVE checkpoint never finds the WAL wholly copied when the next writer starts
(frames are appended while it copies), so the WAL is never started again and grows for as long as the load lasts:
1.7 GB in four minutes of 4,000 events/s on a 15 GB store, where each checkpoint's pages land all over the file.
Once the WAL is past ``RESTART_ABOVE`` the thread asks for a RESTART checkpoint instead, at most every
``RESTART_SECONDS``: it holds writers while it copies the few frames left and readers move on (at most
``RESTART_WAIT_MS``; a long reader, such as a pass sealing a partition, makes it give up until the next try), and
the next writer starts the WAL from its beginning.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

logger = logging.getLogger("prefect_webhooks.store.checkpointer")  # its name before store/engine/

INTERVAL = 0.5
WAL_SIZE_LIMIT = 64 * 1024 * 1024  # the engines' journal_size_limit: what a WAL started again is cut back to
RESTART_ABOVE = WAL_SIZE_LIMIT
RESTART_WAIT_MS = 50
RESTART_SECONDS = 2.0


class Checkpointer:
    """A daemon thread that checkpoints one SQLite store's WAL every ``interval`` seconds until ``stop``."""

    def __init__(self, path: str | Path, interval: float | None = None) -> None:
        self.path = Path(path)
        self.interval = interval or INTERVAL
        self.checkpoints = 0
        self._wal = self.path.with_name(f"{self.path.name}-wal")
        self._restarted_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"checkpoint {self.path.name}", daemon=True)

    def start(self) -> Checkpointer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the checkpoint under way, if any (a forked child's copy has no thread and stops at once)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        while not self._stop.wait(self.interval):
            try:
                if connection is None:
                    # mode=rw: a store removed meanwhile (a test's) is an error here, never a new empty file.
                    connection = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=1,
                                                 check_same_thread=False)
                    connection.execute(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
                connection.execute(f"PRAGMA wal_checkpoint({self._mode()})").fetchone()
                self.checkpoints += 1
            except sqlite3.Error as exc:
                logger.debug("checkpointing %s: %s", self.path, exc)
                if connection is not None:
                    connection.close()
                    connection = None
        if connection is not None:
            connection.close()

    def _mode(self) -> str:
        if time.monotonic() - self._restarted_at < RESTART_SECONDS:
            return "PASSIVE"
        try:
            grown = self._wal.stat().st_size > RESTART_ABOVE
        except OSError:
            grown = False
        if not grown:
            return "PASSIVE"
        self._restarted_at = time.monotonic()
        return "RESTART"
