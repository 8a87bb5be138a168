"""Delivery throughput: N signed messages through the outbox to a local receiver, against a raw aiohttp loop.

    .venv/bin/python bench/bench_delivery.py [--messages 20000] [--concurrency 64] [--flow] [--variants]
        [--batched] [--ordered]

The receiver is nginx answering 200 (``../shared/bench/nginx-sink`` from the repository root), or a fast aiohttp
server in another process when nginx cannot be started. In the same run it measures:

1. the ceiling: a raw aiohttp POST loop (same bodies, same headers, same concurrency, one keep-alive session);
2. ours, end to end: ``deliver_due`` claims batches from a fresh SQLite outbox, signs and posts every message,
   and records each attempt and outcome (claim → send → record), all rows checked ``delivered`` afterwards;
3. with ``--flow``: the same through the Prefect ``deliver`` flow (one task run per batch) on a temporary
   Prefect server. Like the raw loop, it gets a warm-up first (a flow run of 2,000 messages: the process's first
   flow run also pays for Prefect's client start-up); that cold run's figure is printed too.
4. with ``--variants``: ``deliver_due`` again for a destination that also signs the Standard Webhooks way, and for
   one with three filter rules that every message passes (each rule evaluated, nothing dropped): what those cost.
5. with ``--batched``: ``deliver_due`` for a destination with ``batch_size=100`` (one signed JSON array of 100
   messages per request, each message's outcome and attempt still recorded), against 2. (one message per request)
   to the same receiver.
6. with ``--ordered``: the same messages spread over ``--users`` users (10,000) to an unordered destination and to
   an ``ordered`` one (each user's messages one at a time, in order), alternating, twice each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# shared/ lies beside the repository, or beside the folder of its worktrees (bench/nginx-sink starts nginx).
NGINX_SINK = next((folder / "shared" / "bench" / "nginx-sink" for folder in (ROOT.parent, ROOT.parent.parent)
                   if (folder / "shared" / "bench" / "nginx-sink").exists()), ROOT.parent / "shared")
AIOHTTP_SINK = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.Response(text="ok")
app = web.Application()
app.router.add_route("POST", "/{tail:.*}", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


class Sink:
    """The receiver: nginx when possible, else an aiohttp server in its own process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.kind = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Sink:
        if shutil.which("nginx") and NGINX_SINK.exists():
            done = subprocess.run([str(NGINX_SINK), "start", str(self.port)], capture_output=True, text=True)
            if done.returncode == 0:
                self.kind = "nginx"
                return self._wait()
        self._process = subprocess.Popen([sys.executable, "-c", AIOHTTP_SINK, str(self.port)])
        self.kind = "aiohttp server (separate process)"
        return self._wait()

    def _wait(self) -> Sink:
        import socket

        for _ in range(100):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"receiver on port {self.port} did not start")

    def __exit__(self, *exc: object) -> None:
        if self.kind == "nginx":
            subprocess.run([str(NGINX_SINK), "stop", str(self.port)], capture_output=True)
        elif self._process is not None:
            self._process.terminate()
            self._process.wait(10)


def make_payloads(count: int, users: int | None = None) -> list[dict]:
    return [
        {"version": 1, "type": "track", "userId": f"user-{n % (users or count)}",
         "timestamp": "2026-01-01T00:00:00.000Z",
         "event": "Order Completed", "properties": {"order": n, "revenue": 19.99, "currency": "EUR"}}
        for n in range(count)
    ]


async def raw_loop(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, float]:
    """The ceiling: POST every body once with ``concurrency`` workers on one keep-alive session.

    Returns messages/s and this process's CPU microseconds per message.
    """
    headers = {"User-Agent": "prefect-webhooks/1.0", "Content-Type": "application/json", "X-Api-Key": "k"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        pending = iter(bodies)

        async def worker() -> None:
            for body in pending:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    assert response.status == 200

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return _rates(len(bodies), started, cpu)


def _rates(count: int, started: float, cpu: float) -> tuple[float, float]:
    return count / (time.perf_counter() - started), (time.process_time() - cpu) * 1e6 / count


def fresh_store(folder: Path, name: str) -> str:
    from prefect_webhooks.settings import get_settings

    url = f"sqlite:///{folder / name}"
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = url
    get_settings.cache_clear()
    return url


def count_delivered(url: str) -> int:
    from prefect_webhooks.messages.outcomes import DELIVERED
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.figures.counters import outcome_totals

    # The counters, not the messages: delivered ones have left the queue for the log.
    with get_engine(url).connect() as connection:
        return sum(outcomes.get(DELIVERED, 0) for outcomes in outcome_totals(connection).values())


# Rules that every bench message passes, so each one is evaluated on every message.
PASSING_FILTERS = [
    {"name": "no-debug", "action": "drop", "events": ["Debug Ping"]},
    {"name": "no-internal", "action": "drop", "conditions": [{"field": "properties.internal", "equals": True}]},
    {"name": "orders", "action": "allow", "match": "any", "types": ["identify"],
     "conditions": [{"field": "properties.currency", "in": ["EUR", "USD"]}]},
]


async def ours(
    url: str, sink_url: str, payloads: list[dict], claim_size: int, parallel: int, **block_options: object
) -> tuple[float, float]:
    """End to end through the outbox with ``deliver_due`` (no Prefect); messages/s and CPU µs per message."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    enqueue("bench", payloads, engine=get_engine(url))
    options = {"shared_secret": "bench-s3cret-0001", **block_options}
    block = WebhookDestination(endpoints=[{"url": sink_url, "headers": {"X-Api-Key": "k"}}], **options)
    async with Sender() as sender:
        context = DeliveryContext(get_engine(url), sender)
        context.destinations.remember("bench", block)
        started, cpu = time.perf_counter(), time.process_time()
        stats = await deliver_due(DeliveryOptions(batch_size=claim_size, parallel_batches=parallel), context=context)
        rates = _rates(len(payloads), started, cpu)
    assert stats.delivered == len(payloads) == count_delivered(url), stats.summary()
    return rates


async def through_flow(
    url: str, sink_url: str, payloads: list[dict], batch_size: int, parallel: int
) -> tuple[float, float]:
    """End to end through the Prefect ``deliver`` flow (saved block, one task run per batch); as ``ours``."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.flows.deliver import deliver
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    await WebhookDestination(endpoints=[{"url": sink_url, "headers": {"X-Api-Key": "k"}}],
                             shared_secret="bench-s3cret-0001").save("bench", overwrite=True)
    enqueue("bench", payloads, engine=get_engine(url))
    started, cpu = time.perf_counter(), time.process_time()
    summary = await deliver(batch_size=batch_size, parallel_batches=parallel)
    rates = _rates(len(payloads), started, cpu)
    assert summary["delivered"] == len(payloads) == count_delivered(url), summary
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--parallel-batches", type=int, default=2)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--flow", action="store_true", help="also run the Prefect deliver flow (temporary server)")
    parser.add_argument("--batched", action="store_true",
                        help="also deliver_due to a destination sending batches of --batch-of messages per request")
    parser.add_argument("--batch-of", type=int, default=100)
    parser.add_argument("--variants", action="store_true",
                        help="also deliver_due with Standard Webhooks signing, and with filter rules")
    parser.add_argument("--ordered", action="store_true",
                        help="also deliver_due to an ordered destination against an unordered one, same messages")
    parser.add_argument("--users", type=int, default=10_000, help="distinct users of the --ordered messages")
    args = parser.parse_args()
    os.environ["PREFECT_WEBHOOKS_DELIVERY_CONCURRENCY"] = str(args.concurrency)

    from prefect_webhooks.messages.payloads import serialize

    payloads = make_payloads(args.messages)
    bodies = [serialize(payload) for payload in payloads]
    with tempfile.TemporaryDirectory() as folder, Sink(args.port) as sink:
        print(f"receiver: {sink.kind} on {sink.url}; {args.messages} messages, concurrency {args.concurrency}, "
              f"batch {args.batch_size} x {args.parallel_batches} in flight; {os.cpu_count()} cores")
        asyncio.run(raw_loop(sink.url, bodies[:2000], args.concurrency))  # warm-up
        ceiling, ceiling_cpu = asyncio.run(raw_loop(sink.url, bodies, args.concurrency))
        report("raw aiohttp POST loop (ceiling)", ceiling, ceiling_cpu, ceiling)
        rate, cpu = asyncio.run(ours(fresh_store(Path(folder), "plain.db"), sink.url, payloads, args.batch_size,
                                     args.parallel_batches))
        report("prefect-webhooks deliver_due (outbox)", rate, cpu, ceiling)
        if args.batched:
            one_per_request = rate
            rate, cpu = asyncio.run(ours(fresh_store(Path(folder), "batched.db"), sink.url, payloads, args.batch_size,
                                         args.parallel_batches, batch_size=args.batch_of))
            report(f"deliver_due, batches of {args.batch_of} per request", rate, cpu, ceiling)
            print(f"{'':42s} {rate / one_per_request:8.1f} x one message per request")
        if args.variants:
            from prefect_webhooks.signing.signatures import generate_secret

            variants = {"+ Standard Webhooks signatures": {"shared_secret": generate_secret(),
                                                           "standard_webhooks": True},
                        "+ 3 filter rules, all passed": {"filters": PASSING_FILTERS}}
            for number, (label, options) in enumerate(variants.items()):
                rate, cpu = asyncio.run(ours(fresh_store(Path(folder), f"variant{number}.db"), sink.url, payloads,
                                             args.batch_size, args.parallel_batches, **options))
                report(f"deliver_due {label}", rate, cpu, ceiling)
        if args.ordered:
            compare_ordered(Path(folder), sink.url, make_payloads(args.messages, args.users), args, ceiling)
        if args.flow:
            from prefect.testing.utilities import prefect_test_harness

            with prefect_test_harness(server_startup_timeout=120):
                cold_rate, cold_cpu = asyncio.run(through_flow(fresh_store(Path(folder), "warm-up.db"), sink.url,
                                                               payloads[:2000], args.batch_size,
                                                               args.parallel_batches))
                rate, cpu = asyncio.run(through_flow(fresh_store(Path(folder), "flow.db"), sink.url, payloads,
                                                     args.batch_size, args.parallel_batches))
            report("deliver flow, first run (cold, 2,000 msgs)", cold_rate, cold_cpu, ceiling)
            report("prefect-webhooks deliver flow (Prefect)", rate, cpu, ceiling)


def compare_ordered(folder: Path, sink_url: str, payloads: list[dict], args: argparse.Namespace,
                    ceiling: float) -> None:
    """Ordered against unordered delivery of the same messages (``args.users`` users), alternating, twice each."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for attempt in range(2):
        for ordered in (False, True):
            rate, cpu = asyncio.run(ours(fresh_store(folder, f"ordered-{ordered}-{attempt}.db"), sink_url, payloads,
                                         args.batch_size, args.parallel_batches, ordered=ordered))
            rates[ordered].append(rate)
            report(f"deliver_due, {args.users:,} users, {'ordered' if ordered else 'unordered'}", rate, cpu, ceiling)
    unordered, ordered = max(rates[False]), max(rates[True])
    print(f"ordered / unordered (best of two each): {ordered / unordered:.1%}")


def report(what: str, rate: float, cpu_us: float, ceiling: float) -> None:
    print(f"{what:42s} {rate:8.0f} msg/s  {rate / ceiling:6.1%} of the ceiling  {cpu_us:6.0f} µs CPU/msg")


if __name__ == "__main__":
    main()
