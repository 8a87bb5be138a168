"""Lookups and console pages as a running ``serve`` answers them over HTTP, with history kept, while a stream flows.

Usage:
    python bench/bench_live_lookups.py --kept 1000000                    # history built into a scratch store first
    python bench/bench_live_lookups.py --kept 0 --store sqlite:////tmp/aged.db   # a store built before, as it is

What a person meets when a customer asks about a message: ``prefect-webhooks serve`` on a store keeping N messages
(``status`` counts them), with the admin token set, and one client asking its admin API (``/v1/admin/messages``) and
its console, one request after the other, ``--probes`` of each kind: a message by messageId, a user's newest 50, a
destination's newest 50 over an hour, failed messages by reason, a reason no message has (the search reads its bound
of 1,000), one message with its attempts; the console's overview, a destination's page (its 24-hour chart from
per-minute counters, which the run adds for the history's destinations, and top reasons), its messages list and a
message's page (its attempts and the request as it is sent now, from the destination's block). Each
figure is the whole HTTP request: first, p50, p99 and max, beside the targets the issues name (50 ms for a lookup by
messageId, by user or by destination and time; 200 ms for every other list, detail and page). The probes run twice
in the same run: on the idle ``serve`` just started (its first answers are a new process's, the store's pages not
yet read) and again while an open-loop stream of ``--rate`` events/s flows through the same ``serve`` to a real
receiver (the stream's delivery p99 and losses are printed with them). Retention is set to 30 days for the run so
that no pruning pass drops history meanwhile (a pass under load is ``bench_prune_pass.py``'s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_message_log import (  # noqa: E402
    DESTINATIONS,
    add_day_of_minute_counts,
    build_history,
    quantile,
    sample_kept,
)
from bench_soak import Bench, kept_messages, ms  # noqa: E402
from started_processes import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))
TOKEN = "bench-admin-token-0001"
LOOKUP_TARGET_MS, PAGE_TARGET_MS = 50, 200


def prepare(url: str, kept: int) -> int:
    """Build ``kept`` messages of history (none: the store as it is), seal what a pruning pass would, add the
    per-minute counters the console's charts read; returns how many messages the store keeps."""
    from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
    from prefect_webhooks.store.log.filters import seal_log_partitions

    if kept:
        seconds = build_history(url, kept)
        print(f"built {kept:,} messages of history in {seconds:.0f} s", flush=True)
    engine = get_engine(url)
    seal_log_partitions(engine)
    add_day_of_minute_counts(engine)
    dispose_engines()
    return kept_messages(url)


def probe_requests(url: str, count: int) -> dict[str, list[str]]:
    """For each kind of probe, ``count`` request paths drawn from what the store keeps (each round takes every other
    one: the second round does not ask for what the first one read)."""
    import random
    from urllib.parse import urlencode

    from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
    from prefect_webhooks.store.schema.tables import store_now

    with get_engine(url).connect() as connection:
        sample = sample_kept(connection, count)
    dispose_engines()
    rng, now = random.Random(13), store_now()
    hours = [now - timedelta(hours=rng.uniform(1, 23)) for _ in range(count)]
    admin = "/v1/admin/messages"

    def query(**fields: Any) -> str:
        return f"{admin}?{urlencode(fields, doseq=True)}"

    return {
        "lookup by messageId": [query(messageId=m.content.message_id) for m in sample],
        "lookup by user, newest 50": [query(userId=m.content.user_id, limit=50) for m in sample],
        "lookup by destination and hour, newest 50": [
            query(destination=rng.choice(DESTINATIONS), since=hour.isoformat(),
                  until=(hour + timedelta(hours=1)).isoformat(), limit=50) for hour in hours],
        "failed by reason, newest 50": [query(destination=rng.choice(DESTINATIONS), state="failed",
                                              reasonPrefix="expired", limit=50) for _ in range(count)],
        "a reason no message has (1,000 read)": [query(destination=rng.choice(DESTINATIONS),
                                                       reasonPrefix="permanent: HTTP 418", limit=50)
                                                 for _ in range(count)],
        "one message with its attempts": [f"{admin}/{m.id}" for m in sample],
        "console: overview": ["/console"] * count,
        "console: a destination (24-hour chart, top reasons)": [
            f"/console/destinations/{rng.choice(DESTINATIONS)}" for _ in range(count)],
        "console: messages of a destination, newest 50": [
            f"/console/messages?destination={rng.choice(DESTINATIONS)}" for _ in range(count)],
        "console: one message (attempts, the request as sent now)": [f"/console/messages/{m.id}" for m in sample],
    }


def time_requests(base: str, requests: dict[str, list[str]]) -> dict[str, list[float]]:
    """Each request in turn over one signed-in client; milliseconds per kind. A lookup by messageId must find it."""
    import httpx

    from prefect_webhooks.console.access import SESSION_COOKIE

    times: dict[str, list[float]] = {kind: [] for kind in requests}
    with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        client.post("/console/sign-in", data={"token": TOKEN, "next": "/console"})
        assert SESSION_COOKIE in client.cookies, "the console did not sign in"
        for kind, paths in requests.items():
            for path in paths:
                began = time.perf_counter()
                answer = client.get(path)
                times[kind].append((time.perf_counter() - began) * 1000)
                answer.raise_for_status()
                if kind == "lookup by messageId":
                    assert answer.json()["data"], f"{path}: not found"
    return times


def report(label: str, times: dict[str, list[float]], round_name: str) -> list[str]:
    """Print one line per kind; returns the kinds whose p99 missed their target."""
    missed = []
    print(label, flush=True)
    for kind, values in times.items():
        target = LOOKUP_TARGET_MS if kind.startswith("lookup") else PAGE_TARGET_MS
        p99 = quantile(values, 0.99)
        if p99 > target:
            missed.append(f"{kind} ({round_name})")
        print(f"  {kind}: first {values[0]:.1f} ms, p50 {statistics.median(values):.1f} ms, p99 {p99:.1f} ms, "
              f"max {max(values):.1f} ms ({len(values)} requests; target {target} ms)", flush=True)
    return missed


def measure(bench: Bench, url: str, kept: int, probes: int, rate: int, lead: float) -> int:
    from prefect_webhooks.blocks.destination import WebhookDestination

    receiver = f"http://127.0.0.1:{bench.receiver_port}/hook"
    for name in DESTINATIONS:  # the history's destinations, so their console pages show their endpoints
        WebhookDestination(endpoints=[{"url": receiver}], shared_secret="bench-secret-0001").save(name, overwrite=True)
    both = probe_requests(url, 2 * probes)
    first, second = ({kind: paths[turn::2] for kind, paths in both.items()} for turn in (0, 1))
    settings = {"admin_token": TOKEN, "retention_delivered": "30d", "retention_failed": "30d"}
    missed: list[str] = []
    with bench.serve(url, **settings) as serve:
        bench.wait_ready(serve)
        missed += report(f"idle serve, just started ({kept:,} messages kept):",
                         time_requests(bench.ingest_url, first), "idle")
        seconds = lead + 5.0 + probes * len(second) * 0.2  # longer than the probes take at their p50s
        generator, step = bench.start_load(rate, seconds)
        time.sleep(lead)  # the stream is flowing and its newest pages in use
        began = time.monotonic()
        loaded = time_requests(bench.ingest_url, second)
        took = time.monotonic() - began
        figures = bench.finish_load(generator, step, seconds)
        stats = bench.arrived(figures)
        lost = figures["accepted"] - stats["distinct"]
        missed += report(f"while {rate:,} events/s flow ({kept:,} messages kept; the probes took {took:.0f} s of the "
                         f"stream's {seconds:.0f} s):", loaded, "under load")
        print(f"  the stream: {figures['accepted']:,} accepted, delivery p99 {ms(stats['p99'])} ms, ingest answer "
              f"p99 {ms(figures['ack_p99'])} ms, refused {figures['refused'] + figures['errors']}, lost {lost}",
              flush=True)
    print(f"p99 over its target: {', '.join(missed) if missed else 'none'}", flush=True)
    return 1 if lost or took > seconds - lead else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=1_000_000,
                        help="messages of history to build into the store (0: measure it as it is)")
    parser.add_argument("--store", default="", help="the store's URL (default: a scratch SQLite file, removed after)")
    parser.add_argument("--probes", type=int, default=100, help="requests of each kind, idle and under load")
    parser.add_argument("--rate", type=int, default=2000, help="the stream's events/s during the second round")
    parser.add_argument("--lead-seconds", type=float, default=10.0,
                        help="seconds the stream flows before the second round's probes start")
    args = parser.parse_args()
    with ExitStack() as stack:
        bench = Bench(stack, args)
        url = args.store or f"sqlite:///{bench.workdir / 'history.db'}"
        kept = prepare(url, args.kept)
        status = measure(bench, url, kept, args.probes, args.rate, args.lead_seconds)
    import shutil

    shutil.rmtree(bench.workdir, ignore_errors=True)  # the Prefect server's files, and the scratch store if any
    return status


if __name__ == "__main__":
    sys.exit(main())

