"""Benchmark: 100,000 ``track`` calls through our Analytics client and through segment-analytics-python.

Both clients send to the same kind of endpoint: the project's own ingest API (real uvicorn, ``prefect-webhooks
ingest``) on 127.0.0.1, backed by a fresh temporary SQLite store per client, with Source blocks on a temporary
Prefect API. Each client runs in its own subprocess so its peak RSS is its own. Both use their default settings
(Segment's ``host`` points at our API).

Reported per client: calls/s accepted (the calling loop), calls/s delivered (rows in the store ÷ time from the
first call until ``flush()`` returned), peak RSS (``ru_maxrss``) after import and at the end, messages lost
(calls made − rows stored).

Usage:
    .venv/bin/python bench/bench_client.py [--messages 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLIENTS = ("prefect-webhooks", "segment-analytics-python")
ENDPOINT_TITLES = {
    "sink": "Endpoint: a counting receiver (aiohttp, own process) on 127.0.0.1: the clients' own limits",
    "api": "Endpoint: our ingest API (uvicorn + SQLite store, own process) on 127.0.0.1",
}


def _rss_mb() -> float:
    """Peak RSS of this process in MB.

    ``ru_maxrss`` survives ``execve`` on Linux, so a worker started by this (Prefect-loaded, ~170 MB) parent would
    report the parent's size; ``VmHWM`` belongs to the new address space and starts afresh at exec.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(client: str, url: str, write_key: str, messages: int) -> dict:
    """Run in a subprocess: make ``messages`` track calls with one client and report timings and RSS."""
    if client == "prefect-webhooks":
        from prefect_webhooks import Analytics

        errors: list[int] = []
        analytics = Analytics(write_key, endpoint=url, on_error=lambda error, batch: errors.append(len(batch)))
        track, flush = analytics.track, analytics.flush
    else:
        from segment.analytics import Client

        analytics = Client(write_key=write_key, host=url)
        track, flush = analytics.track, analytics.flush
    rss_import = _rss_mb()
    started = time.perf_counter()
    for index in range(messages):
        track(f"user-{index % 1000}", "Bench Event", {"index": index, "plan": "pro", "revenue": 12.5})
    accepted = time.perf_counter() - started
    flush()
    done = time.perf_counter() - started
    report = {"accepted_s": accepted, "done_s": done, "rss_import_mb": rss_import, "rss_peak_mb": _rss_mb()}
    if client == "prefect-webhooks":
        report.update(
            uploaded=analytics.uploaded, failed=analytics.failed, dropped=analytics.dropped, on_error=sum(errors)
        )
        analytics.close()
    else:
        analytics.shutdown()
    return report


def _stored(store_url: str) -> int:
    from sqlalchemy import func, select

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.schema.tables import OutboxMessage

    with get_engine(store_url).connect() as connection:
        return connection.execute(select(func.count()).select_from(OutboxMessage.__table__)).scalar_one()


def sink(port: int) -> None:
    """Run in a subprocess: a fast receiver answering 200 to /v1/batch and counting (distinct) messageIds."""
    import orjson
    from aiohttp import web

    seen: set[str] = set()
    totals = {"messages": 0}

    async def batch(request: web.Request) -> web.Response:
        for message in orjson.loads(await request.read())["batch"]:
            seen.add(message["messageId"])
            totals["messages"] += 1
        return web.Response(text="ok")

    async def count(_request: web.Request) -> web.Response:
        return web.json_response({"messages": totals["messages"], "distinct": len(seen)})

    app = web.Application(client_max_size=2**24)
    app.router.add_post("/v1/batch", batch)
    app.router.add_get("/count", count)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


@contextmanager
def sink_endpoint() -> Iterator[tuple[str, str, Callable[[], int]]]:
    """A counting sink in its own process; yields (url, write_key, count of distinct messages received)."""
    import httpx

    from tests.servers import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, __file__, "--sink", str(port)], env=_child_env())
    try:
        for _ in range(200):
            try:
                httpx.get(f"{url}/count", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        yield url, "wk_bench_sink", lambda: httpx.get(f"{url}/count").json()["distinct"]
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def api_endpoint(prefect_api_url: str, workdir: Path) -> Iterator[tuple[str, str, Callable[[], int]]]:
    """Our ingest API with a fresh SQLite store; yields (url, write_key, rows stored)."""
    from tests.servers import ingest_api_process, save_destination, save_source

    suffix = uuid.uuid4().hex[:8]
    write_key = f"wk_bench_{suffix}"
    save_destination(f"bench-dest-{suffix}", ["http://127.0.0.1:9/never-called"])
    save_source(f"bench-src-{suffix}", write_key, [f"bench-dest-{suffix}"])
    store_url = f"sqlite:///{workdir / f'store-{suffix}.db'}"
    with ingest_api_process(store_url, prefect_api_url=prefect_api_url) as server:
        yield server.url, write_key, lambda: _stored(store_url)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _run_client(client: str, messages: int, endpoint: AbstractContextManager) -> dict:
    with endpoint as (url, write_key, received):
        result = subprocess.run(
            [sys.executable, __file__, "--worker", client, url, write_key, str(messages)],
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        report = json.loads(result.stdout.strip().splitlines()[-1])
        report["stored"] = received()
    report["lost"] = messages - report["stored"]
    report["log_lines"] = len([line for line in result.stderr.splitlines() if line.strip()])
    return report


def _table(results: dict[str, dict], messages: int) -> str:
    lines = [
        "| client | calls/s accepted | calls/s delivered | peak RSS after import / at end | stored | lost |",
        "|---|---|---|---|---|---|",
    ]
    for client, r in results.items():
        lines.append(
            f"| {client} | {messages / r['accepted_s']:,.0f} | {r['stored'] / r['done_s']:,.0f} "
            f"| {r['rss_import_mb']:.0f} MB / {r['rss_peak_mb']:.0f} MB | {r['stored']:,} | {r['lost']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run both clients against both endpoints and print Markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--endpoints", default="sink,api", help="comma-separated: sink, api")
    parser.add_argument("--worker", nargs=4, metavar=("CLIENT", "URL", "KEY", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--sink", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        client, url, key, count = args.worker
        print(json.dumps(worker(client, url, key, int(count))))
        return
    if args.sink:
        sink(args.sink)
        return

    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{args.messages:,} track calls per client, default settings of both clients"
    )
    print("load average at start (other work on this machine slows every figure): "
          + ", ".join(f"{load:.1f}" for load in os.getloadavg()), flush=True)
    endpoints = args.endpoints.split(",")
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        for name in endpoints:
            results: dict[str, dict] = {}
            for client in CLIENTS:
                endpoint = sink_endpoint() if name == "sink" else api_endpoint(PREFECT_API_URL.value(), Path(tmp))
                results[client] = _run_client(client, args.messages, endpoint)
                print(client, name, json.dumps(results[client]), file=sys.stderr, flush=True)
            ours, theirs = (results[c] for c in CLIENTS)
            ratio = (ours["stored"] / ours["done_s"]) / (theirs["stored"] / theirs["done_s"])
            print(f"\n{ENDPOINT_TITLES[name]}\n")
            print(_table(results, args.messages))
            print(f"\ndelivered throughput ratio (ours / Segment): {ratio:.2f}x", flush=True)
    print("\nload average at end: " + ", ".join(f"{load:.1f}" for load in os.getloadavg()))


if __name__ == "__main__":
    main()
