"""SQLite's WAL copied back by the engine's checkpointer thread, never inside a committing transaction."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from prefect_webhooks.store import checkpointer
from prefect_webhooks.store.engines import dispose_engines, get_engine


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
