"""A rate-limited endpoint holding a 100,000-message backlog: store load, pace at the receiver, other endpoints.

    .venv/bin/python bench/bench_rate_limit.py [--postgres URL] [--messages 100000] [--rate 10] [--seconds 20]

On PostgreSQL (a throwaway server unless ``--postgres`` names one), two delivery processes (``deliver_due`` in
continuous mode, as the delivery workers of two ``serve`` processes run it) deliver a backlog of ``--messages`` to
an endpoint limited to ``--rate`` requests/s. Measured:

1. ours: the seconds to put the backlog off to its turns (each message written once), then over ``--seconds`` the
   database's transactions, rows read (``tup_returned + tup_fetched``) and rows written per second
   (``pg_stat_database`` deltas of the benchmark's own database), and the rate and the most requests in any one
   second at the receiver: right after, and once the store is vacuumed (steady state);
2. the reference, in the same run: the same two processes as a claimer that takes the due messages, sends what the
   budget allows and gives the rest back (what RudderStack's router did before rudder-server PR #5685: "router
   ends up querying 10K+ jobs/sec while it can only produce max 1K/sec");
3. other endpoints: 20,000 messages to an unlimited destination, alone and while the limited backlog waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_delivery import Sink, make_payloads  # noqa: E402
from bench_stores import Postgres  # noqa: E402

WORKER = """
import asyncio, json, os, sys, time
from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.store.engine.engines import get_engine
blocks = json.loads(os.environ["BENCH_BLOCKS"])
async def run():
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        for name, fields in blocks.items():
            context.destinations.remember(name, WebhookDestination(**fields))
        stats = await deliver_due(DeliveryOptions(run_for_seconds=float(sys.argv[1])), context=context)
        print(json.dumps(stats.summary()), flush=True)
asyncio.run(run())
"""

DISCARDER = """
import sys, time
from pathlib import Path
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, release_leases
engine, owner, rate, share, counter = get_engine(), sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
stop, budget, last, sent = time.monotonic() + float(sys.argv[1]), 0.0, time.monotonic(), 0
while time.monotonic() < stop:
    rows = claim_due_deliveries(engine, 2000, owner, in_order=False)
    now = time.monotonic()
    budget, last = min(budget + (now - last) * rate / share, rate), now
    allowed = int(budget)
    budget -= allowed
    sent += min(allowed, len(rows))
    # What the budget allows would be sent; the rest is given back and claimed again on the next loop.
    release_leases(engine, [row.id for row in rows[allowed:]], owner)
    counter.write_text(str(sent))  # what it would have sent so far (the benchmark reads it)
    time.sleep(0.3)
"""


class Recorder:
    """A receiver in this process that keeps each request's arrival time (ample for a few requests a second)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.port = 0
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/limited"

    def __enter__(self) -> Recorder:
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _serve(self) -> None:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            await request.read()
            self.arrivals.append(time.time())
            return web.Response(text="ok")

        async def main() -> None:
            app = web.Application()
            app.router.add_post("/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())


def database_counters(url: str) -> dict[str, float]:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            "SELECT xact_commit + xact_rollback, tup_returned + tup_fetched, tup_inserted + tup_updated + tup_deleted"
            " FROM pg_stat_database WHERE datname = %s",
            (name,),
        ).fetchone()
    assert row is not None
    return {"transactions": row[0], "rows read": row[1], "rows written": row[2], "at": time.monotonic()}


def vacuum(url: str) -> None:
    """``VACUUM ANALYZE outbox``: what autovacuum does within a minute on a database of its own (on a server holding
    hundreds of test databases its launcher may not come round for many minutes)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE outbox")


def per_second(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    seconds = after["at"] - before["at"]
    return {key: (after[key] - before[key]) / seconds for key in before if key != "at"}


def pending_due(url: str) -> int:
    from sqlalchemy import func, select

    from prefect_webhooks.messages.outcomes import PENDING
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import OUTBOX
    from prefect_webhooks.store.schema.tables import store_now

    with get_engine(url).connect() as connection:
        return connection.execute(
            select(func.count()).where(OUTBOX.c.state == PENDING, OUTBOX.c.next_attempt_at <= store_now())
        ).scalar_one()


def start(code: str, url: str, args: list[str], blocks: dict[str, Any] | None = None) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PREFECT_WEBHOOKS_DATABASE_URL": url,
        "BENCH_BLOCKS": json.dumps(blocks or {}),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)


@contextlib.contextmanager
def processes(started: list[subprocess.Popen[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """The processes, killed and reaped on the way out (an error included): nothing is left running."""
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait(30)


def steady_state(url: str, recorder: Recorder, seconds: float) -> dict[str, float]:
    before, arrived = database_counters(url), len(recorder.arrivals)
    time.sleep(seconds)
    figures = per_second(before, database_counters(url))
    window = recorder.arrivals[arrived:]
    figures["requests/s at the receiver"] = len(window) / seconds
    figures["most requests in one second"] = max(
        (sum(1 for other in window[index:] if other < first + 1.0) for index, first in enumerate(window)), default=0
    )
    return figures


def free_throughput(url: str, sink_url: str, count: int, blocks: dict[str, Any]) -> float:
    """Seconds two delivery processes take for ``count`` messages to an unlimited destination."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    enqueue("free", make_payloads(count), engine=get_engine(url))
    started = time.monotonic()
    from sqlalchemy import func, select

    from prefect_webhooks.messages.outcomes import DELIVERED
    from prefect_webhooks.store.queue.outbox import OUTBOX

    while time.monotonic() - started < 300:
        with get_engine(url).connect() as connection:
            done = connection.execute(
                select(func.count()).where(OUTBOX.c.destination == "free", OUTBOX.c.state == DELIVERED)
            ).scalar_one()
        if done >= count:
            return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"{count:,} messages to the unlimited destination were not delivered in 300 s")


def run_ours(pg: Postgres, args: argparse.Namespace, sink: Sink) -> None:
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    with Recorder() as recorder:
        blocks = {
            "limited": {"endpoints": [{"url": recorder.url, "rate_limit": args.rate}]},
            "free": {"endpoints": [{"url": sink.url}]},
        }
        url = pg.fresh_database()
        alone_url = pg.fresh_database()
        total = args.seconds * 3 + 120
        with processes([start(WORKER, alone_url, [str(total)], blocks) for _ in range(2)]):
            time.sleep(8)
            alone = free_throughput(alone_url, sink.url, 20_000, blocks)
        engine = get_engine(url)
        for offset in range(0, args.messages, 10_000):
            enqueue("limited", make_payloads(min(10_000, args.messages - offset)), engine=engine)
        with processes([start(WORKER, url, [str(total)], blocks) for _ in range(2)]):
            while not recorder.arrivals:  # the processes are up (imports take seconds)
                time.sleep(0.05)
            started = time.monotonic()
            while pending_due(url) > 100:
                time.sleep(0.5)
            parked_in = time.monotonic() - started
            time.sleep(3)
            before_vacuum = steady_state(url, recorder, args.seconds)
            vacuum(url)
            figures = steady_state(url, recorder, args.seconds)
            beside = free_throughput(url, sink.url, 20_000, blocks)
    print(
        f"ours: {args.messages:,} messages put off to their turns in {parked_in:.1f} s from the first request"
        " (two processes)"
    )
    report("ours, the first seconds after (before the store is vacuumed)", before_vacuum)
    report("ours, steady state (vacuumed)", figures)
    print(f"other endpoint, 20,000 messages: alone {alone:.1f} s, beside the limited backlog {beside:.1f} s")


def sent_by(counters: list[Path]) -> int:
    """What the reference claimers would have sent so far (each writes its count after every loop)."""
    return sum(int(counter.read_text() or 0) for counter in counters)


def run_reference(pg: Postgres, args: argparse.Namespace, folder: Path) -> None:
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    url = pg.fresh_database()
    engine = get_engine(url)
    for offset in range(0, args.messages, 10_000):
        enqueue("limited", make_payloads(min(10_000, args.messages - offset)), engine=engine)
    counters = [folder / f"claimer-{n}" for n in range(2)]
    claimers = [
        start(DISCARDER, url, [str(args.seconds + 120), f"claimer-{n}", str(args.rate), "2", str(counters[n])])
        for n in range(2)
    ]
    with processes(claimers):
        while not all(counter.exists() for counter in counters):  # both are claiming
            time.sleep(0.2)
        time.sleep(2)
        vacuum(url)
        before, sent = database_counters(url), sent_by(counters)
        time.sleep(args.seconds)
        figures = per_second(before, database_counters(url))
        figures["requests/s it would send"] = (sent_by(counters) - sent) / args.seconds
    report("reference: claim, send what the budget allows, give the rest back", figures)


def report(what: str, figures: dict[str, float]) -> None:
    print(f"{what}: " + ", ".join(f"{key} {value:,.1f}" for key, value in figures.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="PostgreSQL server URL (default: a throwaway server)")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=18941)
    args = parser.parse_args()
    os.environ["PREFECT_WEBHOOKS_RAMP_UP_SECONDS"] = "0"
    with Postgres(args.postgres) as pg, Sink(args.port) as sink:
        print(
            f"PostgreSQL; {args.messages:,} messages to an endpoint limited to {args.rate:g}/s; two processes; "
            f"{os.cpu_count()} cores"
        )
        run_ours(pg, args, sink)
        with tempfile.TemporaryDirectory() as folder:
            run_reference(pg, args, Path(folder))


if __name__ == "__main__":
    main()
