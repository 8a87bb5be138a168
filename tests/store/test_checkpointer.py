"""SQLite's WAL copied back by the engine's checkpointer thread, never inside a committing transaction."""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from prefect_webhooks.store.engine import checkpointer
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine


def test_a_commit_leaves_the_wal_to_the_checkpointer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpointer, "INTERVAL", 2.0)  # time to look at the files before its first checkpoint
    path = tmp_path / "store.db"
    engine = get_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == 0
            connection.exec_driver_sql("CREATE TABLE filler (body BLOB)")
        before = path.stat().st_size
        with engine.begin() as connection:  # 2,500 pages: SQLite's default would copy them back in this commit
            connection.execute(text("INSERT INTO filler VALUES (:b)"), [{"b": os.urandom(4000)} for _ in range(2500)])
        assert path.stat().st_size - before < 1_000_000  # still in the WAL
        deadline = time.monotonic() + 15
        while path.stat().st_size - before < 9_000_000:
            assert time.monotonic() < deadline, "the checkpointer did not copy the WAL back"
            time.sleep(0.1)
    finally:
        dispose_engines()


def test_a_removed_store_is_not_made_again_by_its_checkpointer(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    running = checkpointer.Checkpointer(path, interval=0.05).start()
    time.sleep(0.3)
    running.stop()
    assert not path.exists() and running.checkpoints == 0


def test_the_wal_starts_again_under_writes_that_hardly_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A writer committing 1 MB at a time with 2 ms between its transactions, as a busy batch writer does, and short
    # reads beside it, as serve's lookups are: a PASSIVE checkpoint alone never finds the WAL wholly copied when the
    # next writer starts, so the WAL is never started again and holds all 300 MB written. A RESTART needs the write
    # lock for a moment, which it finds between two transactions (with none between them it found one only by chance,
    # once in a run on a loaded machine). A reader that scans the whole growing table would hold the WAL longer than
    # a RESTART waits for.
    monkeypatch.setattr(checkpointer, "INTERVAL", 0.1)
    monkeypatch.setattr(checkpointer, "RESTART_ABOVE", 8_000_000)
    monkeypatch.setattr(checkpointer, "RESTART_SECONDS", 0.2)
    path = tmp_path / "store.db"
    wal = Path(f"{path}-wal")
    engine = get_engine(f"sqlite:///{path}")
    stop = threading.Event()

    def read_on() -> None:
        while not stop.is_set():
            with engine.connect() as connection:
                connection.exec_driver_sql("SELECT length(body) FROM filler ORDER BY rowid DESC LIMIT 1").all()

    def started_again() -> int:
        # The WAL header's checkpoint sequence number: one more each time a writer starts the WAL from its beginning.
        with wal.open("rb") as header:
            return struct.unpack(">I", header.read(16)[12:])[0]

    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE filler (body BLOB)")
        first = started_again()
        reader = threading.Thread(target=read_on)
        reader.start()
        try:
            largest = 0
            for _ in range(300):
                with engine.begin() as connection:
                    connection.execute(text("INSERT INTO filler VALUES (:b)"), [{"b": os.urandom(4000)}] * 250)
                largest = max(largest, wal.stat().st_size)
                time.sleep(0.002)
            restarts = started_again() - first
        finally:
            stop.set()
            reader.join()
        assert restarts >= 2, f"the WAL was started again {restarts} time(s) while 300 MB were written"
        # With two cores kept busy beside the test: 10-17 restarts, the WAL 20-40 MB at most.
        assert largest < 150_000_000, f"the WAL grew to {largest / 1e6:.0f} MB of the 300 MB written"
    finally:
        dispose_engines()
