"""Shared pieces of the fault and scale-out tests: delivery worker processes and the end-of-test accounting.

``worker_main`` is the body of a delivery worker process (``python -c "from tests.faults import worker_main;
worker_main()"``): it delivers from the store in ``PREFECT_WEBHOOKS_DATABASE_URL`` to destinations given as JSON in
``WORKER_DESTINATIONS`` (``{name: [url, ...]}`` or ``{name: {block fields}}``, unsaved blocks, so no Prefect
server is needed; ``{name: []}`` loads the saved block ``name`` from the Prefect API in ``PREFECT_API_URL``) with
``deliver_due`` in continuous mode, and prints its stats as one JSON line. Workers started with ``start_workers``
wait for each other before their first claim: a slow interpreter start does not leave one of them nothing to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.store.engine.engines import get_engine

ROOT = Path(__file__).resolve().parents[2]
WORKER_CODE = "from tests.faults import worker_main; worker_main()"


def worker_main() -> None:
    """Deliver until nothing is due for a while (``WORKER_RUN_SECONDS`` at most), then print the stats."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
    from prefect_webhooks.delivery.pacing.context import store_call
    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.queue.outbox import claim_due_deliveries

    destinations = json.loads(os.environ["WORKER_DESTINATIONS"])
    run_seconds = float(os.environ.get("WORKER_RUN_SECONDS", "60"))
    until_empty = os.environ.get("WORKER_UNTIL_EMPTY", "1") == "1"

    async def run() -> dict[str, Any]:
        settings = get_settings()
        async with Sender(settings) as sender:
            context = DeliveryContext(get_engine(), sender, settings=settings)
            for name, urls in destinations.items():
                if urls:
                    # A list of URLs, or the block's fields (``{"endpoints": [...], "ordered": true}``).
                    fields = urls if isinstance(urls, dict) else {"endpoints": [{"url": url} for url in urls]}
                    context.destinations.remember(name, WebhookDestination(**fields))
            options = DeliveryOptions(run_for_seconds=run_seconds, until_empty=until_empty, idle_sleep=0.1)
            if os.environ.get("WORKER_START_BARRIER"):
                # Warm what a first claim pays once (the store's connection, the statement's compilation, the
                # thread pool), so the workers' first claims leave the barrier together: cold, one came 57 ms after
                # the other, time enough for the first to lease every user's run.
                await store_call(settings, claim_due_deliveries, context.engine, 0, context.owner)
            _wait_for_the_others()
            stats = await deliver_due(options, context=context)
            return {"owner": context.owner, **stats.summary()}

    print(json.dumps(asyncio.run(run())), flush=True)


def _wait_for_the_others() -> None:
    """Under ``start_workers``, say this worker is ready and wait (60 s at most) until all of them are."""
    barrier = os.environ.get("WORKER_START_BARRIER")
    if not barrier:
        return
    Path(barrier, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < int(os.environ["WORKER_START_COUNT"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other workers did not start: {os.listdir(barrier)} ready")
        time.sleep(0.01)


def start_workers(count: int, barrier: Path, store_url: str, destinations: dict[str, Any], *, run_seconds: float,
                  until_empty: bool, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """Start ``count`` delivery workers (as ``start_worker``) that make their first claim together; each says it is
    ready in a new folder under ``barrier`` (its own, so that nothing else there, a SQLite store, counts as ready)."""
    ready = barrier / "workers-ready"
    ready.mkdir()
    env = {**env, "WORKER_START_BARRIER": str(ready), "WORKER_START_COUNT": str(count)}
    return [start_worker(store_url, destinations, run_seconds=run_seconds, until_empty=until_empty, env=env)
            for _ in range(count)]


def start_worker(store_url: str, destinations: dict[str, Any], *, run_seconds: float = 60.0,
                 until_empty: bool = True, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a delivery worker process (see ``worker_main``)."""
    child_env = {
        **os.environ,
        "PREFECT_WEBHOOKS_DATABASE_URL": store_url,
        "WORKER_DESTINATIONS": json.dumps(destinations),
        "WORKER_RUN_SECONDS": str(run_seconds),
        "WORKER_UNTIL_EMPTY": "1" if until_empty else "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    return subprocess.Popen([sys.executable, "-c", WORKER_CODE], env=child_env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def worker_result(process: subprocess.Popen[str], timeout: float = 90.0) -> dict[str, Any]:
    """Wait for a worker and return its printed stats."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"worker exited {process.returncode}: {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def received_ids(requests: list[Any], field_name: str = "messageId") -> Counter[str]:
    """How many times the receiver got each message (by the ``messageId`` (or ``field_name``) in the body)."""
    counts: Counter[str] = Counter()
    for request in requests:
        counts[str(orjson.loads(request.body)["properties"][field_name])] += 1
    return counts


@dataclass
class Accounting:
    """Sent = delivered + failed (with reason), nothing lost, duplicates caused by the fault."""

    sent: int
    delivered: int
    failed: int
    pending: int
    failed_reasons: Counter[str] = field(default_factory=Counter)
    received_unique: int = 0
    duplicates: int = 0

    def report(self, title: str) -> str:
        """A printable summary (shown with ``pytest -s`` and in failure output)."""
        reasons = ", ".join(f"{count}× {reason}" for reason, count in self.failed_reasons.most_common(5)) or "none"
        return (f"[{title}] sent={self.sent} delivered={self.delivered} failed={self.failed} (reasons: {reasons}) "
                f"pending={self.pending} received unique={self.received_unique} duplicates={self.duplicates}")


def accounting(sent: int, received: Counter[str] | None = None, url: str | None = None) -> Accounting:
    """Count the outbox by state (and the receiver's copies when given)."""
    from tests.stored import every_message

    messages = every_message(get_engine(url))
    states = Counter(message.state for message in messages)
    reasons = Counter(message.reason for message in messages if message.state == FAILED)
    result = Accounting(sent=sent, delivered=states.get(DELIVERED, 0), failed=states.get(FAILED, 0),
                        pending=states.get(PENDING, 0), failed_reasons=reasons)
    if received is not None:
        result.received_unique = len(received)
        result.duplicates = sum(count - 1 for count in received.values())
    return result
