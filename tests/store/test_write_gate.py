"""The write gate: SQLite's one writer taken in turn through a ``flock`` beside the store, with real SQLite files,
threads and processes."""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prefect_webhooks.store.engine.file_modes import prepare_store_file
from prefect_webhooks.store.engine.write_gate import GATE_SUFFIX, GatedConnection


def gated(path: Path, timeout: float = 30.0) -> GatedConnection:
    connection = sqlite3.connect(path, timeout=timeout, check_same_thread=False, factory=GatedConnection)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "webhooks.db"
    prepare_store_file(path)  # as serve makes a new store: owner-only
    with gated(path) as connection:
        connection.cursor().execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    return path


def write_in_thread(path: Path, events: list[tuple[str, float]], name: str = "second", hold: float = 0.0
                    ) -> threading.Thread:
    """A thread that reads, then writes, holds its transaction ``hold`` seconds and commits, noting when each was
    done."""

    def run() -> None:
        connection = gated(path)
        cursor = connection.cursor()
        started = time.monotonic()
        cursor.execute("SELECT count(*) FROM t").fetchall()
        events.append(("read", time.monotonic() - started))
        cursor.execute("INSERT INTO t (v) VALUES (?)", (name,))
        events.append((name, time.monotonic() - started))
        time.sleep(hold)
        connection.commit()
        connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_writers_wait_at_the_gate_in_the_order_they_came_and_readers_do_not_wait(store: Path) -> None:
    # SQLite's busy handler would most often let the later writer in first: the earlier one has been waiting long
    # enough to sleep 100 ms between its looks, the later one looks after 1, 2 and 5 ms.
    first = gated(store)
    first.cursor().execute("INSERT INTO t (v) VALUES ('first')")
    events: list[tuple[str, float]] = []
    earlier = write_in_thread(store, events, "earlier", hold=0.2)
    time.sleep(0.8)
    later = write_in_thread(store, events, "later")
    time.sleep(0.2)
    assert [name for name, _ in events] == ["read", "read"]  # both read at once; both writes are waiting
    first.commit()
    earlier.join(10)
    later.join(10)
    assert [name for name, _ in events] == ["read", "read", "earlier", "later"]
    with gated(store) as check:
        assert [row[0] for row in check.cursor().execute("SELECT v FROM t ORDER BY id")] == [
            "first", "earlier", "later"]


def test_a_rollback_and_a_failed_write_give_the_gate_back(store: Path) -> None:
    first = gated(store)
    cursor = first.cursor()
    cursor.execute("INSERT INTO t (v) VALUES ('rolled back')")
    first.rollback()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        cursor.execute("INSERT INTO missing (v) VALUES (1)")
    # Neither left the gate taken: another connection takes it at once, without waiting.
    events: list[tuple[str, float]] = []
    write_in_thread(store, events).join(10)
    assert events[1][0] == "second" and events[1][1] < 0.3


def test_a_with_block_gives_the_gate_back(store: Path) -> None:
    connection = gated(store)
    with connection:
        connection.cursor().execute("INSERT INTO t (v) VALUES ('committed by with')")
        assert connection.holds_gate
    assert not connection.holds_gate
    connection.close()


def test_the_gate_file_is_the_owners_only(store: Path) -> None:
    assert stat.S_IMODE(os.stat(str(store) + GATE_SUFFIX).st_mode) == 0o600


def test_a_store_shared_with_a_group_shares_its_gate(tmp_path: Path) -> None:
    store = tmp_path / "shared.db"
    store.touch()
    store.chmod(0o640)
    gated(store).close()
    assert stat.S_IMODE(os.stat(str(store) + GATE_SUFFIX).st_mode) == 0o640


def test_a_writer_killed_inside_its_transaction_frees_the_gate(store: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        "from prefect_webhooks.store.engine.write_gate import GatedConnection\n"
        f"c = sqlite3.connect({str(store)!r}, timeout=30, factory=GatedConnection)\n"
        "c.cursor().execute(\"INSERT INTO t (v) VALUES ('never committed')\")\n"
        "print('holding', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        events: list[tuple[str, float]] = []
        thread = write_in_thread(store, events)
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:  # its read, however loaded the machine
            time.sleep(0.01)
        time.sleep(0.4)
        assert [name for name, _ in events] == ["read"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    thread.join(10)
    assert [name for name, _ in events] == ["read", "second"]
    with gated(store) as check:
        assert [row[0] for row in check.cursor().execute("SELECT v FROM t")] == ["second"]


def test_a_writer_goes_on_without_the_gate_after_the_busy_timeout(store: Path) -> None:
    # Something holds the gate but no write lock (nothing the project does; a stand-in for a holder that hangs):
    # the writer waits as long as SQLite's busy timeout would, then writes, SQLite's own lock deciding.
    with open(str(store) + GATE_SUFFIX, "r+b") as stranger:
        fcntl.flock(stranger, fcntl.LOCK_EX)
        connection = gated(store, timeout=0.5)
        started = time.monotonic()
        connection.cursor().execute("INSERT INTO t (v) VALUES ('late')")
        connection.commit()
        waited = time.monotonic() - started
    assert 0.45 < waited < 3.0
    # The waiter let go of the turn it got after the writer stopped waiting: the next write does not wait.
    started = time.monotonic()
    connection.cursor().execute("INSERT INTO t (v) VALUES ('next')")
    connection.commit()
    assert time.monotonic() - started < 0.3
    connection.close()


def test_the_stores_engine_uses_the_gate(tmp_path: Path) -> None:
    from sqlalchemy import text

    from prefect_webhooks.store.engine.engines import _make_engine

    engine = _make_engine(f"sqlite:///{tmp_path / 'webhooks.db'}")
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM outbox"))
            driver = connection.connection.driver_connection
            assert isinstance(driver, GatedConnection) and driver.holds_gate
        assert not driver.holds_gate
    finally:
        engine.dispose()
