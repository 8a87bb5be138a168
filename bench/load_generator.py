"""The load generator the capacity and soak benchmarks send with, in a process of its own.

Open loop (``rate``): a batch of ``batch`` calls every ``batch / rate`` seconds whatever the answers, the way a
fleet of SDKs sends; closed loop (``concurrency``): that many senders back to back. Each call is stamped with the
time it was sent (``bench_sent``), so the receiver can time it end to end. ``start_generator(spec)`` runs
``python bench/load_generator.py SPEC_JSON``; ``finish_generator`` returns what it printed: CPU, sent, accepted,
refused, errors, the generator's own lag, the answers by status, and the acknowledgement times.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def make_batch(run: str, step: int, first: int, count: int, sent: float) -> bytes:
    """A ``/v1/batch`` body of ``count`` track calls numbered from ``first``, stamped with ``sent``.

    Shaped like an SDK's batch: each call with its own ``timestamp`` and ``messageId``, the batch with ``sentAt``.
    """
    import orjson

    def stamp(at: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"

    calls = [
        {
            "type": "track",
            "userId": f"user-{seq % 50_000}",
            "event": "Order Completed",
            "messageId": f"{run}-{step}-{seq}",
            # The calls of a batch were made over the last moments, a millisecond apart.
            "timestamp": stamp(sent - (first + count - seq) / 1000),
            "properties": {"bench_step": step, "bench_seq": seq, "bench_sent": sent, "revenue": 19.99,
                           "currency": "EUR", "sku": "A-1"},
            "context": {"ip": "10.0.0.1", "library": {"name": "analytics-python", "version": "2.3.4"}},
        }
        for seq in range(first, first + count)
    ]
    return orjson.dumps({"batch": calls, "sentAt": stamp(sent)})


async def _generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Open loop (``rate``): a batch every ``batch / rate`` s. Closed loop (``concurrency``): back to back."""
    import aiohttp

    url, batch, seconds, step = spec["url"], spec["batch"], spec["seconds"], spec["step"]
    headers = {"Authorization": spec["auth"], "Content-Type": "application/json"}
    accepted = refused = errors = 0
    acks: list[float] = []
    lag = 0.0

    unacknowledged: list[int] = []  # the first number of each batch not answered 200
    answers: dict[str, int] = {}
    # With ``answer_times`` (a file's path): each batch's first number -> [sent, answered (wall clock), status or
    # error], written there as JSON, to time a fault's gap (the failover tests: the first 200 after the primary
    # stopped). A file, not standard output: a stream's 2,400 entries are over 128 KiB, and the result line printed
    # that long came back cut at 131,072 characters.
    answered: dict[int, list[Any]] | None = {} if spec.get("answer_times") else None

    async def post(session: aiohttp.ClientSession, body: bytes, first: int = -1) -> None:
        nonlocal accepted, refused, errors
        started = time.monotonic()
        sent_at = time.time()
        outcome: int | str = "none"
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                outcome = response.status
                answers[str(response.status)] = answers.get(str(response.status), 0) + 1
                if response.status == 200:
                    accepted += batch
                    acks.append(time.monotonic() - started)
                else:
                    refused += batch
                    unacknowledged.append(first)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            outcome = type(exc).__name__
            answers[type(exc).__name__] = answers.get(type(exc).__name__, 0) + 1
            errors += batch
            unacknowledged.append(first)
        if answered is not None:
            answered[first] = [sent_at, time.time(), outcome]

    connector = aiohttp.TCPConnector(limit=spec.get("connections", 256))
    timeout = aiohttp.ClientTimeout(total=spec.get("timeout", 300))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started_wall = time.time()
        start = time.monotonic() + 0.05
        if spec.get("rate"):
            interval = batch / spec["rate"]
            tasks = []
            number = 0
            while number * interval < seconds:
                delay = start + number * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    lag = max(lag, -delay)
                first = spec["first"] + number * batch
                body = make_batch(spec["run"], step, first, batch, time.time())
                tasks.append(asyncio.ensure_future(post(session, body, first)))
                number += 1
            sent = number * batch
            await asyncio.gather(*tasks)
        else:
            counter = [0]

            async def worker() -> None:
                while time.monotonic() < start + seconds:
                    first = spec["first"] + counter[0] * batch
                    counter[0] += 1
                    await post(session, make_batch(spec["run"], step, first, batch, time.time()))

            await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
            sent = counter[0] * batch
        ended_wall = time.time()
    acks.sort()
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    if answered is not None:
        with open(spec["answer_times"], "w") as answer_times:
            json.dump(answered, answer_times)
    return {"cpu": usage.ru_utime + usage.ru_stime, "sent": sent, "accepted": accepted, "refused": refused,
            "errors": errors, "lag": lag, "answers": answers, "unacknowledged": sorted(unacknowledged),
            "started": started_wall, "ended": ended_wall,
            "ack_p50": acks[len(acks) // 2] if acks else None,
            "ack_p99": acks[min(len(acks) - 1, int(len(acks) * 0.99))] if acks else None}


def generator_main(spec_json: str) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_generate(json.loads(spec_json)))), flush=True)


def start_generator(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, json.dumps(spec)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)


def finish_generator(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.wait(10)
        raise
    if process.returncode != 0:
        raise RuntimeError(f"load generator exited with {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])



if __name__ == "__main__":
    generator_main(sys.argv[1])
