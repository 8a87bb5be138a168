"""Request path: which HTTP client sends a signed webhook for the least client CPU, same requests, one run.

    .venv/bin/python bench/bench_request_path.py [--requests 20000] [--concurrency 64] [--loops uvloop asyncio]
        [--candidates aiohttp-session pycurl-transport ...] [--quick]

Every candidate sends the same ``--requests`` POSTs (distinct ~400-byte JSON bodies of the seed's track shape, each
signed when sent: ``X-Signature`` HMAC-SHA1 hex, ``Idempotency-Key``, ``User-Agent: prefect-webhooks/1.0``,
``Content-Type: application/json`` and a static endpoint header) to the same receiver, ``--concurrency`` (64) in
flight on keep-alive connections, in a raw loop (no store), after a warm-up of ``--warm-up`` requests on the same
client. Each candidate runs in a process of its own, first in the order listed, then a second round in reverse
order (the machine's speed drifts), under each event loop of ``--loops`` (uvloop: as the delivery worker runs).
Printed for each: requests/s; client CPU µs per request: the process's user+sys over all its threads (pyreqwest
runs reqwest on a Tokio thread of its own) and, in brackets, the event loop's thread alone (``time.thread_time``:
the thread that Python work per message shares, which bounds one delivery worker); the process's CPU in CPU
references (``sum(range(1000))``, measured by its process just before); its threads; its CPU against
``aiohttp-session`` in the same round and loop.

The receiver is nginx answering 200 ``ok`` (``../shared/bench/nginx-sink``), or an aiohttp server in another process
when nginx cannot be started (as ``bench_delivery.py``).

Candidates (each does what delivery needs per request: method, headers, a total timeout, the status, the answer's
start (at most 1 KB read where the client can bound it), ``Retry-After`` on 429/503):

- ``shape-only``: the shared per-request work alone (signature, header dict), no request: what is not the client's;
- ``aiohttp-session``: ``ClientSession.request`` as ``delivery/sending/sender.py`` used it until delivery moved to
  pycurl (b9ea458; the reference the ratios are taken against): TCPConnector, DummyCookieJar, ``auto_decompress=False``,
  ``ClientTimeout(total=5)``, ``allow_redirects=False``, ``ssl=True``, body read whole;
- ``aiohttp-request``: aiohttp's layer under the session: ``ClientRequest`` + ``TCPConnector.connect`` +
  ``req.send`` / ``resp.start`` / ``resp.content.read(1024)`` + ``release``, a total timeout by ``asyncio.timeout``
  (what ``ClientSession._request`` does without cookies, redirects, tracing, middlewares and its timer);
- ``protocol-httptools`` (a floor, not a candidate: a client of our own): an ``asyncio.Protocol`` per connection,
  the request bytes joined by hand, httptools' llhttp parser (C) for the answer, an idle-connection list;
- ``pycurl-transport``: delivery's request path, the package's ``CurlTransport`` (``delivery/sending/transport.py``:
  libcurl's multi interface on the event loop, ``socket_action`` from ``loop.add_reader`` / ``add_writer`` and one
  loop timer, after Tornado's ``curl_httpclient``), made and called as ``delivery/sending/sender.py`` does: one
  transport, ``timeout`` 5 s, keep-alive 30 s, ``connections`` the concurrency, ``await transport.request("POST", url,
  body, headers)``, ``answer.header(b"retry-after")`` on 429/503; the answer bounded by delivery's ``READ_LIMIT``
  (64 KiB), the private-network guard off (its default; the receiver is on loopback). Importing the package loads
  Prefect (seconds of CPU): the candidate's process does it before the warm-up, and then holds Prefect's modules
  (the garbage collector set as for every other candidate: the delivery worker's ``tune_gc_for_serving`` is not
  applied). The bench's own first driver (``CurlLoop``, removed: no step written twice) was measured on 2026-12-04
  with libcurl's timer moves kept to one loop timer and with Tornado's handling (a new ``call_later`` at every move,
  ``pycurl-plain``): the two were within each other's noise. Keeping a keep-alive connection's socket watched
  between requests would save two ``epoll_ctl`` a request but is unsafe: libcurl closes idle connections without a
  word (pycurl's ``CLOSESOCKETFUNCTION`` fails for a connection whose handle left the multi), and a registration
  that outlives its descriptor lands on whatever socket takes the number next;
- ``pyreqwest-consumed`` / ``pyreqwest-streamed``: pyreqwest's async ``Client`` (reqwest/hyper on a Tokio runtime on
  its own thread), ``max_connections``, ``http1_only``, no decompression, no redirects; the body read whole, or
  ``build_streamed`` + ``body_reader.read(1024)`` (the bounded read delivery needs); ``pyreqwest-lean``: streamed,
  the endpoint's fixed headers as the client's defaults and two ``.header()`` calls a request;
- ``curl-cffi``, ``aiosonic``: other maintained clients (libcurl through cffi with its own asyncio integration; a
  pure-Python asyncio client), run when installed (not test dependencies).

``pyreqwest-lean``, ``curl-cffi`` and ``aiosonic`` run only when named in ``--candidates``. On 2026-12-04 (2 cores
shared with other work, each in one run with aiohttp-session): curl-cffi 1,500-2,200 req/s at 2.3-2.6x
aiohttp-session's CPU per request, aiosonic 4,100-5,400 req/s at 1.1-1.3x; pyreqwest-lean within the noise of
pyreqwest-streamed. Figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import importlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

from cpu_accounting import cpu_reference  # noqa: E402

USER_AGENT = "prefect-webhooks/1.0"
SECRET = b"bench-s3cret-0001"
ANSWER_LIMIT = 1024
RETRY_AFTER_STATUSES = (429, 503)
TIMEOUT = 5.0
CONNECT_TIMEOUT = 5.0

Send = Callable[[int], Awaitable[int]]


# ------------------------------------------------------------------------------------------------- the requests


def make_bodies(count: int) -> list[bytes]:
    """``count`` distinct track messages as sent (compact JSON), about 400 bytes each."""
    import orjson

    return [orjson.dumps({
        "version": 1, "type": "track", "userId": f"user-{n:08d}", "timestamp": "2026-12-03T10:00:00.000Z",
        "event": "Order Completed",
        "properties": {"orderId": f"ord-{n:010d}", "checkoutId": f"chk-{n * 7919 % 10**9:09d}", "total": 27.5,
                       "revenue": 25.0, "shipping": 3.0, "tax": 2.0, "discount": 2.5, "coupon": "WINTER",
                       "currency": "EUR", "affiliation": "web shop",
                       "products": [{"productId": "507f1f77bcf86cd799439011", "sku": "45790-32", "name": "Monopoly",
                                     "price": 19.0, "quantity": 1, "category": "Games"}]},
    }) for n in range(count)]


def shaper(bodies: list[bytes]) -> Callable[[int], tuple[bytes, dict[str, str]]]:
    """Request ``i``'s body and headers, signed now: the work every candidate does alike per request."""
    def shape(i: int) -> tuple[bytes, dict[str, str]]:
        body = bodies[i % len(bodies)]
        return body, {"User-Agent": USER_AGENT, "Content-Type": "application/json", "X-Api-Key": "k-0123456789",
                      "X-Signature": hmac.new(SECRET, body, hashlib.sha1).hexdigest(), "Idempotency-Key": f"msg-{i}"}
    return shape


async def drive(send: Send, first: int, count: int, concurrency: int) -> list[int]:
    """Send requests ``first .. first+count`` with ``concurrency`` workers; the statuses that were not 200."""
    pending = iter(range(first, first + count))
    bad: list[int] = []

    async def worker() -> None:
        for i in pending:
            status = await send(i)
            if status != 200:
                bad.append(status)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return bad


# ------------------------------------------------------------------------------------------------- candidates


@contextlib.asynccontextmanager
async def shape_only(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    async def send(i: int) -> int:
        shape(i)
        await asyncio.sleep(0)
        return 200
    yield send


@contextlib.asynccontextmanager
async def aiohttp_session(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    import ssl

    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl.create_default_context(), keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                                     cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False) as session:
        async def send(i: int) -> int:
            body, headers = shape(i)
            async with session.request("POST", url, data=body, headers=headers, allow_redirects=False,
                                       ssl=True) as response:
                answer = await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del answer, retry_after
            return status
        yield send


@contextlib.asynccontextmanager
async def aiohttp_request(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    import ssl

    import aiohttp
    from aiohttp.client_reqrep import URL  # yarl's URL, which ClientRequest takes

    loop = asyncio.get_running_loop()
    target = URL(url)
    no_timeout = aiohttp.ClientTimeout()
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl.create_default_context(), keepalive_timeout=30)
    try:
        async def send(i: int) -> int:
            body, headers = shape(i)
            request = aiohttp.ClientRequest("POST", target, headers=headers, data=body, loop=loop, ssl=True)
            async with asyncio.timeout(TIMEOUT):
                connection = await connector.connect(request, [], no_timeout)
                assert connection.protocol is not None
                connection.protocol.set_response_params(auto_decompress=False)
                try:
                    response = await request.send(connection)
                    await response.start(connection)
                except BaseException:
                    connection.close()
                    raise
                try:
                    answer = await response.content.read(ANSWER_LIMIT)
                    status = response.status
                    retry_after = response.headers.get("Retry-After") if status in RETRY_AFTER_STATUSES else None
                    if response.content.at_eof():
                        response.release()
                    else:  # more than we keep: the connection is not reused
                        response.close()
                except BaseException:
                    response.close()
                    raise
            del answer, retry_after
            return status
        yield send
    finally:
        await connector.close()


class _HttpConnection(asyncio.Protocol):
    """One keep-alive connection of the ``protocol-httptools`` floor."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.answer = bytearray()
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = True

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep_alive = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("closed before the answer"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        if len(self.answer) < ANSWER_LIMIT:
            self.answer += body[:ANSWER_LIMIT - len(self.answer)]

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.parser.get_status_code())


@contextlib.asynccontextmanager
async def protocol_httptools(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    from urllib.parse import urlsplit

    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    head = f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode("latin-1")
    idle: list[_HttpConnection] = []
    slots = asyncio.Semaphore(concurrency)
    every: list[_HttpConnection] = []

    async def send(i: int) -> int:
        body, headers = shape(i)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = b"".join((head, lines.encode("latin-1"), b"Content-Length: %d\r\n\r\n" % len(body), body))
        async with slots:
            connection = idle.pop() if idle else None
            if connection is None:
                _, connection = await loop.create_connection(_HttpConnection, host, port)
                every.append(connection)
            connection.answer.clear()
            connection.headers.clear()
            connection.waiter = waiter = loop.create_future()
            timer = loop.call_later(TIMEOUT, waiter.cancel)
            try:
                assert connection.transport is not None
                connection.transport.write(request)
                status = await waiter
            finally:
                timer.cancel()
            retry_after = next((v for n, v in connection.headers if n.lower() == b"retry-after"), None) \
                if status in RETRY_AFTER_STATUSES else None
            del retry_after
            if connection.keep_alive:
                idle.append(connection)
            elif connection.transport is not None:
                connection.transport.close()
            return status

    try:
        yield send
    finally:
        for connection in every:
            if connection.transport is not None:
                connection.transport.close()


@contextlib.asynccontextmanager
async def pycurl_transport(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    """Delivery's request path: ``CurlTransport``, made and called as ``delivery/sending/sender.py`` does."""
    # Importing the package loads Prefect (seconds of CPU): done here, before the warm-up and the measured requests.
    from prefect_webhooks.delivery.sending.transport import CurlTransport

    # The guard stays off, as by default: the receiver is on loopback.
    transport = CurlTransport(timeout=TIMEOUT, keepalive_seconds=30, connections=concurrency)
    try:
        async def send(i: int) -> int:
            body, headers = shape(i)
            answer = await transport.request("POST", url, body, headers)
            status = answer.status
            retry_after = answer.header(b"retry-after") if status in RETRY_AFTER_STATUSES else None
            del retry_after
            return status
        yield send
    finally:
        await transport.close()


def pyreqwest_client(concurrency: int, headers: dict[str, str] | None = None) -> Any:
    from pyreqwest.client import ClientBuilder

    builder = ClientBuilder() if headers is None else ClientBuilder().default_headers(headers)
    return (builder.max_connections(concurrency).http1_only().follow_redirects(False)
            .gzip(False).brotli(False).zstd(False).deflate(False).referer(False)
            .timeout(timedelta(seconds=TIMEOUT)).connect_timeout(timedelta(seconds=CONNECT_TIMEOUT))
            .pool_idle_timeout(timedelta(seconds=30)).build())


@contextlib.asynccontextmanager
async def pyreqwest_consumed(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    async with pyreqwest_client(concurrency) as client:
        async def send(i: int) -> int:
            body, headers = shape(i)
            response = await client.request("POST", url).headers(headers).body_bytes(body).build().send()
            status = response.status
            answer = await response.bytes()
            retry_after = response.get_header("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del answer, retry_after
            return status
        yield send


@contextlib.asynccontextmanager
async def pyreqwest_streamed(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    async with pyreqwest_client(concurrency) as client:
        async def send(i: int) -> int:
            body, headers = shape(i)
            async with client.request("POST", url).headers(headers).body_bytes(body).build_streamed() as response:
                status = response.status
                answer = await response.body_reader.read(ANSWER_LIMIT)
                retry_after = response.get_header("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del answer, retry_after
            return status
        yield send


@contextlib.asynccontextmanager
async def pyreqwest_lean(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    """As a layer with a client per endpoint would: the endpoint's fixed headers are the client's defaults, a
    request adds its signature and message id."""
    fixed = {"User-Agent": USER_AGENT, "Content-Type": "application/json", "X-Api-Key": "k-0123456789"}
    async with pyreqwest_client(concurrency, fixed) as client:
        async def send(i: int) -> int:
            body, headers = shape(i)
            request = (client.request("POST", url).header("X-Signature", headers["X-Signature"])
                       .header("Idempotency-Key", headers["Idempotency-Key"]).body_bytes(body).build_streamed())
            async with request as response:
                status = response.status
                answer = await response.body_reader.read(ANSWER_LIMIT)
                retry_after = response.get_header("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del answer, retry_after
            return status
        yield send


@contextlib.asynccontextmanager
async def curl_cffi_session(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    # Optional candidates, not dependencies: imported by name when installed.
    AsyncSession = importlib.import_module("curl_cffi.requests").AsyncSession  # noqa: N806

    async with AsyncSession(max_clients=concurrency, timeout=TIMEOUT, allow_redirects=False,
                            http_version="v1") as session:
        async def send(i: int) -> int:
            body, headers = shape(i)
            response = await session.request("POST", url, data=body, headers=headers)
            status = response.status_code
            retry_after = response.headers.get("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del retry_after
            return status
        yield send


@contextlib.asynccontextmanager
async def aiosonic_client(url: str, concurrency: int, shape: Callable) -> AsyncIterator[Send]:
    aiosonic = importlib.import_module("aiosonic")
    PoolConfig = importlib.import_module("aiosonic.pools").PoolConfig  # noqa: N806

    # A connection is kept for any number of requests (its default recycles one after 1,000).
    pool = PoolConfig(size=concurrency, max_conn_requests=None)
    client = aiosonic.HTTPClient(aiosonic.TCPConnector(pool_configs={":default": pool}))
    try:
        async def send(i: int) -> int:
            body, headers = shape(i)
            response = await client.post(url, data=body, headers=headers, follow=False,
                                         timeouts=aiosonic.Timeouts(request_timeout=TIMEOUT))
            status = response.status_code
            answer = await response.content()
            retry_after = response.headers.get("Retry-After") if status in RETRY_AFTER_STATUSES else None
            del answer, retry_after
            return status
        yield send
    finally:
        with contextlib.suppress(Exception):
            await client.shutdown()


CANDIDATES: dict[str, tuple[Callable[..., Any], str | None]] = {
    # name: (client, the module it needs: a candidate whose module is missing is skipped and said so)
    "shape-only": (shape_only, None),
    "aiohttp-session": (aiohttp_session, "aiohttp"),
    "aiohttp-request": (aiohttp_request, "aiohttp"),
    "protocol-httptools": (protocol_httptools, "httptools"),
    "pycurl-transport": (pycurl_transport, "pycurl"),
    "pyreqwest-consumed": (pyreqwest_consumed, "pyreqwest"),
    "pyreqwest-streamed": (pyreqwest_streamed, "pyreqwest"),
    "pyreqwest-lean": (pyreqwest_lean, "pyreqwest"),
    "curl-cffi": (curl_cffi_session, "curl_cffi"),
    "aiosonic": (aiosonic_client, "aiosonic"),
}
BASELINE = "aiohttp-session"
# Run only when named: far behind (curl-cffi, aiosonic), or variants that changed nothing (the module's docstring).
NOT_BY_DEFAULT = ("curl-cffi", "aiosonic", "pyreqwest-lean")


# ------------------------------------------------------------------------------------------------- one candidate


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


async def measure(name: str, url: str, count: int, warm_up: int, concurrency: int) -> dict[str, Any]:
    reference = reference_us()  # just before, in the same process: the machine's speed drifts within a round
    shape = shaper(make_bodies(warm_up + count))
    client, _ = CANDIDATES[name]
    async with client(url, concurrency, shape) as send:
        bad = await drive(send, 0, warm_up, concurrency)
        threads = threads_now()
        before, cpu, started = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        loop_cpu = time.thread_time()
        bad += await drive(send, warm_up, count, concurrency)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        loop_cpu = time.thread_time() - loop_cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
        threads = max(threads, threads_now())
    if bad:
        raise SystemExit(f"{name}: {len(bad)} answers were not 200, e.g. {bad[:5]}")
    return {"rate": count / wall, "cpu_us": cpu * 1e6 / count, "loop_us": loop_cpu * 1e6 / count,
            "reference_us": reference,
            "user_us": (after.ru_utime - before.ru_utime) * 1e6 / count,
            "sys_us": (after.ru_stime - before.ru_stime) * 1e6 / count, "threads": threads}


def child(args: argparse.Namespace) -> None:
    coroutine = measure(args.child, args.url, args.requests, args.warm_up, args.concurrency)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(coroutine)
    else:
        result = asyncio.run(coroutine)
    print(json.dumps(result))


def run_child(name: str, loop: str, url: str, args: argparse.Namespace) -> dict[str, Any] | str:
    command = [sys.executable, __file__, "--child", name, "--loop", loop, "--url", url, "--requests",
               str(args.requests), "--warm-up", str(args.warm_up), "--concurrency", str(args.concurrency)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------- the run


def reference_us() -> float:
    text = cpu_reference()
    found = re.search(r"([\d.]+) µs", text)
    assert found, text
    return float(found.group(1))


def available(names: list[str]) -> tuple[list[str], list[str]]:
    import importlib.util

    ok: list[str] = []
    missing: list[str] = []
    for name in names:
        module = CANDIDATES[name][1]
        (ok if module is None or importlib.util.find_spec(module) is not None else missing).append(name)
    return ok, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--warm-up", type=int, default=None, help="requests before the measured ones (N/10)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--loops", nargs="+", choices=("uvloop", "asyncio"), default=["uvloop"])
    parser.add_argument("--candidates", nargs="+", choices=list(CANDIDATES),
                        default=[name for name in CANDIDATES if name not in NOT_BY_DEFAULT])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=18941)
    parser.add_argument("--quick", action="store_true", help="200 requests, one round: does every candidate run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="uvloop", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 200, 1
    if args.warm_up is None:
        args.warm_up = max(args.requests // 10, 100)
    if args.child:
        child(args)
        return

    from bench_delivery import Sink

    names, missing = available(args.candidates)
    results: dict[tuple[str, str], list[dict[str, Any] | str]] = {}
    with Sink(args.port) as sink:
        print(f"receiver: {sink.kind} on {sink.url}; {args.requests:,} requests per candidate and round after "
              f"{args.warm_up:,} to warm up, {args.concurrency} in flight; {os.cpu_count()} cores; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        if missing:
            print(f"skipped, not installed: {', '.join(missing)}")
        for number in range(args.rounds):
            order = names if number % 2 == 0 else names[::-1]
            print(f"round {number + 1}: {cpu_reference()}", flush=True)
            for loop in args.loops:
                for name in order:
                    result = run_child(name, loop, sink.url, args)
                    results.setdefault((name, loop), []).append(result)
                    print(f"  {name:20s} {loop:8s} {describe(result)}", flush=True)
    print()
    report(names, args.loops, results, args.rounds)


def describe(result: dict[str, Any] | str) -> str:
    if isinstance(result, str):
        return f"failed: {result}"
    reference = result["reference_us"]
    return (f"{result['rate']:7.0f} req/s  {result['cpu_us']:6.1f} µs CPU/request ({result['user_us']:.1f} user + "
            f"{result['sys_us']:.1f} sys; event loop's thread {result['loop_us']:.1f}) = "
            f"{result['cpu_us'] / reference:5.2f} refs (reference {reference:.1f} µs)  {result['threads']} threads")


def report(names: list[str], loops: list[str], results: dict[tuple[str, str], list[dict[str, Any] | str]],
           rounds: int) -> None:
    """One line per candidate and loop: per round req/s, CPU µs per request (the process; its event loop's thread
    alone), in CPU references (each measured by the candidate's process just before), and against ``BASELINE`` in
    the same round and loop."""
    references = [result["reference_us"] for runs in results.values() for result in runs if isinstance(result, dict)]
    header = "".join(f" | round {number + 1}: {'req/s':>6s} {'µs CPU':>7s} {'(loop)':>7s} {'refs':>5s} "
                     f"{'x ' + BASELINE:>21s}" for number in range(rounds))
    print(f"{'candidate':20s} {'loop':7s}{header}")
    for loop in loops:
        for name in names:
            cells = []
            for number, result in enumerate(results[(name, loop)]):
                base = results.get((BASELINE, loop), [None] * rounds)[number]
                if isinstance(result, str):
                    cells.append(f" | {'failed':61s}")
                    continue
                ratio = f"{result['cpu_us'] / base['cpu_us']:.2f}" if isinstance(base, dict) else "-"
                cells.append(f" | {'':9s}{result['rate']:6.0f} {result['cpu_us']:7.1f} {result['loop_us']:7.1f} "
                             f"{result['cpu_us'] / result['reference_us']:5.2f} {ratio:>21s}")
            print(f"{name:20s} {loop:7s}{''.join(cells)}")
    if references:
        print(f"CPU reference sum(range(1000)), measured by each candidate's process: {min(references):.1f}-"
              f"{max(references):.1f} µs")
    print(f"median over the rounds, against {BASELINE} in the same round: CPU of the process / of its event loop's "
          "thread; req/s")
    for loop in loops:
        for name in names:
            bases = results.get((BASELINE, loop), [])
            pairs = [(result, base) for result, base in zip(results[(name, loop)], bases, strict=False)
                     if isinstance(result, dict) and isinstance(base, dict)]
            if pairs:
                process = statistics.median(result["cpu_us"] / base["cpu_us"] for result, base in pairs)
                thread = statistics.median(result["loop_us"] / base["loop_us"] for result, base in pairs)
                rate = statistics.median(result["rate"] / base["rate"] for result, base in pairs)
                print(f"  {name:20s} {loop:7s} {process:5.2f}x / {thread:5.2f}x; {rate:5.2f}x")


if __name__ == "__main__":
    main()
