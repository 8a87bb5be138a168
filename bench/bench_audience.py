"""Audience sync at scale: a 1,000,000-member audience, first full sync and incremental syncs with 1 % churn.

Each phase runs in its own process, so the peak RSS (``resource.getrusage``, ru_maxrss) is that phase's alone; the
time is the ``sync_audience`` call: snapshot query ▶ validation ▶ diff ▶ outbox rows + state ▶ commit. The snapshot
source is a real SQLite "warehouse" file queried through its SQLAlchemy URL; the store is a SQLite file (WAL).

The reference printed beside our figures: the issue's target (incremental ≤ 10 s and ≤ 1.5 GB peak RSS) and a
naive diff (``pandas.read_sql`` of snapshot and state + ``merge(indicator=True)``, no writes) on the same data.

Usage::

    .venv/bin/python bench/bench_audience.py              # 1,000,000 members, 1 % churn, 2 incremental syncs
    .venv/bin/python bench/bench_audience.py --members 100000 --destinations 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 10.0
TARGET_RSS_MB = 1536.0
AUDIENCE = "Bench Big Spenders"


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_warehouse(path: Path, members: int) -> None:
    """A SQLite table ``members(user_id)`` with ``members`` rows."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE members (user_id TEXT PRIMARY KEY)")
        connection.executemany("INSERT INTO members VALUES (?)", ((f"user-{i:08d}",) for i in range(members)))


def churn(path: Path, fraction: float, round_number: int) -> tuple[int, int]:
    """Remove ``fraction/2`` of the members at random and add as many new ones; returns (removed, added)."""
    with sqlite3.connect(path) as connection:
        total = connection.execute("SELECT count(*) FROM members").fetchone()[0]
        count = int(total * fraction / 2)
        ids = [row[0] for row in connection.execute("SELECT user_id FROM members")]
        gone = random.Random(round_number).sample(ids, count)
        connection.executemany("DELETE FROM members WHERE user_id = ?", ((user,) for user in gone))
        connection.executemany(
            "INSERT INTO members VALUES (?)", ((f"new-{round_number}-{i:08d}",) for i in range(count))
        )
    return count, count


def run_phase(phase: str, workdir: Path, destinations: int) -> dict[str, object]:
    """Run one phase in a fresh interpreter and return what it measured."""
    completed = subprocess.run(
        [sys.executable, __file__, "--phase", phase, "--workdir", str(workdir), "--destinations", str(destinations)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def phase_sync(workdir: Path, destinations: int) -> dict[str, object]:
    """Child: one ``sync_audience`` call, timed, with its peak RSS."""
    from prefect_webhooks.audiences.snapshots import SqlSnapshot
    from prefect_webhooks.audiences.sync import AudienceDefinition, sync_audience
    from prefect_webhooks.store.engine.engines import get_engine

    engine = get_engine(f"sqlite:///{workdir / 'store.db'}")
    definition = AudienceDefinition(
        name=AUDIENCE,
        sources=["web"],
        snapshot=SqlSnapshot(url=f"sqlite:///{workdir / 'warehouse.db'}", query="SELECT user_id FROM members"),
    )
    names = [f"hooks-{n}" for n in range(destinations)]
    rss_before = peak_rss_mb()
    started = time.perf_counter()
    result = sync_audience(definition, {"web": names}, engine=engine)
    seconds = time.perf_counter() - started
    with engine.connect() as connection:
        outbox_rows = connection.exec_driver_sql("SELECT count(*) FROM outbox").scalar()
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "rss_after_imports_mb": round(rss_before, 1),
        "members": result.members,
        "added": sum(row.added for row in result.destinations),
        "removed": sum(row.removed for row in result.destinations),
        "unchanged": sum(row.unchanged for row in result.destinations),
        "queued": sum(row.queued for row in result.destinations),
        "outbox_rows": outbox_rows,
    }


def phase_naive(workdir: Path, destinations: int) -> dict[str, object]:
    """Child: the reference diff: pandas.read_sql for snapshot and state, then merge(indicator=True); no writes."""
    import pandas as pd
    from sqlalchemy import create_engine

    store = create_engine(f"sqlite:///{workdir / 'store.db'}")
    warehouse = create_engine(f"sqlite:///{workdir / 'warehouse.db'}")
    started = time.perf_counter()
    snapshot = pd.read_sql("SELECT user_id FROM members", warehouse)
    state = pd.read_sql(
        "SELECT user_id FROM audience_state WHERE audience_key = 'bench_big_spenders' AND destination = 'hooks-0'",
        store,
    )
    merged = snapshot.merge(state, on="user_id", how="outer", indicator=True)
    counts = merged["_merge"].value_counts()
    seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "added": int(counts.get("left_only", 0)),
        "removed": int(counts.get("right_only", 0)),
    }


def report(label: str, figures: dict[str, object]) -> None:
    print(f"{label:<28} {json.dumps(figures)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--churn", type=float, default=0.01, help="Fraction of members changed per sync.")
    parser.add_argument("--incremental", type=int, default=2, help="Incremental syncs after the first.")
    parser.add_argument("--destinations", type=int, default=1)
    parser.add_argument("--phase", choices=["sync", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.phase:
        measure = phase_sync if args.phase == "sync" else phase_naive
        print(json.dumps(measure(args.workdir, args.destinations)))
        return

    print(f"audience sync benchmark: {args.members:,} members, {args.churn:.1%} churn, "
          f"{args.destinations} destination(s), {os.cpu_count()} CPUs")
    print(f"reference target: incremental <= {TARGET_SECONDS} s and <= {TARGET_RSS_MB:.0f} MB peak RSS")
    print("load average at start (other work on this machine slows every figure): "
          + ", ".join(f"{load:.1f}" for load in os.getloadavg()))
    with tempfile.TemporaryDirectory(prefix="bench-audience-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        make_warehouse(workdir / "warehouse.db", args.members)
        print(f"warehouse built in {time.perf_counter() - started:.1f} s")
        report("first full sync", run_phase("sync", workdir, args.destinations))
        worst = (0.0, 0.0)
        for round_number in range(1, args.incremental + 1):
            removed, added = churn(workdir / "warehouse.db", args.churn, round_number)
            report(f"reference naive diff #{round_number}", run_phase("naive", workdir, args.destinations))
            figures = run_phase("sync", workdir, args.destinations)
            report(f"incremental sync #{round_number}", figures)
            assert figures["added"] == added * args.destinations and figures["removed"] == removed * args.destinations
            worst = (max(worst[0], float(figures["seconds"])), max(worst[1], float(figures["peak_rss_mb"])))
        print("load average at end: " + ", ".join(f"{load:.1f}" for load in os.getloadavg()))
        verdict = "meets" if worst[0] <= TARGET_SECONDS and worst[1] <= TARGET_RSS_MB else "MISSES"
        print(f"incremental worst: {worst[0]:.2f} s, {worst[1]:.0f} MB peak RSS -> {verdict} the target "
              f"({TARGET_SECONDS} s, {TARGET_RSS_MB:.0f} MB)")


if __name__ == "__main__":
    main()
