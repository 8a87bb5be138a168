"""Scale-out: 1, 2 and 4 delivery worker processes sharing one PostgreSQL outbox.

    .venv/bin/python bench/bench_scaleout.py [--messages 20000] [--workers 1 2 4] [--postgres URL]

For each worker count: a fresh PostgreSQL database, N signed ``track`` messages enqueued, then that many processes
each running ``deliver_due`` (claims with ``FOR UPDATE SKIP LOCKED``, one aiohttp session per process) against
nginx answering 200 on 127.0.0.1. Workers import and connect first, then start together; the figure is N divided
by the time from the start signal until the last worker exits, and every row is checked ``delivered`` afterwards.
In the same run the reference: a raw aiohttp POST loop in this process (no store), the single-process ceiling.

PostgreSQL comes from ``--postgres``, ``PREFECT_WEBHOOKS_TEST_POSTGRES_URL`` or else a throwaway server started with
``scripts/test-postgres`` on a free port, which is stopped (and its data folder removed) when the benchmark ends.
The receiver used is printed (nginx, or the aiohttp fallback when nginx is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_delivery import Sink, make_payloads, raw_loop  # noqa: E402
from bench_stores import Postgres  # noqa: E402


async def _worker(sink_url: str) -> dict:
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.delivery import DeliveryContext, Sender, deliver_due
    from prefect_webhooks.store.engine.engines import get_engine

    block = WebhookDestination(endpoints=[{"url": sink_url, "headers": {"X-Api-Key": "k"}}],
                               shared_secret="bench-s3cret-0001")
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        context.destinations.remember("bench", block)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        cpu = time.process_time()
        stats = await deliver_due(context=context)
        return {"delivered": stats.delivered, "batches": stats.batches, "cpu_s": time.process_time() - cpu}


def worker_main(sink_url: str) -> None:
    """One worker process: connect, say ready, wait for the start line, drain the outbox, print stats."""
    print(json.dumps(asyncio.run(_worker(sink_url))), flush=True)


def run_config(postgres: Postgres, sink_url: str, messages: int, workers: int) -> tuple[float, list[dict]]:
    """Messages/s of ``workers`` processes draining ``messages`` from a fresh database, and each worker's stats."""
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import enqueue

    url = postgres.fresh_database()
    engine = get_engine(url)
    payloads = make_payloads(messages)
    for start in range(0, messages, 2000):
        enqueue("bench", payloads[start:start + 2000], engine=engine)
    env = {**os.environ, "PREFECT_WEBHOOKS_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", sink_url], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=900)
        results.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = time.perf_counter() - started
    delivered = count_delivered(url)
    assert delivered == messages, f"{delivered} of {messages} delivered"
    assert sum(result["delivered"] for result in results) == messages
    engine.dispose()
    return messages / elapsed, results


def count_delivered(url: str) -> int:
    from prefect_webhooks.messages.outcomes import DELIVERED
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.figures.counters import outcome_totals

    # The counters, not the messages: delivered ones have left the queue for the log.
    with get_engine(url).connect() as connection:
        return sum(outcomes.get(DELIVERED, 0) for outcomes in outcome_totals(connection).values())


def main() -> None:
    """Run every configuration and print messages/s and the scaling ratio against one worker."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    with Postgres(args.postgres) as postgres, Sink(args.port) as sink:
        assert postgres.url is not None
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; PostgreSQL "
              f"{postgres.url.rsplit('@', 1)[-1]}" + (" (started for this run)" if postgres.started_port else ""))
        bodies = [json.dumps(payload).encode() for payload in make_payloads(args.messages)]
        ceiling, _ = asyncio.run(raw_loop(sink.url, bodies, 64))
        print(f"receiver: {sink.kind}; reference, raw aiohttp loop in one process (no store): {ceiling:,.0f} msg/s")
        rates: dict[int, float] = {}
        for workers in args.workers:
            rate, results = run_config(postgres, sink.url, args.messages, workers)
            rates[workers] = rate
            share = ", ".join(f"{result['delivered']} ({result['cpu_s']:.1f} s CPU)" for result in results)
            base = rates.get(1)
            ratio = f"{rate / base:.2f}x of 1 worker" if base else "-"
            print(f"{workers} worker(s): {rate:,.0f} msg/s ({rate / ceiling:.0%} of the raw loop), {ratio}; "
                  f"per worker: {share}")


if __name__ == "__main__":
    main()
