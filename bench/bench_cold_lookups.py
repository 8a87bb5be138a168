"""Lookups by user with the store's file out of memory: reading ahead (``store.log_read_ahead``) against the same
lookups without it, in turn, on an aged SQLite store.

    python bench/bench_cold_lookups.py --store sqlite:////tmp/aged7d/history.db --probes 100 --rounds 2

Each run is a new process that looks up ``--probes`` users (their newest 50, as the console's user view asks)
right after the store's file was dropped from the operating system's page cache (``posix_fadvise``, no root
needed): a machine where the store is larger than the memory left for it, or a serve started after other work
pushed it out. The users come from the store's oldest partitions, so each lookup reads most of the week. The
first lookup of a run also reads the user filters of every sealed partition and is shown apart. Partitions not
sealed yet are sealed first, as serve's pruning pass does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_message_log import quantile, sample_kept  # noqa: E402


def store_files(url: str) -> list[Path]:
    path = Path(url.split("///", 1)[1])
    return [candidate for candidate in (path, Path(f"{path}-wal")) if candidate.exists()]


def evict(url: str) -> None:
    """Drop the store's pages from the page cache (clean pages only: the store is checkpointed and idle)."""
    for path in store_files(url):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def lookups(url: str, users: list[str], read_ahead: bool) -> list[float]:
    """Milliseconds per lookup of each user's newest 50, in this process."""
    from prefect_webhooks.store import message_log
    from prefect_webhooks.store.engines import get_engine

    if not read_ahead:
        message_log.can_read_ahead = lambda _connection: False  # the code as it was before reading ahead
    times = []
    with get_engine(url).connect() as connection:
        for user in users:
            began = time.perf_counter()
            found = message_log.find_kept(connection, user_id=user, limit=50)
            times.append((time.perf_counter() - began) * 1000)
            assert found and all(message.content.user_id == user for message in found)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="an aged SQLite store's URL (bench_message_log --build-only)")
    parser.add_argument("--probes", type=int, default=100, help="users looked up per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, in turn")
    parser.add_argument("--run", nargs=2, metavar=("USERS_FILE", "READ_AHEAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        users = json.loads(Path(args.run[0]).read_text())
        print(json.dumps(lookups(args.store, users, args.run[1] == "on")))
        return 0
    from prefect_webhooks.store.engines import get_engine
    from prefect_webhooks.store.log_filters import seal_log_partitions

    began = time.perf_counter()
    sealed = seal_log_partitions(get_engine(args.store))  # what serve's pruning pass does; lookups use the filters
    print(f"sealed {sealed} partitions in {time.perf_counter() - began:.1f} s", flush=True)
    with get_engine(args.store).connect() as connection:
        users = sorted({message.content.user_id for message in sample_kept(connection, args.probes * 2)})
    users = users[:args.probes]
    users_file = Path(f"/tmp/bench-cold-lookups-{os.getpid()}.json")
    users_file.write_text(json.dumps(users))
    size = sum(path.stat().st_size for path in store_files(args.store)) / 1e9
    print(f"store: {args.store}, {size:.1f} GB; {len(users)} users, their newest 50 each, the file evicted before "
          "each run", flush=True)
    try:
        for round_number in range(1, args.rounds + 1):
            for mode in ("off", "on"):
                evict(args.store)
                answer = subprocess.run([sys.executable, __file__, "--store", args.store, "--run", str(users_file),
                                         mode], capture_output=True, text=True, check=True)
                times = json.loads(answer.stdout.strip().splitlines()[-1])
                first, rest = times[0], times[1:]
                label = "read ahead" if mode == "on" else "reference, one partition after another (before)"
                print(f"round {round_number}, {label}: p50 {statistics.median(rest):.1f} ms, p99 "
                      f"{quantile(rest, 0.99):.1f} ms, max {max(rest):.1f} ms; first lookup (reads the filters) "
                      f"{first:.0f} ms", flush=True)
    finally:
        users_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
