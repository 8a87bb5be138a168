"""A webhook receiver for benchmarks that records when each message arrives, in its own process.

    python bench/recorder.py PORT [HOST]

It answers ``200 ok`` to every POST and reads two numbers the load generator put in each message's
``properties``: ``bench_seq`` (the event's number in its step) and ``bench_sent`` (the Unix time the generator
sent it). Per step (``bench_step``) it keeps the arrival delays, a bitmap of the numbers seen (so duplicates and
missing messages are counted), and per second of arrival the count and the longest delay. ``GET /_stats/<step>``
answers those figures as JSON. ``GET /_fail/<seconds>`` makes it answer ``503`` to every POST for that long (an
outage of the receiver: ``bench_capacity.py --receiver-outage``), recording nothing meanwhile.

With ``RECORDER_ARRIVALS=1`` it also keeps every POST's arrival, ``[seq, sender's address, time, status]``, answered
by ``GET /_arrivals/<step>`` (the several-hosts tests tell which host sent what, and when a retry came);
``GET /_fail_first/<n>`` makes it answer ``500`` to the first arrival of every message whose number is a multiple of
``n`` (a retry to time), from then on.

It is a bare HTTP/1.1 server (uvloop + httptools, keep-alive, no framework) so that it costs the shared CPU as
little as a receiver can while still looking inside each body: nginx costs less but cannot time arrivals.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from array import array

import httptools

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
_FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
FAILING_UNTIL = [0.0]


def _number(body: bytes, key: bytes) -> float | None:
    """The JSON number following ``"key":`` in ``body`` (no full parse: the receiver must stay cheap)."""
    start = body.find(key)
    if start < 0:
        return None
    start += len(key)
    end = start
    while end < len(body) and body[end] in b"0123456789.-eE+ ":
        end += 1
    try:
        return float(body[start:end])
    except ValueError:
        return None


class Step:
    """What arrived for one step of the load."""

    def __init__(self) -> None:
        self.delays = array("d")
        self.seen = bytearray()
        self.duplicates = 0
        self.per_second: dict[int, int] = {}
        self.worst_per_second: dict[int, float] = {}
        self.first = 0.0
        self.last = 0.0

    def add(self, seq: int, sent: float, now: float) -> None:
        if seq >= len(self.seen) * 8:
            self.seen.extend(bytes(max(seq // 8 + 1 - len(self.seen), len(self.seen))))
        byte, bit = divmod(seq, 8)
        if self.seen[byte] & (1 << bit):
            self.duplicates += 1
            return
        self.seen[byte] |= 1 << bit
        delay = now - sent
        self.delays.append(delay)
        second = int(now)
        self.per_second[second] = self.per_second.get(second, 0) + 1
        if delay > self.worst_per_second.get(second, 0.0):
            self.worst_per_second[second] = delay
        self.first = self.first or now
        self.last = now

    def stats(self) -> dict:
        delays = sorted(self.delays)
        count = len(delays)

        def quantile(fraction: float) -> float | None:
            return delays[min(count - 1, int(count * fraction))] if count else None

        return {
            "distinct": count,
            "duplicates": self.duplicates,
            "p50": quantile(0.50),
            "p99": quantile(0.99),
            "max": delays[-1] if count else None,
            "first": self.first,
            "last": self.last,
            "per_second": self.per_second,
            "worst_per_second": self.worst_per_second,
        }


STEPS: dict[int, Step] = {}
UNTAGGED = [0]
ARRIVALS: dict[int, list[tuple[int, str, float, int]]] | None = {} if os.environ.get("RECORDER_ARRIVALS") else None
FAIL_FIRST = [0]
FAILED_ONCE: set[tuple[int, int]] = set()


def record(body: bytes, peer: str = "") -> bytes:
    """Count one POST; returns the answer to give."""
    now = time.time()
    step, seq, sent = _number(body, b'"bench_step":'), _number(body, b'"bench_seq":'), _number(body, b'"bench_sent":')
    if step is None or seq is None or sent is None:
        UNTAGGED[0] += 1
        return _OK
    answer = _OK
    if FAIL_FIRST[0] and int(seq) % FAIL_FIRST[0] == 0 and (int(step), int(seq)) not in FAILED_ONCE:
        FAILED_ONCE.add((int(step), int(seq)))
        answer = _FAILED
    else:
        STEPS.setdefault(int(step), Step()).add(int(seq), sent, now)
    if ARRIVALS is not None:
        ARRIVALS.setdefault(int(step), []).append((int(seq), peer, now, 500 if answer is _FAILED else 200))
    return answer


class Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.url = b""
        self.transport: asyncio.Transport | None = None
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = (transport.get_extra_info("peername") or ("",))[0]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        method = self.parser.get_method()
        if method == b"GET" and self.url.startswith(b"/_stats/"):
            step = STEPS.get(int(self.url.rsplit(b"/", 1)[1]), Step())
            payload = json.dumps({**step.stats(), "untagged": UNTAGGED[0]}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        elif method == b"GET" and self.url.startswith(b"/_arrivals/"):
            listed = (ARRIVALS or {}).get(int(self.url.rsplit(b"/", 1)[1]), [])
            payload = json.dumps(listed).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        elif method == b"GET" and self.url.startswith(b"/_fail_first/"):
            FAIL_FIRST[0] = int(self.url.rsplit(b"/", 1)[1])
            self.transport.write(_OK)
        elif method == b"GET" and self.url.startswith(b"/_fail/"):
            FAILING_UNTIL[0] = time.time() + float(self.url.rsplit(b"/", 1)[1])
            self.transport.write(_OK)
        elif method == b"POST" and time.time() < FAILING_UNTIL[0]:
            self.transport.write(_UNAVAILABLE)
        elif method == b"POST":
            self.transport.write(record(b"".join(self.body), self.peer))
        else:
            self.transport.write(_NOT_FOUND)
        self.body = []
        self.url = b""
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(port: int, host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Protocol, host, port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import uvloop

    uvloop.run(serve(int(sys.argv[1]), *sys.argv[2:3]))
