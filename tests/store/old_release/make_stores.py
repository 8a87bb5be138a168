"""Writes the stores of the release of 2026-11-25 (commit 4004622) that ``test_old_release`` opens, with that
release's own code: its ingest API takes the calls, its delivery engine sends them to a receiver on 127.0.0.1, and
what it left in the store is dumped as SQL (``store-2026-11-25.sqlite.sql``, ``store-2026-11-25.postgresql.sql``).

Run it from this repository with the release's code first on the path (a clean clone has no such worktree, which
is why the dumps are committed)::

    git worktree add --detach /tmp/release-2026-11-25 4004622
    PYTHONPATH=/tmp/release-2026-11-25 .venv/bin/python tests/store/old_release/make_stores.py \\
        --postgres postgresql://postgres@127.0.0.1:55432/webhooks_test

What the store holds: 20 calls from source ``web`` (one of them sent twice, so deduplicated) for three
destinations: ``crm`` delivers (two messages dropped by its filter rule), ``legacy`` answers 400 (failed for good),
``flaky`` answers 503 (pending, one attempt, due again later); then 4 more calls, never attempted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RELEASE = "2026-11-25"
WRITE_KEY = "wk_release_2026_11_25"
ANSWERS = {"/ok": (200, b"ok"), "/refuse": (400, b"no such customer"), "/busy": (503, b"try later")}


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = ANSWERS[self.path]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def _calls(first: int, count: int) -> list[dict[str, Any]]:
    return [{"type": "track", "userId": f"u{n % 4}", "event": "Debug" if n in (3, 7) else "Order Completed",
             "messageId": f"release-{n}", "properties": {"n": n}} for n in range(first, first + count)]


async def _write_store(receiver: str) -> None:
    import httpx

    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.source import Source
    from prefect_webhooks.delivery import DeliveryOptions, deliver_due
    from prefect_webhooks.inbound.api import create_app

    rule = {"name": "no debug", "action": "drop", "events": ["Debug"]}
    for name, path, filters in (("crm", "/ok", [rule]), ("legacy", "/refuse", []), ("flaky", "/busy", [])):
        await WebhookDestination(endpoints=[{"url": receiver + path}], shared_secret="whsec_release_2026_11_25",
                                 filters=filters).save(name, overwrite=True)
    await Source(write_key=WRITE_KEY, destinations=["crm", "legacy", "flaky"]).save("web", overwrite=True)
    app = create_app()
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingest", auth=(WRITE_KEY, "")) as client:
        for batch in (_calls(1, 20), _calls(5, 1)):  # release-5 twice: the second is deduplicated
            answer = await client.post("/v1/batch", json={"batch": batch})
            assert answer.status_code == 200, answer.text
        await deliver_due(DeliveryOptions())
        answer = await client.post("/v1/batch", json={"batch": _calls(21, 4)})
        assert answer.status_code == 200, answer.text


def _run_release(url: str) -> None:
    os.environ["PREFECT_WEBHOOKS_DATABASE_URL"] = url
    from prefect.testing.utilities import prefect_test_harness

    from prefect_webhooks.settings import get_settings
    from prefect_webhooks.store.engines import dispose_engines  # the release's path (store/ was flat then)

    get_settings.cache_clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with prefect_test_harness(server_startup_timeout=120):
            asyncio.run(_write_store(f"http://127.0.0.1:{server.server_port}"))
    finally:
        server.shutdown()
        dispose_engines()


def _release_code() -> Path:
    """The release's checkout this process imports; refuses to run with any other code."""
    import prefect_webhooks

    root = Path(prefect_webhooks.__file__).resolve().parents[1]
    # Any later code has the message log: store/message_log.py, then store/log/message_log.py.
    if any((root / "prefect_webhooks/store" / path).exists() for path in ("message_log.py", "log/message_log.py")):
        sys.exit(f"make_stores: {root} is not the release of {RELEASE} (it has the message log); put a worktree of "
                 "4004622 first on PYTHONPATH")
    return root


def _dump_sqlite(workdir: Path) -> str:
    path = workdir / "store.db"
    _run_release(f"sqlite:///{path}")
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return "\n".join(connection.iterdump()) + "\n"


def _dump_postgres(server: str) -> str:
    import psycopg

    name = f"release_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = server.rsplit("/", 1)[0] + f"/{name}"
    try:
        _run_release(url)
        dump = subprocess.run(["pg_dump", "--no-owner", "--no-privileges", "--column-inserts", "--dbname", url],
                              check=True, capture_output=True, text=True).stdout
    finally:
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    # psql's meta-commands (\restrict of newer pg_dumps) and comments are not SQL a driver runs.
    return "".join(line for line in dump.splitlines(keepends=True)
                   if not line.startswith(("\\", "--")) and not re.fullmatch(r"\s*", line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="A PostgreSQL server URL; a database is made there and dropped after.")
    args = parser.parse_args()
    root = _release_code()
    header = f"-- A store written by prefect-webhooks {RELEASE} (4004622), made by {Path(__file__).name}.\n"
    with tempfile.TemporaryDirectory() as workdir:
        os.environ["PREFECT_WEBHOOKS_HOME"] = workdir
        (HERE / f"store-{RELEASE}.sqlite.sql").write_text(header + _dump_sqlite(Path(workdir)), encoding="utf-8")
    if args.postgres:
        (HERE / f"store-{RELEASE}.postgresql.sql").write_text(header + _dump_postgres(args.postgres), encoding="utf-8")
    loaded = {module.__file__ for module in list(sys.modules.values())
              if module.__name__.startswith("prefect_webhooks") and getattr(module, "__file__", None)}
    strays = sorted(path for path in loaded if not Path(path).resolve().is_relative_to(root))
    if strays:
        sys.exit(f"make_stores: modules of another checkout were imported: {strays}")


if __name__ == "__main__":
    main()
