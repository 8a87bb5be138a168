"""Ordered delivery through transient failures: how long an ordered destination takes to drain against an unordered
one, the same messages, when about 10 % of first attempts are answered 503.

    .venv/bin/python bench/bench_ordered_retries.py [--users 200] [--per-user 20] [--fail-share 0.1]

A receiver in this process (aiohttp, its own thread) answers ``503`` to the first attempt of the messages it picks
(``--fail-share`` of them, the same ones in every run) and ``200`` otherwise, and records when each message first
arrived in full (its last, successful attempt). The Prefect ``deliver`` flow runs continuously (as ``serve`` runs
it) on a temporary Prefect server, with a retry base delay of 1 s, for an unordered and an ordered destination in
turn, alternating, twice each, each on a fresh SQLite store. It prints, per run, the drain time (from the flow's
start to the last message's 200), the ordered / unordered ratio of the best of each (the issue's target is 2x), and
the floor ordered delivery has here: the unluckiest user's retries, which come one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class FlakyReceiver:
    """Answers 503 to the first attempt of about ``share`` of the messages, 200 otherwise; notes each 200."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.seen: set[bytes] = set()
        self.delivered: dict[tuple[str, int], float] = {}
        self.out_of_order = 0
        self.refused: dict[str, int] = {}
        self.refused_at: dict[tuple[str, int], float] = {}
        self.first_request: dict[str, float] = {}
        self.last_seq: dict[str, int] = {}
        self.url = ""
        self._ready = threading.Event()

    def __enter__(self) -> FlakyReceiver:
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        import orjson
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            message = orjson.loads(body)
            user, seq = message["userId"], message["properties"]["seq"]
            key = f"{user}:{seq}".encode()
            self.first_request.setdefault(user, time.monotonic())
            if key not in self.seen and zlib.crc32(key) % 1000 < self.share * 1000:
                self.seen.add(key)
                self.refused[user] = self.refused.get(user, 0) + 1
                self.refused_at[user, seq] = time.monotonic()
                return web.Response(status=503)
            self.seen.add(key)
            if (user, seq) not in self.delivered:
                self.delivered[user, seq] = time.monotonic()
                if seq < self.last_seq.get(user, -1):
                    self.out_of_order += 1
                self.last_seq[user] = max(seq, self.last_seq.get(user, -1))
            return web.Response(text="ok")

        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/hook", handle)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()


async def drain(folder: Path, name: str, ordered: bool, users: int, per_user: int, share: float,
                limit: float) -> tuple[float | None, int, int, int, str]:
    """One run: seconds to deliver every message (None: not within ``limit``), how many arrived, out of order, the
    most first attempts refused to one user, and that user's timeline (its floor)."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.flows.deliver import deliver
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.queue.outbox import enqueue

    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = f"sqlite:///{folder / (name + '.db')}"
    get_settings.cache_clear()
    total = users * per_user
    with FlakyReceiver(share) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], ordered=ordered).save(name, overwrite=True)
        for seq in range(per_user):  # each user's messages accepted one after another, as a client sends them
            enqueue(name, [{"version": 1, "type": "track", "userId": f"user-{user}", "event": "E",
                            "timestamp": "2026-01-01T00:00:00.000Z", "properties": {"seq": seq}}
                           for user in range(users)])
        started = time.monotonic()
        # The flow's own idle spacing between claims, as ``serve`` runs it (0.3 s).
        running = asyncio.ensure_future(deliver(destination=name, run_for_seconds=limit))
        while len(receiver.delivered) < total and not running.done():
            await asyncio.sleep(0.05)
        drained = max(receiver.delivered.values()) - started if len(receiver.delivered) == total else None
        # Drained: the rest of the run's ``limit`` would measure nothing.
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        return (drained, len(receiver.delivered), receiver.out_of_order, max(receiver.refused.values(), default=0),
                unluckiest_timeline(receiver, started))


def unluckiest_timeline(receiver: FlakyReceiver, started: float) -> str:
    """When the user with the most refused first attempts was first sent to, how long its retries waited (each from
    its 503 to its 200: the backoff as drawn, and how late the claim came), and when its last message arrived."""
    if not receiver.refused:
        return "no first attempt refused"
    user = max(receiver.refused, key=lambda name: receiver.refused[name])
    waits = [receiver.delivered[key] - at for key, at in receiver.refused_at.items() if key[0] == user
             and key in receiver.delivered]
    last = max(at for (name, _), at in receiver.delivered.items() if name == user)
    return (f"{user}: first request at {receiver.first_request[user] - started:.2f} s, {len(waits)} retries waited "
            f"{sum(waits):.2f} s in all ({', '.join(f'{wait:.2f}' for wait in waits)} s), last message at "
            f"{last - started:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--per-user", type=int, default=20)
    parser.add_argument("--fail-share", type=float, default=0.1, help="share of first attempts answered 503")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds each continuous run lasts at most")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ["PREFECT_WEBHOOKS_RETRY_BASE_DELAY"] = "1"
    # The temporary server's telemetry heartbeat writes its own SQLite while the runs load the machine, and logs a
    # "database is locked" traceback of its own when that write loses.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as folder, prefect_test_harness(server_startup_timeout=120):
        for round_number in range(args.rounds):
            for ordered in (False, True):
                label = "ordered" if ordered else "unordered"
                drained, arrived, disorder, most_refused, timeline = asyncio.run(drain(
                    Path(folder), f"{label}-{round_number}", ordered, args.users, args.per_user, args.fail_share,
                    args.limit))
                shown = f"{drained:.1f} s" if drained is not None else f"not drained in {args.limit:g} s"
                print(f"{label:9s} run {round_number + 1}: {args.users * args.per_user:,} messages of {args.users} "
                      f"users, ~{args.fail_share:.0%} of first attempts 503: {shown} ({arrived:,} delivered, "
                      f"{disorder} out of a user's order)")
                if ordered:
                    print(f"          the unluckiest user, {timeline}")
                if drained is not None:
                    times[ordered].append(drained)
    # A user's messages go one after another: each refused first attempt makes the user's later ones wait for its
    # retry (retry_base_delay 1 s, +-20 % jitter), so ordered delivery cannot drain before the unluckiest user's
    # retries have all come due, one after another; unordered delivery waits for one retry delay only.
    print(f"the unluckiest user had {most_refused} of its {args.per_user} first attempts refused: ordered delivery "
          f"cannot drain sooner than ~{most_refused} x 1 s of retry delays after the first send")
    if times[False] and times[True]:
        best = {ordered: min(values) for ordered, values in times.items()}
        print(f"ordered / unordered drain (best of {args.rounds} each): {best[True]:.1f} s / {best[False]:.1f} s = "
              f"{best[True] / best[False]:.2f}x (target: at most 2x); medians "
              f"{statistics.median(times[True]):.1f} s / {statistics.median(times[False]):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
