"""Opening a store: processes starting on a new SQLite store at the same moment (serve's ingest API, delivery
workers, pruner) all find it ready."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest


def open_store(url: str, ready: multiprocessing.synchronize.Barrier) -> None:
    from prefect_webhooks.store.engine.engines import get_engine

    ready.wait()
    get_engine(url)


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    # Seen in CI: "table outbox already exists" from one of serve's parts, and "database is locked" from the switch
    # to WAL. Four processes released together on each of four new stores.
    # spawn, not fork: a fork of a test process whose other threads hold locks could hang for reasons of its own.
    context = multiprocessing.get_context("spawn")
    exit_codes = []
    for round_ in range(4):
        url = f"sqlite:///{tmp_path / f'store-{round_}' / 'webhooks.db'}"
        ready = context.Barrier(4)
        processes = [context.Process(target=open_store, args=(url, ready)) for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(120)
        exit_codes += [process.exitcode for process in processes]
    assert exit_codes == [0] * 16


def test_a_column_a_later_release_added_is_added_to_an_existing_store(backend_url: str) -> None:
    # The message log's partition list got its ``messages`` count after stores with the list existed.
    from sqlalchemy import inspect

    from prefect_webhooks.store.engine.engines import create_schema, get_engine

    engine = get_engine(backend_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE message_log_partitions DROP COLUMN messages")
    create_schema(engine)
    columns = {column["name"]: column for column in inspect(engine).get_columns("message_log_partitions")}
    assert "messages" in columns and columns["messages"]["nullable"]


# The guide's form (docs/operations/several-hosts.md): libpq's several hosts, a primary and its standby.
LIBPQ_MULTI_HOST = (
    "postgresql://webhooks:secret@db1.internal:5432,db2.internal:5433/webhooks"
    "?target_session_attrs=read-write&connect_timeout=3"
)


def test_libpqs_several_hosts_become_the_hosts_sqlalchemy_connects_to() -> None:
    from sqlalchemy import create_engine, make_url

    from prefect_webhooks.store.engine.engines import sqlalchemy_url

    with pytest.raises(ValueError, match="invalid literal for int"):
        make_url(LIBPQ_MULTI_HOST)  # why the rewrite exists: SQLAlchemy reads one port
    engine = create_engine(sqlalchemy_url(LIBPQ_MULTI_HOST))
    _, arguments = engine.dialect.create_connect_args(engine.url)
    assert (arguments["host"], arguments["port"]) == ("db1.internal,db2.internal", "5432,5433")
    assert (arguments["user"], arguments["password"], arguments["dbname"]) == ("webhooks", "secret", "webhooks")
    assert (arguments["target_session_attrs"], arguments["connect_timeout"]) == ("read-write", "3")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://u:pw@db:5432/webhooks?connect_timeout=3",
            "postgresql+psycopg://u:pw@db:5432/webhooks?connect_timeout=3",
        ),
        ("postgres://u@db/webhooks", "postgresql+psycopg://u@db/webhooks"),
        ("postgresql+psycopg://u@db1,db2/webhooks", "postgresql+psycopg://u@/webhooks?host=db1&host=db2"),
        ("sqlite:////tmp/webhooks.db", "sqlite:////tmp/webhooks.db"),
    ],
)
def test_single_host_and_other_urls_keep_their_form(url: str, expected: str) -> None:
    from prefect_webhooks.store.engine.engines import sqlalchemy_url

    assert sqlalchemy_url(url) == expected


def test_a_multi_host_store_url_is_shown_without_its_password() -> None:
    from prefect_webhooks.settings import store_location

    shown = store_location(LIBPQ_MULTI_HOST)
    assert "secret" not in shown
    assert shown.startswith("postgresql://webhooks:***@db1.internal:5432,db2.internal:5433/webhooks?")
    assert "secret" not in store_location("postgresql+psycopg://u@/webhooks?host=db1&password=secret")


@pytest.mark.postgres
def test_a_store_opens_on_the_writable_one_of_several_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A first host that refuses connections (nothing listens on port 1) stands for a primary that is down: libpq
    # goes on to the next host, as it would to a promoted standby.
    from urllib.parse import urlsplit

    from sqlalchemy import text

    from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
    from tests.conftest import _fresh_postgres_database, postgres_server

    real = urlsplit(_fresh_postgres_database(postgres_server()))
    userinfo = real.netloc.rpartition("@")[0]
    url = (
        f"postgresql://{userinfo}@127.0.0.1:1,{real.hostname}:{real.port or 5432}{real.path}"
        "?target_session_attrs=read-write&connect_timeout=3"
    )
    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    try:
        with get_engine(url).connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0
    finally:
        dispose_engines()


@pytest.mark.postgres
def test_a_connection_to_a_server_that_takes_no_writes_is_dropped_and_the_next_one_writes(postgres_url: str) -> None:
    # A pooled connection that reached a standby (or a primary since demoted): the pool's pre-ping passes there, so
    # without its invalidation every retry would be refused again ("cannot execute INSERT in a read-only
    # transaction"). Here the session is made read-only by hand, as a standby's are.
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from prefect_webhooks.delivery.pacing.context import is_store_unavailable
    from prefect_webhooks.store.engine.engines import get_engine

    engine = get_engine(postgres_url)
    insert = text("INSERT INTO store_identity (id, key) VALUES (2, 'readonly-test')")
    with engine.connect() as connection:
        connection.exec_driver_sql("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        connection.commit()
        with pytest.raises(DBAPIError) as refused:
            connection.execute(insert)
    assert refused.value.connection_invalidated and is_store_unavailable(refused.value)
    with engine.begin() as connection:
        connection.execute(insert)
