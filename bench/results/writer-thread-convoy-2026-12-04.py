"""The ingest API's group commit on PostgreSQL, on the event loop or in a thread, with the loop busy or not.

A record of the measurement that kept the writer on the loop (bench/README.md, "The PostgreSQL group commit in a
thread"). It needs ``BatchWriter(off_loop=...)``, which only commit 8066304 had: run it in a worktree of that commit.

    PREFECT_WEBHOOKS_TEST_POSTGRES_URL=$(scripts/test-postgres start 55432) SWITCH=0.005 python this-file

Eight clients submit batches of 100 calls for 8 s; with ``busy`` a coroutine spends 2 ms of CPU at a time on the loop
between awaits, as request parsing does on a saturated host. Printed: messages committed a second.
"""
import asyncio
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import uuid

import psycopg

from prefect_webhooks.inbound.batch_writer import BatchWriter
from prefect_webhooks.inbound.ingestion import prepare_batch
from prefect_webhooks.store.engine.engines import get_engine
from tests.inbound.test_ingestion import SOURCE, track

server = os.environ["PREFECT_WEBHOOKS_TEST_POSTGRES_URL"]

def fresh():
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return server.rsplit("/", 1)[0] + f"/{name}"

async def run(off_loop, busy, seconds=8.0):
    engine = get_engine(fresh())
    writer = BatchWriter(engine, off_loop=off_loop)
    stop = False
    async def burner():
        while not stop:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.002:
                pass
            await asyncio.sleep(0)
    async def client(k):
        n = 0
        while not stop:
            await writer.submit(prepare_batch([track(f"{k}-{n}-{j}") for j in range(100)], SOURCE))
            n += 1
    burners = [asyncio.ensure_future(burner()) for _ in range(busy)]
    done0 = writer._written
    clients = [asyncio.ensure_future(client(k)) for k in range(8)]
    await asyncio.sleep(seconds)
    written = writer._written - done0
    stop = True
    await asyncio.gather(*clients, *burners)
    await writer.stop()
    print(f"off_loop={off_loop} busy={busy}: {written/seconds:,.0f} messages/s committed")

sys.setswitchinterval(float(os.environ.get("SWITCH", "0.005")))
for busy in (0, 1):
    for off in (False, True, False, True):
        asyncio.run(run(off, busy))
