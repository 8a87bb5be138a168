"""SQLite's one writer shared by several processes: its busy handler's polls (the reference) against the store's
write gate (``prefect_webhooks/store/engine/write_gate.py``), in the same run.

Each process loops: a write transaction (one insert, ``--hold-ms`` of Python work while it holds the lock, as the
delivery worker packs records inside its record transaction, then 50 rows more and the commit) and a random pause
of up to ``--gap-ms``. Printed per case: transactions a second in all and per process, and the wait for the lock
(p50 / p99 / max), from the start of the transaction to its first write being done.

    .venv/bin/python bench/bench_write_gate.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from prefect_webhooks.store.engine.write_gate import GatedConnection

CASES = ((2, 3.0, 10.0), (3, 3.0, 10.0), (3, 5.0, 5.0), (4, 3.0, 10.0))


def writer(path: str, gate: bool, hold_ms: float, gap_ms: float, seconds: float, seed: int,
           results: multiprocessing.Queue) -> None:
    connection = sqlite3.connect(path, timeout=30, factory=GatedConnection if gate else sqlite3.Connection)
    connection.execute("PRAGMA synchronous=NORMAL")
    cursor = connection.cursor()
    pause = random.Random(seed)
    waits: list[float] = []
    done = 0
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        started = time.perf_counter()
        cursor.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 200,))
        waits.append(time.perf_counter() - started)
        busy_until = time.perf_counter() + hold_ms / 1000
        while time.perf_counter() < busy_until:
            pass
        cursor.executemany("INSERT INTO t (v) VALUES (?)", [(b"y" * 200,)] * 50)
        connection.commit()
        done += 1
        time.sleep(pause.uniform(0, gap_ms) / 1000)
    connection.close()
    results.put((seed, done, waits))


def run_case(folder: Path, gate: bool, processes: int, hold_ms: float, gap_ms: float, seconds: float) -> str:
    path = folder / f"{'gate' if gate else 'busy'}-{processes}-{hold_ms}-{gap_ms}.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    workers = [context.Process(target=writer, args=(str(path), gate, hold_ms, gap_ms, seconds, seed, results))
               for seed in range(processes)]
    for worker in workers:
        worker.start()
    found = sorted(results.get(timeout=seconds + 120) for _ in workers)
    for worker in workers:
        worker.join(30)
    waits = sorted(wait for _, _, each in found for wait in each)
    total = sum(done for _, done, _ in found)

    def at(fraction: float) -> float:
        return 1000 * waits[min(len(waits) - 1, int(len(waits) * fraction))]

    return (f"{total / seconds:6.0f} transactions/s (per process {', '.join(str(done) for _, done, _ in found)}), "
            f"wait p50 {at(0.5):5.1f} ms, p99 {at(0.99):6.1f} ms, max {1000 * waits[-1]:6.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each case.")
    parser.add_argument("--cases", type=int, default=len(CASES), help="Run the first this many cases.")
    args = parser.parse_args()
    print(f"bench_write_gate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.seconds:g} s a case")
    with tempfile.TemporaryDirectory() as scratch:
        for processes, hold_ms, gap_ms in CASES[:args.cases]:
            print(f"{processes} writer processes, {hold_ms:g} ms held, pauses up to {gap_ms:g} ms:")
            case = (processes, hold_ms, gap_ms, args.seconds)
            print(f"  busy handler (reference): {run_case(Path(scratch), False, *case)}")
            print(f"  write gate:               {run_case(Path(scratch), True, *case)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
