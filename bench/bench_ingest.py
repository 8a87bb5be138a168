"""Ingest API benchmark: events/s accepted and committed, against a bare endpoint on the same stack.

Run: ``.venv/bin/python bench/bench_ingest.py [--seconds 15] [--processes 3] [--concurrency 16]``

1. Throughput: batches of 100 calls over loopback from several client processes (aiohttp, keep-alive) to
   ``prefect-webhooks ingest`` (uvicorn, one process, SQLite store). The same clients then hit a bare ASGI endpoint
   on the same stack (uvicorn + FastAPI, raw Request) that only parses the JSON: the ceiling. Both figures and
   their ratio are printed; the store is counted afterwards to show every accepted call was committed.
2. Latency (``--latency``): calls sent at a steady 500 events/s while the ``deliver`` flow runs continuously;
   the time from the POST to the call's arrival at a real HTTP receiver, p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

BATCH = 100

bare_app = FastAPI()


@bare_app.post("/v1/batch")
async def bare_batch(request: Request) -> Response:
    """The ceiling: read the body, parse the JSON, answer 200."""
    orjson.loads(await request.body())
    return Response(b'{"success":true}', media_type="application/json")


@bare_app.get("/health")
async def bare_health() -> Response:
    return Response(b'{"ok":true}', media_type="application/json")


def _auth(write_key: str) -> str:
    return "Basic " + base64.b64encode(f"{write_key}:".encode()).decode()


async def _client_loop(
    url: str, write_key: str, seconds: float, concurrency: int, prefix: str
) -> tuple[int, int, float, float]:
    import aiohttp

    headers = {"Authorization": _auth(write_key), "Content-Type": "application/json"}
    template = [
        {"type": "track", "userId": f"user-{i}", "event": "Order Completed",
         "properties": {"total": 42.5, "currency": "EUR", "sku": "A-1"}, "context": {"ip": "10.0.0.1"}}
        for i in range(BATCH)
    ]
    accepted = 0
    refused = 0
    counter = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal accepted, refused, counter
        while time.monotonic() < deadline:
            counter += 1
            batch_id = f"{prefix}-{counter}"
            for index, call in enumerate(template):
                call["messageId"] = f"{batch_id}-{index}"
            body = orjson.dumps({"batch": template})
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status == 200:
                    accepted += BATCH
                else:
                    refused += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.time()
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        ended = time.time()
    return accepted, refused, started, ended


def _client_process(args: tuple[str, str, float, int, str]) -> tuple[int, int, float, float]:
    return asyncio.run(_client_loop(*args))


def load(url: str, write_key: str, seconds: float, processes: int, concurrency: int) -> tuple[float, int, int]:
    """Run the client processes; returns (events/s accepted, events accepted, refused requests)."""
    run_id = uuid.uuid4().hex[:8]
    jobs = [(f"{url}/v1/batch", write_key, seconds, concurrency, f"{run_id}-{p}") for p in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.map(_client_process, jobs)
    accepted = sum(r[0] for r in results)
    refused = sum(r[1] for r in results)
    # From the first client's start to the last client's end (process start-up left out).
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)
    return accepted / elapsed, accepted, refused


def _wait_health(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(url)


def bare_server(port: int) -> subprocess.Popen:
    """The bare endpoint under uvicorn (same loop/parser choice as the ingest command)."""
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"), "bench_ingest:bare_app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def count_rows(store_url: str, source: str) -> int:
    from sqlalchemy import func, select

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import OutboxMessage

    table = OutboxMessage.__table__
    with get_engine(store_url).connect() as connection:
        return connection.execute(select(func.count()).where(table.c.source == source)).scalar_one()


def throughput(args: argparse.Namespace, store_url: str, api_url: str) -> dict[str, float]:
    from prefect_webhooks.blocks.source import Source
    from tests.servers import free_port, ingest_api_process

    name, key = f"bench-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    Source(write_key=key, destinations=["bench-dest"]).save(name, overwrite=True)

    with ingest_api_process(store_url, prefect_api_url=api_url) as server:
        load(server.url, key, 2, args.processes, args.concurrency)  # warm-up (connections, caches, schema)
        before = count_rows(store_url, name)
        cpu_before = _cpu_seconds(server.process.pid)
        ours, accepted, refused = load(server.url, key, args.seconds, args.processes, args.concurrency)
        server_cpu = _cpu_seconds(server.process.pid) - cpu_before
        committed = count_rows(store_url, name) - before
    port = free_port()
    bare = bare_server(port)
    try:
        _wait_health(f"http://127.0.0.1:{port}", bare)
        load(f"http://127.0.0.1:{port}", key, 2, args.processes, args.concurrency)
        ceiling, _, bare_refused = load(f"http://127.0.0.1:{port}", key, args.seconds, args.processes,
                                        args.concurrency)
    finally:
        bare.terminate()
        bare.wait(10)
    print(f"ingest API : {ours:10,.0f} events/s accepted ({accepted:,} in {args.seconds:.0f} s, "
          f"{refused} requests refused; {committed:,} outbox rows committed)")
    print(f"             server CPU {server_cpu:.1f} s for {args.seconds:.0f} s of load "
          f"({server_cpu / max(accepted, 1) * 1e6:.0f} us of CPU per call)")
    print(f"bare ASGI  : {ceiling:10,.0f} events/s parsed   ({bare_refused} refused)")
    print(f"ratio      : {ours / ceiling:10.1%} of the bare endpoint   (targets: >= 10,000 events/s, >= 40 %)")
    return {"ours": ours, "ceiling": ceiling, "accepted": accepted, "committed": committed}


async def _paced_sender(
    url: str, write_key: str, rate: float, seconds: float, per_request: int, acks: list[float]
) -> int:
    import aiohttp

    headers = {"Authorization": _auth(write_key), "Content-Type": "application/json"}
    interval = per_request / rate
    sent = 0
    tasks = []
    async with aiohttp.ClientSession() as session:

        async def post(body: bytes) -> None:
            started = time.monotonic()
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
            if response.status == 200:
                acks.append(time.monotonic() - started)

        start = time.monotonic()
        step = 0
        while time.monotonic() - start < seconds:
            now = time.time()
            batch = [
                {"type": "track", "userId": "lat", "event": "Ping", "messageId": uuid.uuid4().hex,
                 "properties": {"sent": now}}
                for _ in range(per_request)
            ]
            tasks.append(asyncio.create_task(post(orjson.dumps({"batch": batch}))))
            sent += per_request
            step += 1
            await asyncio.sleep(max(0.0, start + step * interval - time.monotonic()))
        await asyncio.gather(*tasks)
    return sent


def latency(args: argparse.Namespace, store_url: str, api_url: str) -> dict[str, float]:
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.source import Source
    from prefect_webhooks.flows.deliver import deliver
    from prefect_webhooks.settings import get_settings
    from tests.receivers import Receiver
    from tests.servers import ingest_api_process

    seconds = args.latency_seconds
    # The deliver flow runs in this process and reads the store from the settings.
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = store_url
    get_settings.cache_clear()
    with Receiver() as receiver:
        destination = f"lat-dest-{uuid.uuid4().hex[:6]}"
        WebhookDestination(endpoints=[{"url": receiver.url}]).save(destination, overwrite=True)
        name, key = f"lat-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        Source(write_key=key, destinations=[destination]).save(name, overwrite=True)
        with ingest_api_process(store_url, prefect_api_url=api_url) as server:
            flow_thread = threading.Thread(
                target=lambda: deliver(destination=destination, run_for_seconds=seconds + 8, idle_sleep=0.05),
                daemon=True,
            )
            flow_thread.start()
            time.sleep(3)  # the flow run starts and claims before the load begins
            acks: list[float] = []
            sent = asyncio.run(_paced_sender(f"{server.url}/v1/batch", key, 500, seconds, 10, acks))
            flow_thread.join(seconds + 60)
        delays = sorted(
            request.at - orjson.loads(request.body)["properties"]["sent"]
            for request in receiver.requests
            if request.method == "POST" and request.body
        )
    p50 = statistics.median(delays) if delays else float("nan")
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))] if delays else float("nan")
    acks.sort()
    if acks:
        print(f"ingest ack : p50 {statistics.median(acks) * 1000:.0f} ms, "
              f"p99 {acks[min(len(acks) - 1, int(len(acks) * 0.99))] * 1000:.0f} ms (POST to its 200, same load)")
    print(f"latency    : {len(delays):,}/{sent:,} delivered; ingest→delivery p50 {p50 * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms at 500 events/s with the deliver flow running (targets: p50 <= 1 s, p99 <= 3 s)")
    return {"p50": p50, "p99": p99, "delivered": len(delays), "sent": sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="Seconds of load per server.")
    parser.add_argument("--processes", type=int, default=3, help="Client processes.")
    parser.add_argument("--concurrency", type=int, default=16, help="Requests in flight per client process.")
    parser.add_argument("--throughput", action=argparse.BooleanOptionalAction, default=True,
                        help="Measure events/s against the bare endpoint.")
    parser.add_argument("--latency", action=argparse.BooleanOptionalAction, default=True,
                        help="Also measure ingest-to-delivery latency with the deliver flow running.")
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="Seconds of paced load for latency.")
    args = parser.parse_args()

    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    store_url = f"sqlite:///{workdir / 'store.db'}"
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = store_url
    print(f"bench_ingest: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
          f"batches of {BATCH}, {args.processes} client processes x {args.concurrency} in flight, SQLite store")
    with prefect_test_harness(server_startup_timeout=120):
        api_url = PREFECT_API_URL.value()
        if args.throughput:
            throughput(args, store_url, api_url)
        if args.latency:
            # A fresh store: the throughput run's rows are not the deliver flow's business.
            latency(args, f"sqlite:///{workdir / 'latency.db'}", api_url)


if __name__ == "__main__":
    main()
