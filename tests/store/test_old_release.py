"""Every command that opens a store, on a store the release of 2026-11-25 (4004622) wrote, on SQLite and PostgreSQL.

The stores are real: ``old_release/store-2026-11-25.*.sql`` are dumps of what that release's own ingest API and
delivery engine left in a store (``old_release/make_stores.py`` made them, running the release's code from a
worktree of 4004622, which a clean clone does not have). Each test loads a dump into a new store and runs a command
on it as it first opens it: the command upgrades the store, as ``serve`` does, says what it did and how long it
took, and then answers as on a store this release made. ``deploy``, ``demo``, ``preview`` and ``rotate-secret``
open no store.

What the store holds: source ``web`` (write key ``wk_release_2026_11_25``) sent 20 calls, ``release-1`` to
``release-20``, and ``release-5`` once more (deduplicated), to ``crm`` (18 delivered, ``release-3`` and
``release-7`` filtered), ``legacy`` (20 failed, ``permanent: HTTP 400``) and ``flaky`` (20 pending after one attempt
answered 503); then ``release-21`` to ``release-24``, never attempted: 72 messages, 24 messageIds remembered.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import psycopg
import pytest

from prefect_webhooks.cli import main
from prefect_webhooks.settings import get_settings, store_location
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
from tests.conftest import _fresh_postgres_database, postgres_server
from tests.receivers import Receiver
from tests.servers import background, free_port, save_destination, save_source
from tests.stored import every_message

RELEASE = "2026-11-25"
DUMPS = Path(__file__).resolve().parent / "old_release"
WRITE_KEY = "wk_release_2026_11_25"
UPGRADED = re.compile(r"^prefect-webhooks: upgraded the store at (?P<where>.+) in (?P<seconds>[\d.]+) s: "
                      r"(?P<what>.+)$", re.M)
STATES = {"delivered": 18, "filtered": 2, "failed": 20, "pending": 32}


def load_release_store(backend: str, folder: Path) -> str:
    """A new store holding what the release of 2026-11-25 wrote (its dump for ``backend``); returns its URL."""
    dump = (DUMPS / f"store-{RELEASE}.{backend}.sql").read_text(encoding="utf-8")
    if backend == "sqlite":
        path = folder / "webhooks.db"
        with closing(sqlite3.connect(path)) as connection:
            connection.executescript(dump)
        path.chmod(0o600)
        return f"sqlite:///{path}"
    url = _fresh_postgres_database(postgres_server())
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(dump)  # type: ignore[call-overload]  # the whole dump, as psql would run it
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def release_store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A store of the release of 2026-11-25 on each backend in turn, set as the configured store."""
    url = load_release_store(request.param, tmp_path)
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", url)
    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    # The dump's times are those of the day it was made: kept, remembered and retried as on that day, whenever the
    # test runs (the dedupe window is the delivered messages' retention).
    for setting, value in (("RETENTION_DELIVERED", "3650d"), ("RETENTION_FAILED", "3650d"),
                           ("MAX_RETRY_AGE", str(3650 * 86400))):
        monkeypatch.setenv(f"PREFECT_WEBHOOKS_{setting}", value)
    get_settings.cache_clear()
    yield url
    dispose_engines()
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def release_blocks(prefect_harness: None) -> Iterator[Receiver]:
    """The release's source and destinations saved in Prefect again, the destinations at a live receiver."""
    with Receiver() as receiver:
        for name in ("crm", "legacy", "flaky"):
            save_destination(name, [receiver.url], "whsec_release_2026_11_25")
        save_source("web", WRITE_KEY, ["crm", "legacy", "flaky"])
        yield receiver


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``prefect-webhooks ARGS`` in this process: its exit status, standard output and standard error."""
    status = main(list(args))
    printed = capsys.readouterr()
    return status, printed.out, printed.err


def assert_upgraded_once(url: str, err: str) -> None:
    """``err`` says, in one line, that the store at ``url`` was upgraded, how long it took and what it got."""
    said = UPGRADED.findall(err)
    assert len(said) == 1, err
    where, seconds, what = said[0]
    assert where == store_location(url)
    assert float(seconds) < 60
    assert re.search(r"created table\(s\) .*\bendpoint_counters\b", what), what
    assert re.search(r"added column\(s\) .*\boutbox\.endpoint\b", what), what
    assert "moved 40 finished message(s) from the queue to the message log" in what, what


COMMANDS = {
    "status": ("status",),
    "status --json": ("status", "--json"),
    "status --prometheus": ("status", "--prometheus"),
    "messages list": ("messages", "list", "--json", "--limit", "100"),
    "messages show": ("messages", "show", "release-1", "--json"),
    "messages resend": ("messages", "resend", "2"),
    "prune --store-only": ("prune", "--store-only"),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_upgrades_a_store_of_the_previous_release_and_answers(
    release_store: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    status, out, err = run(capsys, *COMMANDS[command])
    assert status == 0, err
    assert_upgraded_once(release_store, err)
    if command == "status":
        assert re.search(r"^TOTAL\s+32\s+0\s+[\d.]+\s+18\s+20\s+2$", out, re.M), out
        assert "kept in the message log: 40 messages (20 delivered or filtered, 20 failed)" in out
        # The ids the release remembered (in its seen_messages) are counted: the dedupe still holds them.
        assert "remembered for the dedupe window: 24 messageIds" in out
    elif command == "status --json":
        document = json.loads(out)
        assert {state: document["totals"][state] for state in ("pending", "delivered", "failed", "filtered")} == {
            "pending": 32, "delivered": 18, "failed": 20, "filtered": 2}
        assert document["remembered"] == 24
    elif command == "status --prometheus":
        assert 'prefect_webhooks_failed_total{destination="legacy"} 20' in out
    elif command == "messages list":
        assert Counter(message["state"] for message in json.loads(out)) == STATES
    elif command == "messages show":
        shown = [json.loads(part) for part in re.split(r"(?m)^(?=\{)", out) if part.strip()]
        assert {(m["destination"], m["state"], m["attempts"], len(m["tries"])) for m in shown} == {
            ("crm", "delivered", 1, 1), ("legacy", "failed", 1, 1), ("flaky", "pending", 1, 1)}
    elif command == "messages resend":
        assert out == "2: queued again\n"
    else:
        assert "pruned 0 delivered, 0 filtered, 0 failed" in out
    # Opened again, there is nothing left to upgrade, and nothing is said.
    status, _, err = run(capsys, "status")
    assert status == 0 and UPGRADED.search(err) is None, err


PREFECT_COMMANDS = {
    "endpoint list": ("endpoint", "list", "flaky"),
    "replay": ("replay", "legacy"),
    "messages show --request": ("messages", "show", "1", "--request"),
}


@pytest.mark.parametrize("command", PREFECT_COMMANDS)
def test_a_command_with_prefect_upgrades_a_store_of_the_previous_release(
    release_store: str, release_blocks: Receiver, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    status, out, err = run(capsys, *PREFECT_COMMANDS[command])
    assert status == 0, err
    assert_upgraded_once(release_store, err)
    if command == "endpoint list":
        assert "/hook" in out
    elif command == "replay":
        assert out == "replay: 20 message(s) are pending again\n"
    else:
        assert re.search(r"^Idempotency-Key: msg_[0-9a-f]{12}_1$", out, re.M), out


@pytest.mark.shares_machine
@pytest.mark.slow
def test_ingest_on_a_store_of_the_previous_release_still_dedupes_its_ids(
    release_store: str, release_blocks: Receiver, tmp_path: Path
) -> None:
    """The ingest API upgrades the store at its start and refuses a messageId the release remembered."""
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    log = tmp_path / "ingest.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "prefect_webhooks.cli", "ingest", "--port", str(port)],
                                   env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        auth = {"Authorization": "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()}
        batch = {"batch": [{"type": "track", "userId": "u1", "event": "Again", "messageId": message_id}
                           for message_id in ("release-5", "after-upgrade")]}
        answer = None
        for _ in range(600):
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/v1/batch", json=batch, headers=auth, timeout=10)
                break
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                time.sleep(0.1)
        assert answer is not None and answer.status_code == 200, log.read_text()
    finally:
        process.terminate()
        process.wait(30)
    assert_upgraded_once(release_store, log.read_text())
    new = [m for m in every_message(get_engine(release_store)) if m.message_id in ("release-5", "after-upgrade")]
    assert Counter(m.message_id for m in new) == {"release-5": 3, "after-upgrade": 3}  # release-5: the release's


@pytest.mark.shares_machine
@pytest.mark.slow
def test_processes_opening_it_at_once_upgrade_it_once(release_store: str) -> None:
    """Three ``status`` processes started together: one upgrades, the others wait and find nothing to do."""
    started = [subprocess.Popen([sys.executable, "-m", "prefect_webhooks.cli", "status", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    answers = [process.communicate(timeout=300) for process in started]
    assert [process.returncode for process in started] == [0, 0, 0], answers
    assert sum(len(UPGRADED.findall(err)) for _, err in answers) == 1, [err for _, err in answers]
    assert {json.loads(out)["totals"]["pending"] for out, _ in answers} == {32}
    assert Counter(message.state for message in every_message(get_engine(release_store))) == STATES


# Run as a command would be, with SQLite's authorizer killing the process at the worst moment of the queue's
# rebuild: the queue renamed away and made again empty, its rows about to be copied back.
KILLED_MID_REBUILD = """
import os, signal, sqlite3, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine
from prefect_webhooks.cli import main

def kill_at_the_copy(action, table, *_):
    if action == sqlite3.SQLITE_READ and table == "outbox_before_log":
        os.kill(os.getpid(), signal.SIGKILL)
    return sqlite3.SQLITE_OK

@event.listens_for(Engine, "connect")
def watch(dbapi_connection, _record):
    dbapi_connection.set_authorizer(kill_at_the_copy)

sys.exit(main(["status", "--json"]))
"""


def test_a_kill_in_the_middle_of_the_queues_rebuild_loses_nothing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's upgrade is one transaction: killed mid-way, the store is as the release left it, and the next
    command upgrades it whole."""
    url = load_release_store("sqlite", tmp_path)
    env = {**os.environ, "PREFECT_WEBHOOKS_DATABASE_URL": url, "PREFECT_WEBHOOKS_HOME": str(tmp_path),
           "PREFECT_WEBHOOKS_RETENTION_DELIVERED": "3650d", "PREFECT_WEBHOOKS_RETENTION_FAILED": "3650d",
           "PREFECT_WEBHOOKS_MAX_RETRY_AGE": str(3650 * 86400)}
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_REBUILD], env=env, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stderr  # it reached the copy
    with closing(sqlite3.connect(tmp_path / "webhooks.db")) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "outbox_before_log" not in tables and "endpoint_counters" not in tables
        assert connection.execute("SELECT count(*) FROM outbox").fetchone() == (72,)
    after = subprocess.run([sys.executable, "-m", "prefect_webhooks.cli", "status", "--json"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr
    assert_upgraded_once(url, after.stderr)
    assert json.loads(after.stdout)["totals"]["pending"] == 32
    for name, value in env.items():
        if name.startswith("PREFECT_WEBHOOKS_"):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        assert Counter(message.state for message in every_message(get_engine(url))) == STATES
    finally:
        dispose_engines()
        get_settings.cache_clear()


@pytest.mark.postgres
def test_a_user_who_may_only_read_is_told_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = load_release_store("postgresql", tmp_path)
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE ROLE "{reader}" LOGIN')
        connection.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{reader}"')
    try:
        monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", url.replace("//postgres@", f"//{reader}@", 1))
        get_settings.cache_clear()
        status, out, err = run(capsys, "status")
    finally:
        get_settings.cache_clear()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP OWNED BY "{reader}"')
            connection.execute(f'DROP ROLE "{reader}"')
    assert status == 1 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert re.match(r"status: the store at postgresql://reader_\w+@.+ was written by an earlier release and this "
                    r"process cannot upgrade it \(permission denied for schema public.*\): run `prefect-webhooks "
                    r"serve`, or this command, as a user that may write to the store$", err.strip()), err


@pytest.mark.shares_machine
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_serve_upgrades_it_says_so_once_and_delivers_what_the_release_left_queued(
    release_store: str, release_blocks: Receiver, tmp_path: Path
) -> None:
    from prefect.settings import PREFECT_API_URL

    port = free_port()
    env = {**{key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")},
           "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    before = len(release_blocks.requests)
    command = [sys.executable, "-m", "prefect_webhooks.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with background(command, env=env, cwd=tmp_path, name="serve") as serve:
        serve.wait_for("deployments served", timeout=240)
        deadline = time.monotonic() + 120
        while Counter(message.state for message in every_message(get_engine(release_store)))["pending"]:
            assert time.monotonic() < deadline, serve.output()[-3000:]
            time.sleep(0.5)
    # Its processes opened the store together: one upgraded it and said so.
    assert_upgraded_once(release_store, serve.output())
    assert Counter(message.state for message in every_message(get_engine(release_store))) == {
        "delivered": 18 + 32, "filtered": 2, "failed": 20}
    assert len(release_blocks.requests) - before == 32
