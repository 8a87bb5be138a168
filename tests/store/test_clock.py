"""The store's clock (``store.schema.clock``): on PostgreSQL the database's clock decides leases, claims and due times,
whatever the clock of the host that asks. Processes with their clock a minute off (libfaketime) claim, lease and
take maintenance leases against one PostgreSQL store beside a process on the true time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, claim_due_deliveries, enqueue
from prefect_webhooks.store.schema.clock import DatabaseClock, clock_of, host_now, store_now
from prefect_webhooks.store.upkeep.leases import take_lease
from tests.skewed_clocks import skewed_env

ROOT = Path(__file__).resolve().parents[2]

# Run in a process whose clock is off: claims what is due, takes the maintenance lease, prints what it got.
SKEWED_CODE = """
import json, sys
from prefect_webhooks.store.schema.clock import host_now
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.upkeep.leases import take_lease
from prefect_webhooks.store.queue.outbox import claim_due_deliveries
engine = get_engine()
with engine.connect() as connection:
    database = connection.exec_driver_sql("SELECT clock_timestamp() AT TIME ZONE 'UTC'").scalar_one()
claimed = claim_due_deliveries(engine, 100, sys.argv[1], lease_seconds=float(sys.argv[2]))
print(json.dumps({"claimed": sorted(row.id for row in claimed), "lease": take_lease(engine, "prune", sys.argv[1], 30),
                  "host_ahead": (host_now() - database).total_seconds()}))
"""


def run_skewed(seconds: float, owner: str, lease_seconds: float = 30.0) -> dict[str, object]:
    env = {**os.environ, **skewed_env(seconds)}
    done = subprocess.run([sys.executable, "-c", SKEWED_CODE, owner, str(lease_seconds)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def message(number: int) -> dict[str, object]:
    return {"type": "track", "userId": f"u{number}", "event": "E", "properties": {"n": number}}


@pytest.mark.postgres
def test_a_host_a_minute_ahead_takes_no_lease_and_no_retry_before_its_time(postgres_url: str) -> None:
    engine = get_engine()
    enqueue("d", [message(n) for n in range(3)])
    leased, retry, free = sorted(row.id for row in claim_due_deliveries(engine, 100, "true-host", lease_seconds=30))
    # A retry scheduled 30 s from now (by the database's clock), and one message free and due.
    with engine.begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == retry).values(
            next_attempt_at=store_now(engine) + timedelta(seconds=30), lease_owner=None, lease_expires_at=None))
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == free).values(lease_owner=None, lease_expires_at=None))
    assert take_lease(engine, "prune", "true-host", 30)

    ahead = run_skewed(+60, "ahead-host")
    print(f"\nclock 60 s ahead: {ahead}")
    assert abs(float(ahead["host_ahead"]) - 60) < 1, "libfaketime did not move the process's clock"
    # Only the free message: the one leased by the true host for 30 s more and the retry due in 30 s wait.
    assert ahead["claimed"] == [free]
    assert ahead["lease"] is False


@pytest.mark.postgres
def test_a_lease_written_by_a_host_a_minute_behind_lasts_its_full_length(postgres_url: str) -> None:
    engine = get_engine()
    enqueue("d", [message(n) for n in range(2)])
    behind = run_skewed(-60, "behind-host", lease_seconds=30)
    print(f"\nclock 60 s behind: {behind}")
    assert abs(float(behind["host_ahead"]) + 60) < 1, "libfaketime did not move the process's clock"
    assert len(behind["claimed"]) == 2 and behind["lease"] is True
    # Its 30 s lease counts from the database's now, not from a minute ago: nothing is free for the true host.
    assert claim_due_deliveries(engine, 100, "true-host", lease_seconds=30) == []
    assert not take_lease(engine, "prune", "true-host", 30)


@pytest.mark.postgres
def test_store_now_follows_the_database_clock_without_a_round_trip(postgres_url: str) -> None:
    engine = get_engine()
    clock = clock_of(engine)
    assert clock is not None and clock_of(None) is clock
    with engine.connect() as connection:
        database = connection.exec_driver_sql("SELECT clock_timestamp() AT TIME ZONE 'UTC'").scalar_one()
    assert abs((store_now() - database).total_seconds()) < 0.5
    # A reading a few seconds old is carried forward on the monotonic clock, never re-read by store_now itself.
    reads: list[str] = []
    with engine.connect() as connection:
        connection.exec_driver_sql("SELECT 1")
    from sqlalchemy import event

    event.listen(engine, "before_cursor_execute", lambda *args: reads.append(args[2]))
    started = time.perf_counter()
    for _ in range(10_000):
        store_now()
    per_call = (time.perf_counter() - started) / 10_000
    assert reads == []
    assert per_call < 20e-6, per_call


def test_sqlite_keeps_the_hosts_clock(backend_url: str) -> None:
    engine = get_engine()
    if engine.dialect.name == "sqlite":
        assert clock_of(engine) is None and clock_of(None) is None
        assert abs((store_now() - host_now()).total_seconds()) < 0.1
    else:
        assert clock_of(engine) is not None


def test_a_slow_reading_does_not_replace_a_better_recent_one() -> None:
    clock = DatabaseClock()
    clock.note(1000.0, 10.0, 10.002)  # a 2 ms round trip
    clock.note(1100.0, 20.0, 20.5)  # 500 ms: a thread held up; off by up to 250 ms
    assert clock._reading is not None and clock._reading[0] == 1000.0
    clock.note(1100.0, 30.0, 30.004)  # 4 ms against 2 ms: not better
    assert clock._reading is not None and clock._reading[0] == 1000.0
    clock.note(1099.0, 80.0, 80.5)  # the kept reading is a minute old: the slow one is better than nothing
    assert clock._reading[0] == 1099.0
    clock.note(1099.5, 80.6, 80.601)  # a fast one always replaces
    assert clock._reading[0] == 1099.5


def test_a_reading_from_another_server_replaces_a_better_one() -> None:
    # A failover: the promoted standby is another machine, another clock. Its first reading, slow as it may be
    # while every process reconnects, is kept at once rather than after TRUST_SECONDS of the old server's.
    clock = DatabaseClock()
    clock.note(1000.0, 10.0, 10.002, server="10.0.0.1:5432")
    clock.note(1012.0, 12.0, 12.5, server="10.0.0.2:5432")
    assert clock._reading is not None and clock._reading[0] == 1012.0
    clock.note(1020.0, 20.0, 21.0, server="10.0.0.2:5432")  # the same server again: slower, not kept
    assert clock._reading[0] == 1012.0


@pytest.mark.postgres
def test_a_reading_knows_the_server_it_came_from(postgres_url: str) -> None:
    from urllib.parse import urlsplit

    engine = get_engine(postgres_url)
    clock = DatabaseClock()
    with engine.connect() as connection:
        clock.read(connection.connection.dbapi_connection)
    where = urlsplit(postgres_url)
    assert clock._server == f"{where.hostname}:{where.port or 5432}"
