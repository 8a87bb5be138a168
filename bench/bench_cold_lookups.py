"""Lookups by user with the store's file out of memory, against the same lookups with it in memory, in turn, on an
aged SQLite store.

    python bench/bench_cold_lookups.py --store sqlite:////tmp/aged7d/history.db --probes 100 --rounds 2

Each run is a new process that looks up ``--probes`` users (their newest 50, as the console's user view asks).
A cold run starts right after the store's file was dropped from the operating system's page cache
(``posix_fadvise``, no root needed): a machine where the store is larger than the memory left for it, or a serve
started after other work pushed it out. The warm run after it looks the same users up again, their pages now
cached: the reference. The users come from the store's oldest partitions; with a week kept, a user's newest 50
spread over most of it. The first lookup of a run also reads the user filters of every sealed partition and is
shown apart. Partitions not sealed yet are sealed first, as serve's pruning pass does. The figure also depends on
the disk under the file: the run prints what a random 4 KiB read of the evicted file costs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def random_read_ms(url: str, reads: int = 300) -> float:
    """Milliseconds per random 4 KiB read of the store's file, evicted before and after (what the disk costs)."""
    evict(url)
    path = store_files(url)[0]
    descriptor = os.open(path, os.O_RDONLY)
    try:
        pages = os.fstat(descriptor).st_size // 4096
        chance = random.Random(5)
        began = time.perf_counter()
        for _ in range(reads):
            os.pread(descriptor, 4096, chance.randrange(pages) * 4096)
        return (time.perf_counter() - began) * 1000 / reads
    finally:
        os.close(descriptor)
        evict(url)


def lookups(url: str, users: list[str]) -> list[float]:
    """Milliseconds per lookup of each user's newest 50, in this process."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.message_log import find_kept

    times = []
    with get_engine(url).connect() as connection:
        for user in users:
            began = time.perf_counter()
            found = find_kept(connection, user_id=user, limit=50)
            times.append((time.perf_counter() - began) * 1000)
            assert found and all(message.content.user_id == user for message in found)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="an aged SQLite store's URL (bench_message_log --build-only)")
    parser.add_argument("--probes", type=int, default=100, help="users looked up per run")
    parser.add_argument("--rounds", type=int, default=2, help="cold and warm runs, in turn")
    parser.add_argument("--run", metavar="USERS_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(lookups(args.store, json.loads(Path(args.run).read_text()))))
        return 0
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.filters import seal_log_partitions

    began = time.perf_counter()
    sealed = seal_log_partitions(get_engine(args.store))  # what serve's pruning pass does; lookups use the filters
    print(f"sealed {sealed} partitions in {time.perf_counter() - began:.1f} s", flush=True)
    with get_engine(args.store).connect() as connection:
        users = sorted({message.content.user_id for message in sample_kept(connection, args.probes * 2)})
    users = users[:args.probes]
    users_file = Path(f"/tmp/bench-cold-lookups-{os.getpid()}.json")
    users_file.write_text(json.dumps(users))
    size = sum(path.stat().st_size for path in store_files(args.store)) / 1e9
    print(f"store: {args.store}, {size:.1f} GB; {len(users)} users, their newest 50 each; a random 4 KiB read of "
          f"the evicted file: {random_read_ms(args.store):.3f} ms", flush=True)
    try:
        for round_number in range(1, args.rounds + 1):
            for cold in (True, False):
                if cold:
                    evict(args.store)
                answer = subprocess.run([sys.executable, __file__, "--store", args.store, "--run", str(users_file)],
                                        capture_output=True, text=True, check=True)
                times = json.loads(answer.stdout.strip().splitlines()[-1])
                first, rest = times[0], times[1:]
                label = "cold, the file evicted" if cold else "reference, warm: the same users again"
                print(f"round {round_number}, {label}: p50 {statistics.median(rest):.1f} ms, p99 "
                      f"{quantile(rest, 0.99):.1f} ms, max {max(rest):.1f} ms; first lookup (reads the filters) "
                      f"{first:.0f} ms (target: 50 ms at p99)", flush=True)
    finally:
        users_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
