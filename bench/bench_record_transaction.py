"""How long recording a batch's outcomes holds the store's write lock: log rows packed ahead against packed inside.

    .venv/bin/python bench/bench_record_transaction.py                      # a fresh SQLite store
    .venv/bin/python bench/bench_record_transaction.py --store sqlite:////tmp/aged50/history.db

Each round queues ``--batch`` messages of the seed's shapes, claims them, and moves them to the message log as a
delivery worker's ``record_outcomes`` does, alternately with the log rows packed before the transaction
(``store.log.rows.pack_ahead``, what the delivery worker does) and packed inside it (the reference: what it did before,
and what every other caller of ``move_to_log`` does). On SQLite the transaction's time is the time every other
writer waits: the ingest API's group commit among them. Printed: the median of ``--rounds`` rounds each (the first
of each left out), the packing done ahead, and the whole per message. With ``--store`` the batches go into that
store (an aged one: its files grow by the batches' messages, kept as delivered now).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_accounting import cpu_reference  # noqa: E402


def message(number: int, run: str) -> dict:
    return {"version": 1, "type": "track", "userId": f"user-{number % 5000}", "anonymousId": f"anon-{number}",
            "messageId": f"{run}-{number}", "timestamp": "2026-11-29T01:00:00.000Z", "event": "Order Completed",
            "properties": {"revenue": 19.99, "currency": "EUR", "order_id": f"o-{number}", "sku": "SKU-1",
                           "quantity": 2},
            "context": {"ip": "10.0.0.1", "library": {"name": "analytics-python", "version": "2.3.2"}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="A store URL (default: a fresh SQLite file in a temporary folder).")
    parser.add_argument("--batch", type=int, default=1500, help="Messages a batch (the delivery worker's claim).")
    parser.add_argument("--rounds", type=int, default=12, help="Rounds of each way.")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-record-")
    url = args.store or f"sqlite:///{folder}/store.db"
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = url
    os.environ["PREFECT_WEBHOOKS_HOME"] = folder

    from prefect_webhooks.messages.outcomes import DELIVERED, Attempt
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.message_log import move_to_log
    from prefect_webhooks.store.log.rows import Leaving, pack_ahead
    from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
    from prefect_webhooks.store.schema.tables import store_now

    print(f"{cpu_reference()}; store {'given' if args.store else 'fresh'}, batches of {args.batch:,}")
    engine = get_engine(url)
    run = uuid.uuid4().hex[:8]
    timings: dict[str, list[tuple[float, float]]] = {"ahead": [], "inside": []}
    for round_number in range(args.rounds + 1):
        for way in timings:
            start = (round_number * 2 + (way == "inside")) * args.batch
            enqueue("bench-record", [message(start + i, run) for i in range(args.batch)], source="web")
            claimed = claim_due_deliveries(engine, args.batch, "bench", destination="bench-record")
            now = store_now()
            leaving = [Leaving(row.id, DELIVERED, None, 1, now, now) for row in claimed]
            attempts = [Attempt(row.id, now, "https://hooks.example.com/in", 200, None, 9.5, DELIVERED)
                        for row in claimed]
            began = time.perf_counter()
            packed = pack_ahead(engine, leaving, attempts) if way == "ahead" else {}
            opened = time.perf_counter()
            with engine.begin() as connection:
                move_to_log(connection, leaving, attempts, packed=packed)
            ended = time.perf_counter()
            if round_number:
                timings[way].append((opened - began, ended - opened))
    for way, label in (("ahead", "packed ahead (this release)"), ("inside", "packed inside (reference)")):
        before = statistics.median(ahead for ahead, _ in timings[way]) * 1000
        held = statistics.median(inside for _, inside in timings[way]) * 1000
        print(f"{label:<28} transaction {held:6.1f} ms, before it {before:5.1f} ms; "
              f"{(before + held) * 1000 / args.batch:5.1f} µs a message in all")
    ahead = statistics.median(inside for _, inside in timings["ahead"])
    inside = statistics.median(inside for _, inside in timings["inside"])
    print(f"write lock held: {ahead / inside:.2f}x the reference's")
    engine.dispose()


if __name__ == "__main__":
    main()
