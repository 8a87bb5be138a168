"""Dedupe at its own cost: what one ingest call's dedupe costs as the window fills, against the previous layout.

Usage:
    python bench/bench_dedupe.py                          # windows of 0, 2M and 10M ids, SQLite
    python bench/bench_dedupe.py --sizes 0 20000000 --store postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_dedupe.py --sizes 0 10000000 50000000 --reference-up-to 10000000

For each size, two stores are filled with that many remembered messageIds (random UUIDs, received over the last
24 hours, in time order): one in this release's layout (``seen_ids``: a table per period, a filter over each sealed
one, the filters built as the retention pass builds them), one in the previous release's (one ``seen_messages``
table keyed by source and messageId, with its receipt-time index, as it dedupes: look the batch up, insert the new
ids). Then, on each, ``--calls`` calls of ``--batch`` ids each (1 % repeats of ids in the window, the rest new) are
timed as ingestion makes them: one transaction that looks the batch up and remembers the new ids. The figures are
the call's p50 and p99 and the ids per second of the calls back to back, and for this release the first call of
a new process (it loads the kept filters) and the memory those filters take.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = "web-app"
WINDOW = 86400.0


def message_id(index: int) -> str:
    """The ``index``-th id of the window: a random-looking UUID, the same on both layouts."""
    return str(uuid.UUID(bytes=hashlib.blake2b(index.to_bytes(8, "little"), digest_size=16).digest(), version=4))


def new_store(base: str, label: str) -> str:
    if base.startswith("sqlite"):
        return f"sqlite:///{tempfile.mkdtemp(prefix='bench-dedupe-')}/{label}.db"
    import sqlalchemy

    name = f"bench_dedupe_{label}_{uuid.uuid4().hex[:6]}"
    with sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


def fill_periods(url: str, size: int, batch: int = 20_000) -> float:
    from prefect_webhooks.store.dedupe.seen_ids import remember_receipts, seal_periods
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    started = time.monotonic()
    now = store_now()
    for first in range(0, size, batch):
        count = min(batch, size - first)
        receipts = [(message_id(first + n), now - timedelta(seconds=WINDOW * (1 - (first + n) / size)))
                    for n in range(count)]
        with engine.begin() as connection:
            remember_receipts(connection, SOURCE, receipts)
    seal_periods(engine)
    return time.monotonic() - started


OLD_SCHEMA = {
    "sqlite": ("CREATE TABLE seen_messages (source VARCHAR(255) NOT NULL, message_id VARCHAR(1024) NOT NULL, "
               "received_at DATETIME NOT NULL, PRIMARY KEY (source, message_id))"),
    "postgresql": ("CREATE TABLE seen_messages (source VARCHAR(255) NOT NULL, message_id VARCHAR(1024) NOT NULL, "
                   "received_at TIMESTAMP WITHOUT TIME ZONE NOT NULL, PRIMARY KEY (source, message_id))"),
}


def fill_old(url: str, size: int, batch: int = 20_000) -> float:
    from sqlalchemy import text

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(OLD_SCHEMA[engine.dialect.name])
        connection.exec_driver_sql("CREATE INDEX ix_seen_received ON seen_messages (received_at)")
    started = time.monotonic()
    now = store_now()
    insert = text("INSERT INTO seen_messages (source, message_id, received_at) VALUES (:s, :m, :r)")
    for first in range(0, size, batch):
        count = min(batch, size - first)
        with engine.begin() as connection:
            connection.execute(insert, [{"s": SOURCE, "m": message_id(first + n), "r": now - timedelta(
                seconds=WINDOW * (1 - (first + n) / size))} for n in range(count)])
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE seen_messages")
    return time.monotonic() - started


def call_ids(size: int, batch: int, rng: random.Random) -> list[str]:
    repeats = [message_id(rng.randrange(size)) for _ in range(batch // 100)] if size else []
    # New ids as SDKs make them: random UUIDs (no common prefix that would put them side by side in a B-tree).
    return repeats + [str(uuid.uuid4()) for _ in range(batch - len(repeats))]


def time_periods(url: str, size: int, batch: int, calls: int) -> dict:
    from prefect_webhooks.store.dedupe.seen_ids import remember_receipts, seen_receipts
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    rng = random.Random(3)
    seconds: list[float] = []
    repeats_found = 0
    for _ in range(calls):
        ids = call_ids(size, batch, rng)
        began = time.perf_counter()
        with engine.begin() as connection:
            now = store_now()
            since = now - timedelta(seconds=WINDOW)
            # As ingestion compares: a receipt in the oldest period but before the window is not a repeat.
            seen = {m: at for m, at in seen_receipts(connection, SOURCE, ids, since).items() if at >= since}
            remember_receipts(connection, SOURCE, [(m, now) for m in ids if m not in seen])
        seconds.append(time.perf_counter() - began)
        repeats_found += len(seen)
    from prefect_webhooks.store.dedupe.seen_ids import _memory

    memory = _memory[engine].filters.nbytes
    return {"first": seconds[0], "seconds": seconds[1:], "repeats": repeats_found, "memory": memory}


def time_old(url: str, size: int, batch: int, calls: int) -> dict:
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import read_store_time, store_now

    engine = get_engine(url)
    rng = random.Random(3)
    seconds: list[float] = []
    repeats_found = 0
    sqlite = engine.dialect.name == "sqlite"
    mark = "?" if sqlite else "%s"
    for _ in range(calls):
        ids = call_ids(size, batch, rng)
        began = time.perf_counter()
        with engine.begin() as connection:
            now = store_now()
            since = now - timedelta(seconds=WINDOW)  # as that release compared, after the lookup
            found: set[str] = set()
            expired: set[str] = set()
            for start in range(0, len(ids), 400):
                chunk = ids[start:start + 400]
                statement = (f"SELECT message_id, received_at FROM seen_messages WHERE source = {mark} AND "
                             f"message_id IN ({', '.join([mark] * len(chunk))})")
                for message, received in connection.exec_driver_sql(statement, (SOURCE, *chunk)):
                    (found if read_store_time(received) >= since else expired).add(message)
            if expired:  # as that release did: an id remembered past the window makes way for its new receipt
                connection.exec_driver_sql(f"DELETE FROM seen_messages WHERE source = {mark} AND message_id = {mark}",
                                           [(SOURCE, message) for message in expired])
            rows = [(SOURCE, m, now.isoformat(sep=" ") if sqlite else now) for m in ids if m not in found]
            connection.exec_driver_sql(f"INSERT INTO seen_messages (source, message_id, received_at) VALUES "
                                       f"({mark}, {mark}, {mark})", rows)
        seconds.append(time.perf_counter() - began)
        repeats_found += len(found)
    return {"first": seconds[0], "seconds": seconds[1:], "repeats": repeats_found}


def bytes_per_id(url: str, size: int) -> str:
    """SQLite: the store's file (checkpointed) per remembered id; the schema's other tables are a few pages."""
    if not url.startswith("sqlite") or not size:
        return ""
    from prefect_webhooks.store.engine.engines import get_engine

    with get_engine(url).connect() as connection:
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return f", {os.path.getsize(url.removeprefix('sqlite:///')) / size:.0f} B per id on disk"


def figures(result: dict, batch: int) -> str:
    ordered = sorted(result["seconds"])
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
    rate = batch * len(ordered) / sum(ordered)
    return f"p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  {rate:8,.0f} ids/s  (repeats found {result['repeats']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 2_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--store", default="sqlite", help="sqlite, or a PostgreSQL server URL to make databases on")
    parser.add_argument("--reference-up-to", type=int, default=None, metavar="IDS",
                        help="fill the previous layout only for windows up to this size (its fill slows as it grows)")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_WEBHOOKS_HOME", tempfile.mkdtemp(prefix="bench-dedupe-home-"))
    from prefect_webhooks.store.engine.engines import dispose_engines

    print(f"dedupe per call of {args.batch} ids (1 % repeats), {args.calls} calls, store {args.store.split('@')[-1]}")
    for size in args.sizes:
        with_reference = args.reference_up_to is None or size <= args.reference_up_to
        ours = new_store(args.store, "periods")
        built = fill_periods(ours, size)
        on_disk = bytes_per_id(ours, size)
        dispose_engines()  # a new process's first call: it loads the kept filters
        result = time_periods(ours, size, args.batch, args.calls)
        if with_reference:
            theirs = new_store(args.store, "previous")
            built_old = fill_old(theirs, size)
            on_disk_old = bytes_per_id(theirs, size)
            reference = time_old(theirs, size, args.batch, args.calls)
            print(f"\nwindow of {size:,} ids (filled in {built:.0f} s{on_disk}; previous layout {built_old:.0f} s"
                  f"{on_disk_old})")
        else:
            print(f"\nwindow of {size:,} ids (filled in {built:.0f} s{on_disk}; previous layout not filled at this "
                  f"size, see the smaller windows of this run)")
        print(f"  this release:     {figures(result, args.batch)}; first call {result['first'] * 1000:.0f} ms, "
              f"filters {result['memory'] / 1e6:.0f} MB")
        if with_reference:
            print(f"  previous layout:  {figures(reference, args.batch)}")
        dispose_engines()


if __name__ == "__main__":
    main()
