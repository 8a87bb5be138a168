"""The message log with history kept: its size per message, its lookups, and whether the hot path sees the history.

Usage:
    python bench/bench_message_log.py --kept 1000000            # build, measure, compare in one run
    python bench/bench_message_log.py --build-only --kept 5000000 --store sqlite:////tmp/aged.db
    python bench/bench_message_log.py --kept 0 --store sqlite:////tmp/aged.db --rounds 0   # measure it as it is

``--build-only`` is the documented way to give a store realistic history fast: ``--kept`` messages with random
messageIds and users, the seed's body shapes (track, identify, page), one attempt each (3 % a 503 first, 1 % failed
after three), finished evenly over the retention (24 h for delivered, 7 d for failed), written straight into the
log's partitions the way delivery leaves them, in time order, and their messageIds remembered for the dedupe window
(``seen_ids``) as ingestion remembers them.

A measuring run prints, beside our figures, the same history in the previous release's layout (one queue table
holding every outcome, an attempts table, both with their indexes) in a scratch store of the same run; and the
hot path on the aged store beside the same store with nothing kept but its newest partition (the one deliveries
write to) and beside a brand-new store.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DESTINATIONS = ("crm-hooks", "warehouse-hooks", "support-hooks")
SOURCES = ("web-app", "ios-app")
URLS = ("https://hooks.example.com/segment", "https://backup.example.net/webhooks/in")
EVENTS = ("Order Completed", "Product Viewed", "Signed Up", "Cart Viewed", "Checkout Started")


def body_of(kind: str, user: str, rng: random.Random) -> dict:
    stamp = f"2026-11-2{rng.randrange(10)}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:" \
            f"{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z"
    if kind == "identify":
        return {"version": 1, "type": "identify", "userId": user, "timestamp": stamp,
                "traits": {"email": f"{user}@example.com", "plan": rng.choice(("free", "pro", "team")),
                           "logins": rng.randrange(500)}}
    if kind == "page":
        return {"version": 1, "type": "page", "userId": user, "timestamp": stamp, "name": "Pricing",
                "properties": {"path": "/pricing", "url": "https://www.example.com/pricing", "title": "Pricing",
                               "referrer": "https://www.google.com/"}}
    return {"version": 1, "type": "track", "userId": user, "timestamp": stamp, "event": rng.choice(EVENTS),
            "properties": {"revenue": round(rng.uniform(1, 300), 2), "currency": "EUR",
                           "sku": f"SKU-{rng.randrange(10_000)}", "quantity": rng.randrange(1, 5)}}


def build_history(
    url: str, kept: int, *, seed: int = 7, batch: int = 10_000, older_than: float = 0, span: float = 86400
) -> float:
    """Write ``kept`` finished messages into the store's log (see the module); returns seconds.

    ``older_than``: every message finished at least this many seconds ago (history past its retention). ``span``:
    delivered messages spread over this many seconds before that (failed ones over seven times as long).
    """
    from prefect_webhooks.messages.outcomes import Attempt
    from prefect_webhooks.messages.payloads import serialize
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.dedupe.seen_ids import remember_receipts
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.names import name_ids
    from prefect_webhooks.store.log.partitions import (
        STATE_CODES,
        kept_partitions,
        partition_table,
        partitions_for,
    )
    from prefect_webhooks.store.log.records import RecordContent, epoch_ms, pack_record, text_key
    from prefect_webhooks.store.schema.bulk_insert import insert_rows
    from prefect_webhooks.store.schema.tables import OutboxMessage, store_now

    engine = get_engine(url)
    started = time.monotonic()
    now = store_now() - timedelta(seconds=older_than)
    with engine.begin() as connection:
        names = name_ids(connection, DESTINATIONS + SOURCES + URLS)
        # Ids above the queue's, as delivery would have given them (history never names a queued message), and
        # above any history an earlier build left: a second build adds to the store.
        highest = [connection.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {OutboxMessage.__tablename__}")
                   .scalar_one() + 1_000_000_000]
        highest += [connection.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {partition.name}").scalar_one()
                    for partition in kept_partitions(connection)]
        first_id = max(highest) + 1
    rng = random.Random(f"{seed}-{first_id}")  # a second build adds other messages, with their own ids
    remembered_since = store_now() - timedelta(seconds=get_settings().dedupe_window())
    written = 0
    while written < kept:
        size = min(batch, kept - written)
        rows = []
        receipts: dict[str, list] = {}  # messageIds remembered for the dedupe window, per source
        for offset in range(size):
            failed = rng.random() < 0.01
            # In time order, as traffic comes: the periods of the log and of the remembered ids fill at the rate.
            passed = (written + offset + rng.random()) / kept
            finished = now - timedelta(seconds=(1 - passed) * (7 * span if failed else span))
            user = f"user-{rng.randrange(500_000)}"
            kind = rng.choices(("track", "identify", "page"), (0.7, 0.2, 0.1))[0]
            body = serialize(body_of(kind, user, rng))
            url = rng.choice(URLS)
            tries = [Attempt(0, finished - timedelta(milliseconds=40), url, 200, None, rng.uniform(5, 80),
                                 "delivered")]
            if failed:
                tries = [Attempt(0, finished - timedelta(minutes=m), url, 500, None, 12.0, "retry")
                         for m in (30, 5, 0)]
            elif rng.random() < 0.03:
                tries.insert(0, Attempt(0, finished - timedelta(seconds=2), url, 503, None, 9.0, "retry"))
            message_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            content = RecordContent(kind, rng.choice(SOURCES), message_id, user,
                                    "expired: HTTP 500" if failed else None, len(tries),
                                    finished - timedelta(seconds=3), tries[0].attempted_at, body, tries)
            rows.append((("failed" if failed else "delivered"), finished, {
                "id": first_id + written + offset, "destination_id": names[rng.choice(DESTINATIONS)],
                "state": STATE_CODES["failed" if failed else "delivered"], "finished_ms": epoch_ms(finished),
                "message_key": text_key(message_id), "user_key": text_key(user),
                "source_id": names[content.source], "record": pack_record(content, finished, names)}))
            if content.created_at >= remembered_since:
                receipts.setdefault(content.source, []).append((message_id, content.created_at))
        with engine.begin() as connection:
            for source, remembered in receipts.items():
                remember_receipts(connection, source, remembered)
            partitions = partitions_for(connection, {(kind, at) for kind, at, _ in rows})
            by_table: dict[str, list[dict]] = {}
            for kind, at, row in rows:
                by_table.setdefault(partitions[kind, at].name, []).append(row)
            for name, table_rows in by_table.items():
                insert_rows(connection, partition_table(name), table_rows)
        written += size
    if engine.dialect.name == "sqlite":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.monotonic() - started


def old_layout_bytes(kept: int, seed: int = 7) -> float:
    """Bytes per message of the same history in the previous release's layout (queue rows kept with their outcome,
    attempts table, indexes as that release made them), measured in a scratch SQLite store."""
    import sqlite3

    from prefect_webhooks.messages.payloads import serialize

    rng = random.Random(seed)
    path = Path(tempfile.mkdtemp()) / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE outbox (id INTEGER PRIMARY KEY, destination VARCHAR(255), source VARCHAR(255),
          message_type VARCHAR(16), message_id VARCHAR(1024), user_id VARCHAR(1024), body BLOB, state VARCHAR(16),
          reason VARCHAR, attempts INTEGER, created_at DATETIME, first_attempt_at DATETIME, next_attempt_at DATETIME,
          lease_owner VARCHAR(64), lease_expires_at DATETIME);
        CREATE INDEX ix_outbox_due ON outbox (state, next_attempt_at);
        CREATE INDEX ix_outbox_user ON outbox (user_id);
        CREATE TABLE delivery_attempts (id INTEGER PRIMARY KEY, outbox_id BIGINT NOT NULL, attempted_at DATETIME,
          url VARCHAR, status_code INTEGER, error VARCHAR, latency_ms FLOAT, outcome VARCHAR(16));
        CREATE INDEX ix_attempts_outbox ON delivery_attempts (outbox_id);
    """)
    stamp = "2026-11-26 10:00:00.123456"
    for start in range(0, kept, 10_000):
        outbox, attempts = [], []
        for i in range(start, min(kept, start + 10_000)):
            user = f"user-{rng.randrange(500_000)}"
            kind = rng.choices(("track", "identify", "page"), (0.7, 0.2, 0.1))[0]
            outbox.append((i + 1, rng.choice(DESTINATIONS), rng.choice(SOURCES), kind, str(uuid.uuid4()), user,
                           serialize(body_of(kind, user, rng)), "delivered", None, 1, stamp, stamp, stamp))
            attempts.append((i + 1, stamp, rng.choice(URLS), 200, None, 31.5, "delivered"))
        db.executemany("INSERT INTO outbox (id, destination, source, message_type, message_id, user_id, body, state, "
                       "reason, attempts, created_at, first_attempt_at, next_attempt_at) VALUES "
                       "(?,?,?,?,?,?,?,?,?,?,?,?,?)", outbox)
        db.executemany("INSERT INTO delivery_attempts (outbox_id, attempted_at, url, status_code, error, latency_ms, "
                       "outcome) VALUES (?,?,?,?,?,?,?)", attempts)
    db.commit()
    used = sum(row[0] for row in db.execute("SELECT sum(pgsize - unused) FROM dbstat"))
    db.close()
    return used / kept


def log_bytes(url: str) -> tuple[float, int]:
    """Bytes used by the log's partitions, with their indexes (``dbstat``), per kept message; and the count."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.partitions import kept_partitions

    engine = get_engine(url)
    with engine.connect() as connection:
        partitions = kept_partitions(connection)
        names = [p.name for p in partitions]
        count = sum(connection.exec_driver_sql(f'SELECT count(*) FROM "{name}"').scalar_one() for name in names)
        used = 0
        for name in names:
            used += connection.exec_driver_sql(
                "SELECT coalesce(sum(pgsize - unused), 0) FROM dbstat WHERE name = ? OR name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = ? AND type = 'index')", (name, name)).scalar_one()
    return used / max(count, 1), count


def sample_kept(connection: Any, count: int) -> list[Any]:
    """About ``count`` kept messages (``KeptMessage``) to look up, from the oldest six partitions."""
    from prefect_webhooks.store.log.message_log import decode_rows
    from prefect_webhooks.store.log.partitions import kept_partitions

    sample = []
    for partition in kept_partitions(connection)[:6]:
        rows = connection.execute(partition.table.select().limit(count // 6 + 1)).all()
        sample += decode_rows(connection, rows, partition)
    return sample[:count]


def lookup_times(url: str, probes: int = 200) -> dict[str, list[float]]:
    """Milliseconds per lookup by messageId, by user (newest 50), and by destination over an hour (newest 50)."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.message_log import find_kept
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    rng = random.Random(11)
    times: dict[str, list[float]] = {"messageId": [], "user": [], "destination, 1 h": []}
    with engine.connect() as connection:
        ids = [(message.content.message_id, message.content.user_id) for message in sample_kept(connection, probes)]
        for message_id, user_id in ids[:probes]:
            began = time.perf_counter()
            found = find_kept(connection, message_id=message_id)
            times["messageId"].append((time.perf_counter() - began) * 1000)
            assert found and found[0].content.message_id == message_id
            began = time.perf_counter()
            find_kept(connection, user_id=user_id, limit=50)
            times["user"].append((time.perf_counter() - began) * 1000)
        now = store_now()
        for _ in range(probes):
            hour = now - timedelta(hours=rng.uniform(1, 23))
            began = time.perf_counter()
            find_kept(connection, destination=rng.choice(DESTINATIONS), since=hour, until=hour + timedelta(hours=1),
                      limit=50)
            times["destination, 1 h"].append((time.perf_counter() - began) * 1000)
    return times


def add_day_of_minute_counts(engine: Any) -> None:
    """24 hours of per-minute counters for each destination (1,440 minutes, three outcomes, three kinds of reason),
    what the console's charts read."""
    from prefect_webhooks.store.figures.minute_counts import add_minute_outcomes, add_minute_reasons
    from prefect_webhooks.store.schema.tables import store_now

    now = store_now()
    with engine.begin() as connection:
        for minute in range(1440):
            at = now - timedelta(minutes=minute)
            add_minute_outcomes(connection, {(d, o): 50 + minute % 7 for d in DESTINATIONS
                                             for o in ("delivered", "failed", "filtered")}, at, 0)
            add_minute_reasons(connection, [(d, "failed", reason, minute) for d in DESTINATIONS for reason in (
                "expired: HTTP 500", "permanent: HTTP 410", "expired: connection error: timeout")], at, 0)


def console_times(url: str, probes: int = 20) -> dict[str, list[float]]:
    """Milliseconds per console page, what each reads from the store and its HTML (the destination block, read from
    the Prefect API, left out): after 24 hours of per-minute counters for each destination (1,440 minutes, three
    outcomes, three kinds of reason) are added to the store."""
    from prefect_webhooks.console import pages
    from prefect_webhooks.console.charts import outcome_chart
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.figures.metrics import backlog_snapshot
    from prefect_webhooks.store.figures.minute_counts import minute_series, top_reasons
    from prefect_webhooks.store.log.lookups import MessageQuery, find_messages, message_document
    from prefect_webhooks.store.log.message_search import Refinement, search_messages
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    add_day_of_minute_counts(engine)
    rng = random.Random(5)
    times: dict[str, list[float]] = {"overview": [], "destination (chart, reasons)": [], "messages, newest 50": [],
                                     "messages by reason, newest 50 failed": [],
                                     "messages by reason, no match (1,000 read)": [], "one message": []}

    def timed(name: str, page: object) -> None:
        began = time.perf_counter()
        page()  # type: ignore[operator]
        times[name].append((time.perf_counter() - began) * 1000)

    with engine.connect() as connection:
        def overview() -> str:
            return pages.overview_page(backlog_snapshot(engine)["destinations"], "x")

        def destination() -> str:
            name = rng.choice(DESTINATIONS)
            series, reasons = minute_series(connection, name, store_now()), top_reasons(connection, name, store_now())
            return pages.destination_page(name, {}, [], outcome_chart(series), series.totals(), reasons, "x")

        def listing(query: MessageQuery, refinement: Refinement | None = None) -> str:
            page = search_messages(connection, query, refinement, limit=50)
            return pages.messages_page({}, [message_document(m) for m in page.messages], None, None, "x")

        newest = search_messages(connection, MessageQuery(), limit=probes).messages
        for probe in range(probes):
            timed("overview", overview)
            timed("destination (chart, reasons)", destination)
            timed("messages, newest 50", lambda: listing(MessageQuery(destination=rng.choice(DESTINATIONS))))
            timed("messages by reason, newest 50 failed", lambda: listing(
                MessageQuery(destination=rng.choice(DESTINATIONS), states=["failed"]), Refinement("expired")))
            timed("messages by reason, no match (1,000 read)", lambda: listing(
                MessageQuery(destination=rng.choice(DESTINATIONS)), Refinement("permanent: HTTP 418")))
            number = newest[probe % len(newest)].id
            timed("one message", lambda number=number: pages.message_page(message_document(find_messages(
                connection, MessageQuery(ids=[number]), limit=1)[0]), [], None, "x"))
    return times


def hot_path_rate(url: str, messages: int, batch: int = 500) -> float:
    """Messages/s through the queue's whole path, enqueue ▶ claim ▶ record delivered (move to the log)."""
    from prefect_webhooks.messages.outcomes import Attempt, Delivered, OutcomeRecords
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue, record_outcomes
    from prefect_webhooks.store.schema.tables import store_now

    engine = get_engine(url)
    rng = random.Random(3)
    began = time.perf_counter()
    for _ in range(0, messages, batch):
        enqueue("crm-hooks", [body_of("track", f"user-{rng.randrange(500_000)}", rng) for _ in range(batch)],
                source="web-app", engine=engine)
        claimed = claim_due_deliveries(engine, batch, "bench", in_order=False)
        now = store_now()
        record_outcomes(engine, OutcomeRecords(
            delivered=[Delivered(row.id, 1, now, now, row.destination) for row in claimed],
            attempts=[Attempt(row.id, now, URLS[0], 200, None, 20.0, "delivered") for row in claimed]))
    return messages / (time.perf_counter() - began)


def quantile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=1_000_000,
                        help="messages of history to build; 0 measures the --store given as it is")
    parser.add_argument("--store", default="", help="the aged store's URL (default: a scratch SQLite file)")
    parser.add_argument("--build-only", action="store_true", help="build the history and stop")
    parser.add_argument("--span", type=float, default=86400,
                        help="seconds the delivered history spreads over (the retention it stands for; failed "
                             "messages over seven times as long); the dedupe window is PREFECT_WEBHOOKS_DEDUPE_WINDOW_"
                             "SECONDS, else the delivered retention")
    parser.add_argument("--no-size", action="store_true",
                        help="skip the size per message (it reads every page: 14+ minutes for a store of 14 GB)")
    parser.add_argument("--hot-messages", type=int, default=20_000, help="messages through the hot path per store")
    parser.add_argument("--probes", type=int, default=200, help="lookups of each kind")
    parser.add_argument("--rounds", type=int, default=3, help="hot-path runs per store (0: no hot-path runs)")
    parser.add_argument("--hot-path-only", metavar="STORE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hot_path_only:
        print(hot_path_rate(args.hot_path_only, args.hot_messages))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="bench-log-"))
    try:
        return measure(args, scratch)
    finally:
        import shutil

        # A store built by --build-only stays where --store put it; the scratch folder goes.
        if not (args.build_only and args.store):
            shutil.rmtree(scratch, ignore_errors=True)


def measure(args: argparse.Namespace, scratch: Path) -> int:
    """Build the history, then print its size, lookups, console pages and hot path beside their references."""
    aged = args.store or f"sqlite:///{scratch / 'aged.db'}"
    os.environ.setdefault("PREFECT_WEBHOOKS_HOME", str(scratch))
    kept = args.kept
    if kept:
        seconds = build_history(aged, kept, span=args.span)
        print(f"built {kept:,} kept messages in {seconds:.1f} s ({kept / seconds:,.0f}/s) into {aged}")
    if args.build_only:
        return 0
    if aged.startswith("sqlite") and not args.no_size:
        per_message, kept = log_bytes(aged)  # with --kept 0, a store aged before is measured as it is
        reference = old_layout_bytes(min(kept, 200_000))
        print(f"log size: {per_message:.0f} B per kept message, indexes included ({kept:,} kept); "
              f"reference, the previous release's layout, same history shapes: {reference:.0f} B")
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.filters import seal_log_partitions
    from prefect_webhooks.store.log.partitions import kept_counts

    kept = kept or sum(kept_counts(get_engine(aged)).values())
    began = time.perf_counter()
    sealed = seal_log_partitions(get_engine(aged))  # what the pruning pass does once per partition whose period ended
    print(f"sealed {sealed} partitions (their filters, id ranges and counts) in {time.perf_counter() - began:.1f} s",
          flush=True)
    for name, values in lookup_times(aged, args.probes).items():
        print(f"lookup by {name}: p50 {statistics.median(values):.2f} ms, p99 {quantile(values, 0.99):.2f} ms, "
              f"first {values[0]:.1f} ms (a new process: it reads the filters) ({len(values)} probes, {kept:,} kept)")
    for name, values in console_times(aged, max(args.probes // 10, 2)).items():
        print(f"console page {name}: p50 {statistics.median(values):.1f} ms, max {max(values):.1f} ms "
              f"({len(values)} probes, {kept:,} kept; the target is 200 ms)")
    if aged.startswith("sqlite") and args.rounds:
        stores = {"new": f"sqlite:///{scratch / 'new.db'}", "tail": tail_only_copy(aged, scratch / "tail.db"),
                  "aged": aged}
        # Each run in a process of its own, the stores in turn: a process that built the history, or ran first, is
        # not the same process as one that did not.
        rates: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(args.rounds):
            for name, url in stores.items():
                answer = subprocess.run([sys.executable, __file__, "--hot-path-only", url, "--hot-messages",
                                         str(args.hot_messages)], capture_output=True, text=True, check=True)
                rates[name].append(float(answer.stdout.strip().splitlines()[-1]))
        median = {name: statistics.median(values) for name, values in rates.items()}
        print(f"hot path (enqueue, claim, record delivered), {args.hot_messages:,} messages, median of {args.rounds} "
              f"runs each: nothing kept, same newest partition {median['tail']:,.0f}/s; with {kept:,} kept "
              f"{median['aged']:,.0f}/s ({median['aged'] / median['tail']:.0%}); a brand-new store (empty newest "
              f"partition) {median['new']:,.0f}/s; runs {({k: [round(v) for v in vs] for k, vs in rates.items()})}")
    return 0


def tail_only_copy(aged: str, path: Path) -> str:
    """A copy of the aged store that keeps nothing but its newest partition (the one deliveries write to): the
    store with nothing kept that an aged one is compared with, its live partition the same."""
    import sqlite3

    # SQLite's backup copies a consistent snapshot, the WAL's pages included: copying the file after a checkpoint
    # left it malformed whenever the checkpoint could not finish (a connection of this process still reading).
    source = sqlite3.connect(aged.split("///", 1)[1])
    db = sqlite3.connect(path)
    source.backup(db)
    source.close()
    names = [row[0] for row in db.execute("SELECT name FROM message_log_partitions ORDER BY starts_at DESC")]
    for name in names[1:]:
        db.execute(f'DROP TABLE "{name}"')
        db.execute("DELETE FROM message_log_partitions WHERE name = ?", (name,))
    db.commit()
    db.execute("VACUUM")
    db.close()
    return f"sqlite:///{path}"


if __name__ == "__main__":
    sys.exit(main())
