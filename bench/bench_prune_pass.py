"""A pruning pass that catches up, and what a writer meets while it runs (SQLite).

Builds ``--messages`` of history that has expired (finished two days ago, spread over ``--span`` seconds) into a
scratch store, then runs one pruning pass while another connection commits a one-row transaction every 20 ms, as
ingestion and delivery do; prints the pass (time, time paused, transactions of 50 ms and more) and how long the
writer waited for the lock. Each store is built, then pruned in turn, in the same run:

- reference: the pass as before, its steps back to back (no pause) and each partition's table dropped whole;
- now: the pass paced (a pause as long as each step) and each partition emptied 25,000 rows per transaction first.

``--store URL`` runs one pass, as the code is now, on a store built before (it changes that store).

Run: ``python bench/bench_prune_pass.py`` (2M messages: about 6 minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))


def pass_with_writer(url: str, *, paced: bool) -> str:
    """One pruning pass on ``url`` while a writer commits every 20 ms; its figures as a line."""
    from sqlalchemy import event

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log import partitions as log_partitions
    from prefect_webhooks.store.upkeep.retention import RetentionPolicy, prune_store

    engine = get_engine(url)
    long_steps: list[float] = []
    began: dict[int, float] = {}

    @event.listens_for(engine, "begin")
    def started(connection) -> None:  # type: ignore[no-untyped-def]
        began[id(connection)] = time.monotonic()

    @event.listens_for(engine, "commit")
    def committed(connection) -> None:  # type: ignore[no-untyped-def]
        lasted = time.monotonic() - began.pop(id(connection), time.monotonic())
        if lasted >= 0.05:
            long_steps.append(lasted)

    waits: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        db = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=60, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS bench_writes (x INTEGER)")
        while not stop.is_set():
            at = time.monotonic()
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO bench_writes VALUES (1)")
            db.execute("COMMIT")
            waits.append(time.monotonic() - at)
            time.sleep(0.02)
        db.close()

    policy = RetentionPolicy.from_settings()
    if not paced:  # the pass as before: no pause, every table dropped whole
        policy = RetentionPolicy(policy.delivered_seconds, policy.failed_seconds, policy.seen_seconds, pause_ratio=0)
    rows_per_delete = log_partitions.DROP_ROWS
    log_partitions.DROP_ROWS = rows_per_delete if paced else 10**12
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(1)
        report = prune_store(engine, policy)
    finally:
        stop.set()
        thread.join()
        log_partitions.DROP_ROWS = rows_per_delete
    ordered = sorted(waits)
    return (f"pass {report.seconds:.1f} s ({report.paused:.1f} s paused), {report.messages_removed():,} messages "
            f"removed, {len(long_steps)} transactions of 50 ms or more (longest {max(long_steps, default=0) * 1000:.0f}"
            f" ms); the writer: {len(waits)} commits, p50 {statistics.median(ordered) * 1000:.1f} ms, p99 "
            f"{ordered[int(0.99 * len(ordered))] * 1000:.0f} ms, longest wait {ordered[-1] * 1000:.0f} ms, "
            f"{sum(w > 0.2 for w in waits)} over 200 ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000, help="expired messages to build per store")
    parser.add_argument("--span", type=float, default=3600.0, help="seconds the history is spread over")
    parser.add_argument("--store", default="", help="run one pass, as the code is now, on this store")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-prune-"))
    os.environ.setdefault("PREFECT_WEBHOOKS_HOME", str(scratch))
    print(f"bench_prune_pass: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load "
          f"average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    if args.store:
        print(f"  {args.store}: {pass_with_writer(args.store, paced=True)}")
        return 0
    from bench_message_log import build_history

    from prefect_webhooks.store.engine.engines import dispose_engines

    for label, paced in (("reference (before): back to back, tables dropped whole", False),
                         ("now: paced, tables emptied first", True)):
        url = f"sqlite:///{scratch / f'{int(paced)}.db'}"
        seconds = build_history(url, args.messages, older_than=2 * 86400, span=args.span)
        print(f"  {label}: built {args.messages:,} expired messages in {seconds:.0f} s; "
              f"{pass_with_writer(url, paced=paced)}", flush=True)
        dispose_engines()
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
