"""Retries beside a slow endpoint: how late a retry goes out while another endpoint of the same run answers in 2 s.

    .venv/bin/python bench/bench_slow_retries.py [--messages 60] [--rounds 2] [--reference PATH]

One continuous ``deliver_due`` run (as a delivery worker runs it) on a fresh SQLite store gets a stream of messages:
one every 0.1 s to a destination whose endpoint answers 500 to each message's first request and 200 after it, and,
from the stream's first third on, one every 0.2 s to a destination whose endpoint answers every request after 2 s.
Retry base delay 1 s, so each retry is due 0.8-1.2 s after its 500. Both endpoints are served by a receiver process
of their own, which notes when each request arrived. Printed per run, for the flaky destination's messages:

- how late each retry went out after its due time (the due time as the outbox held it, read every 20 ms while the
  message waited; sent: the attempt's time in the store; arrived: the receiver's clock): p50, p99, max;
- the first attempts' latency (message stored to its first request arriving), before the slow stream began and
  beside it.

With ``--reference PATH`` (a ``git worktree`` of another commit) each round runs that code too, in turn, each run in
a process of its own that imports the package from its root: before/after in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

RECEIVER = """
import json, sys, time
from aiohttp import web
seen, arrivals = set(), {}
async def flaky(request):
    body = await request.read()
    key = request.headers["Idempotency-Key"]
    arrivals.setdefault(key, []).append(time.time())
    first = body not in seen
    seen.add(body)
    return web.Response(status=500 if first else 200, text="ok")
async def slow(request):
    await request.read()
    import asyncio
    await asyncio.sleep(2.0)
    return web.Response(text="ok")
async def ok(request):
    await request.read()
    return web.Response(text="ok")
async def report(request):
    return web.json_response(arrivals)
async def main():
    app = web.Application()
    app.router.add_post("/flaky", flaky)
    app.router.add_post("/slow", slow)
    app.router.add_post("/ok", ok)
    app.router.add_get("/arrivals", report)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def child(root: str, messages: int, store: str) -> dict[str, Any]:
    """One run of the code at ``root`` (imported from there); the figures as a dict."""
    sys.path.insert(0, root)
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = f"sqlite:///{store}"
    os.environ["PREFECT_WEBHOOKS_HOME"] = str(Path(store).parent)
    os.environ["PREFECT_WEBHOOKS_RETRY_BASE_DELAY"] = "1"
    # Every first attempt of the flaky endpoint fails: no circuit opening, no failing-endpoint events.
    os.environ["PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD"] = "100000"
    os.environ["PREFECT_WEBHOOKS_ENDPOINT_FAILING_THRESHOLD"] = "100000"
    import asyncio
    import threading
    import urllib.request

    from sqlalchemy import select

    import prefect_webhooks
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
    from prefect_webhooks.messages.outcomes import PENDING
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.log.lookups import find_messages
    from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue

    assert Path(prefect_webhooks.__file__).resolve().is_relative_to(Path(root).resolve()), prefect_webhooks.__file__
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        base = f"http://127.0.0.1:{int(receiver.stdout.readline())}"
        due: dict[int, Any] = {}
        stop = threading.Event()
        engine = get_engine()

        def watch() -> None:
            statement = select(OUTBOX.c.id, OUTBOX.c.next_attempt_at).where(
                OUTBOX.c.destination == "flaky", OUTBOX.c.state == PENDING, OUTBOX.c.attempts == 1)
            while not stop.wait(0.02):
                with engine.connect() as connection:
                    for outbox_id, when in connection.execute(statement):
                        due.setdefault(outbox_id, when)

        def track(n: int) -> dict[str, Any]:
            return {"version": 1, "type": "track", "userId": f"u{n}", "timestamp": "2026-03-04T05:06:07.123Z",
                    "event": "E", "properties": {"n": n}}

        async def run() -> None:
            async with Sender() as sender:
                context = DeliveryContext(engine, sender)
                context.destinations.remember("flaky", WebhookDestination(endpoints=[{"url": f"{base}/flaky"}]))
                context.destinations.remember("slow", WebhookDestination(endpoints=[{"url": f"{base}/slow"}]))
                # A first message pays what a process pays once (connections, statements, threads).
                enqueue("warm-up", [track(-1)])
                context.destinations.remember("warm-up", WebhookDestination(endpoints=[{"url": f"{base}/ok"}]))
                running = asyncio.ensure_future(deliver_due(
                    DeliveryOptions(run_for_seconds=messages * 0.1 + 3.5), context=context))
                await asyncio.sleep(0.5)
                for step in range(messages):
                    await asyncio.to_thread(enqueue, "flaky", [track(step)])
                    if step >= messages // 3 and step % 2 == 0:
                        await asyncio.to_thread(enqueue, "slow", [track(10_000 + step)])
                    await asyncio.sleep(0.1)
                await running

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        asyncio.run(run())
        stop.set()
        watcher.join(5)
        with urllib.request.urlopen(f"{base}/arrivals") as answer:
            arrivals = {int(key.rsplit("_", 1)[1]): times for key, times in json.loads(answer.read()).items()}
    finally:
        receiver.terminate()
        receiver.wait(10)
    with engine.connect() as connection:
        rows = [row for row in find_messages(connection, limit=10**6) if row.destination == "flaky"]

    def epoch(moment: Any) -> float:
        return moment.timestamp() if moment.tzinfo else (moment - type(moment)(1970, 1, 1)).total_seconds()

    rows.sort(key=lambda row: row.id)
    late_sent, late_arrived, first = [], [], []
    for row in rows:
        times = arrivals.get(row.id, [])
        first.append(times[0] - epoch(row.created_at) if times else float("nan"))
        retry = next((attempt for attempt in row.tries if attempt.status_code == 200), None)
        if row.id in due and retry is not None and len(times) >= 2:
            late_sent.append(epoch(retry.attempted_at) - epoch(due[row.id]))
            late_arrived.append(times[1] - epoch(due[row.id]))
    third = len(rows) // 3
    return {"messages": len(rows), "retries": len(late_sent), "late_sent": late_sent, "late_arrived": late_arrived,
            "first_alone": first[:third], "first_beside_slow": first[third + 5:]}


def summary(figures: dict[str, Any]) -> str:
    sent, arrived = figures["late_sent"], figures["late_arrived"]
    if not sent:
        return "no retry measured"
    ms = 1000
    return (f"retry after its due time: sent p50 {statistics.median(sent) * ms:7.1f} ms  p99 "
            f"{percentile(sent, 0.99) * ms:7.1f} ms  max {max(sent) * ms:7.1f} ms; arrived p50 "
            f"{statistics.median(arrived) * ms:7.1f}  p99 {percentile(arrived, 0.99) * ms:7.1f} ms "
            f"({figures['retries']} of {figures['messages']}); first attempt p99: alone "
            f"{percentile(figures['first_alone'], 0.99) * ms:4.0f} ms, beside the 2 s endpoint "
            f"{percentile(figures['first_beside_slow'], 0.99) * ms:4.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reference", default=None, help="root of another checkout (a git worktree) to run in turn")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.messages, args.store)))
        return 0
    codes = {"this checkout": str(ROOT)}
    if args.reference:
        codes = {f"reference ({args.reference})": str(Path(args.reference).resolve()), **codes}
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PYTEST_"))}
    print(f"{args.messages} messages to a flaky endpoint (500 then 200, retry due 0.8-1.2 s later), beside one "
          f"answering in 2 s; {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    with tempfile.TemporaryDirectory() as folder:
        for round_number in range(1, args.rounds + 1):
            for label, root in codes.items():
                store = Path(folder) / f"{round_number}-{len(label)}-{abs(hash(label))}.db"
                done = subprocess.run([sys.executable, __file__, "--child", root, "--store", str(store),
                                       "--messages", str(args.messages)], capture_output=True, text=True, env=env,
                                      timeout=300, cwd=folder)
                if done.returncode != 0:
                    print(f"round {round_number}, {label}: failed\n{done.stderr[-3000:]}")
                    return 1
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"round {round_number}, {label}:\n    {summary(figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
