"""The stores a benchmark runs on: a fresh SQLite file or PostgreSQL database per run (``Postgres`` starts a
throwaway server when none is given, and removes what it made), and the store's counts that check nothing was lost.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

from started_processes import ROOT, free_port


class Postgres:
    """A PostgreSQL server: the given one, or a throwaway one started here on a free port and stopped at the end.

    The throwaway server is ``scripts/test-postgres`` on a port of its own (never the test server's), its data
    folder removed when it stops: a benchmark leaves nothing running behind it.
    """

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.started_port: str | None = None
        self.created: list[str] = []

    @property
    def pid(self) -> int | None:
        """The postmaster of a server started here (its CPU is reported; a shared server's is not ours alone)."""
        if not self.started_port:
            return None
        pid_file = Path(f"/tmp/prefect-webhooks-pg-{self.started_port}/data/postmaster.pid")
        return int(pid_file.read_text().split()[0]) if pid_file.exists() else None

    def __enter__(self) -> Postgres:
        if not self.url:
            port = str(free_port())
            self.started_port = port
            done = subprocess.run([str(ROOT / "scripts" / "test-postgres"), "start", port], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                self.__exit__()
                raise RuntimeError(f"scripts/test-postgres start {port} failed: {done.stderr[-500:]}")
            self.url = done.stdout.strip().splitlines()[-1]
        return self

    def fresh_database(self) -> str:
        import psycopg

        assert self.url
        name = f"bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def __exit__(self, *exc: object) -> None:
        if self.created and not self.started_port:
            # A server that was already running keeps running, without this run's databases.
            import psycopg

            from prefect_webhooks.store.engine.engines import dispose_engines

            dispose_engines()
            assert self.url
            with psycopg.connect(self.url, autocommit=True) as connection:
                for name in self.created:
                    connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created = []
        if self.started_port:
            subprocess.run([str(ROOT / "scripts" / "test-postgres"), "stop", self.started_port], capture_output=True)
            shutil.rmtree(f"/tmp/prefect-webhooks-pg-{self.started_port}", ignore_errors=True)
            self.started_port = None


def fresh_store(kind: str, workdir: Path, postgres: Postgres | None, name: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{workdir / (name + '.db')}"
    assert postgres is not None
    return postgres.fresh_database()


def store_counts(url: str) -> dict[str, int]:
    from sqlalchemy import func, select

    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.figures.counters import outcome_totals
    from prefect_webhooks.store.queue.outbox import OUTBOX

    # Outcomes from the counters (finished messages have left the queue for the log), pending from the queue.
    with get_engine(url).connect() as connection:
        counts: dict[str, int] = {}
        for outcomes in outcome_totals(connection).values():
            for state, count in outcomes.items():
                counts[state] = counts.get(state, 0) + count
        counts.update(connection.execute(select(OUTBOX.c.state, func.count()).group_by(OUTBOX.c.state)).all())
        return counts


def settled_store_counts(url: str, expected: dict[str, int], quiet_seconds: float) -> dict[str, int]:
    """The store's counts once they are ``expected``, or once they have not changed for ``quiet_seconds``.

    The receiver can hold a batch's requests before the worker has committed their outcomes (the record's
    transaction waits for the write lock behind a backlog): read at once, those messages still count as pending,
    though nothing is wrong. Counts that stop changing short of ``expected`` are a real loss or leftover.
    """
    counts = store_counts(url)
    changed_at = time.monotonic()
    while counts != expected and time.monotonic() - changed_at < quiet_seconds:
        time.sleep(0.5)
        now = store_counts(url)
        if now != counts:
            counts, changed_at = now, time.monotonic()
    return counts


def pending_count(url: str) -> int:
    from sqlalchemy import func, select

    from prefect_webhooks.messages.outcomes import PENDING
    from prefect_webhooks.store.engine.engines import get_engine
    from prefect_webhooks.store.queue.outbox import OUTBOX

    with get_engine(url).connect() as connection:
        return connection.execute(select(func.count()).where(OUTBOX.c.state == PENDING)).scalar_one()

