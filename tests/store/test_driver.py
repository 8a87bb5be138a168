"""Statements straight to the driver: inside the caller's transaction, committed and rolled back with it, and on
SQLite taking their turn at the write gate like every other write."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.driver import driver_executemany, driver_rows
from prefect_webhooks.store.schema.tables import SuppressedUser

SUPPRESSED = SuppressedUser.__table__
AT = "2026-12-04 12:00:00.000000"


def _insert(dialect: str) -> str:
    mark = "?" if dialect == "sqlite" else "%s"
    return f"INSERT INTO {SUPPRESSED.name} (source, user_id, created_at) VALUES ({mark}, {mark}, {mark})"


def _count(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(SUPPRESSED)).scalar_one()


def test_rows_written_through_the_driver_commit_and_roll_back_with_the_callers_transaction(backend_url: str) -> None:
    engine = get_engine(backend_url)
    statement = _insert(engine.dialect.name)
    with engine.begin() as connection:
        driver_executemany(connection, statement, [("web", "ann", AT), ("web", "bob", AT)])
        # The transaction sees its own rows, through SQLAlchemy and through the driver alike.
        assert driver_rows(connection, f"SELECT user_id FROM {SUPPRESSED.name} ORDER BY user_id") == [("ann",),
                                                                                                       ("bob",)]
    assert _count(engine) == 2
    with pytest.raises(RuntimeError), engine.begin() as connection:
        driver_executemany(connection, statement, [("web", "cid", AT)])
        raise RuntimeError("the caller's transaction fails after the write")
    assert _count(engine) == 2


def test_a_connection_outside_a_transaction_begins_one_that_its_commit_ends(backend_url: str) -> None:
    engine = get_engine(backend_url)
    statement = _insert(engine.dialect.name)
    with engine.connect() as connection:
        driver_executemany(connection, statement, [("web", "ann", AT)])
        assert connection.in_transaction()
        connection.commit()
    with engine.connect() as connection:
        driver_executemany(connection, statement, [("web", "bob", AT)])
        # Closed without a commit: rolled back, as SQLAlchemy's own statements would be.
    assert _count(engine) == 1


def test_a_write_through_the_driver_holds_sqlites_write_gate_until_the_commit(store_url: str) -> None:
    engine = get_engine(store_url)
    with engine.begin() as connection:
        gated = connection.connection.driver_connection
        assert not gated.holds_gate
        driver_rows(connection, f"SELECT 1 FROM {SUPPRESSED.name} LIMIT 1")
        assert not gated.holds_gate  # a read waits for no one
        driver_executemany(connection, _insert("sqlite"), [("web", "ann", AT)])
        assert gated.holds_gate
    assert not gated.holds_gate
