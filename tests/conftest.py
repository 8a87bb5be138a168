"""Fixtures shared by every test: one Prefect test server per session, a fresh store per test."""

from __future__ import annotations

import gc
import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest
from prefect.testing.utilities import prefect_test_harness

from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine
from prefect_webhooks.utilities.runtime import tune_gc_for_serving
from tests.leaked_processes import leaked_processes, mark_session
from tests.receivers import Receiver

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started as a script's background job (`.ci/run &`, `nohup`), the suite inherits SIGINT ignored, and so would
    # every process it starts: Ctrl-C tests of a child that relies on Python's KeyboardInterrupt (`prefect worker`)
    # would then hang, or not, depending on whether an earlier test in the same worker had set a handler. The
    # tests' processes start as from a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A home folder of the session's own (the local copy of blocks is written there), unless the run sets one."""
    if "PREFECT_WEBHOOKS_HOME" in os.environ:
        yield
        return
    os.environ["PREFECT_WEBHOOKS_HOME"] = str(tmp_path_factory.mktemp("home"))
    get_settings.cache_clear()
    yield
    os.environ.pop("PREFECT_WEBHOOKS_HOME", None)
    get_settings.cache_clear()


def servers_started_by_the_test_server() -> list[psutil.Process]:
    """The processes the harness's Prefect server (a child of this process) started."""
    found = []
    for child in psutil.Process().children():
        with suppress(psutil.Error):
            if "prefect.server.api.server:create_app" in " ".join(child.cmdline()):
                found += child.children(recursive=True)
    return found


def end_processes(processes: list[psutil.Process]) -> None:
    """SIGTERM each, then SIGKILL what is left after 10 s."""
    for process in processes:
        with suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        with suppress(psutil.Error):
            process.kill()


def pytest_configure(config: pytest.Config) -> None:
    mark_session()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails when a process it started outlives it (``tests/leaked_processes.py``); pytest's workers leave
    that to the process that started them."""
    if hasattr(session.config, "workerinput"):
        return
    leaked = leaked_processes()
    if leaked:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(leaked)} process(es) started by this test session outlived it (killed now):"]
        lines += [f"  pid {pid}: {command[:300]}" for pid, command in sorted(leaked.items())]
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding slow tests run first, and ``PREFECT_WEBHOOKS_TEST_SHARD=K/N`` keeps a shard of the tests.

    Order: CI runs the suite on parallel workers, one file at a time each (``-n 2 --dist loadfile``, so tests that
    build on earlier ones in their file, such as the docs examples of tests/test_readme.py, keep their order). The
    long files going first leaves the many short ones to even out the workers at the end, instead of one worker
    running a minutes-long file alone. The order inside a file is unchanged.

    ``PREFECT_WEBHOOKS_TEST_INTERPRETER_CHECK=1`` keeps the tests that need neither the Prefect test server nor
    PostgreSQL (CI's extra Python versions).

    Shards: the K-th of N shards holds whole files; files go to the shard with the fewest tests so far, largest
    first. CI splits the fast suite of the extra Python versions this way (each test runs on one of them besides
    3.11).
    """
    files_with_slow_tests = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in files_with_slow_tests)
    if os.environ.get("PREFECT_WEBHOOKS_TEST_INTERPRETER_CHECK"):
        # Another Python version: the tests of this package's code that need neither the Prefect test server nor
        # PostgreSQL. What waits on those servers repeats the run on 3.11 and tells nothing of the interpreter.
        kept, deselected = [], []
        for item in items:
            uses_prefect = "prefect_harness" in getattr(item, "fixturenames", ())
            (deselected if uses_prefect or item.get_closest_marker("postgres") else kept).append(item)
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    shard = os.environ.get("PREFECT_WEBHOOKS_TEST_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    if not 1 <= index <= count:
        raise pytest.UsageError(f"PREFECT_WEBHOOKS_TEST_SHARD={shard!r}: K/N with 1 <= K <= N")
    tests_per_file = Counter(item.nodeid.split("::")[0] for item in items)
    sizes = [0] * count
    shard_of_file = {}
    for path, size in sorted(tests_per_file.items(), key=lambda entry: (-entry[1], entry[0])):
        lightest = sizes.index(min(sizes))
        shard_of_file[path] = lightest
        sizes[lightest] += size
    kept, deselected = [], []
    for item in items:
        (kept if shard_of_file[item.nodeid.split("::")[0]] == index - 1 else deselected).append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A real Prefect API (temporary SQLite database), started once per session (~9 s)."""
    # A flow run left Cancelling (its process gone) is marked Cancelled after this; 300 s by default, 10 s here so
    # the work-pool test sees the end of the remedy docs/guides/deploying.md gives (Prefect releases without the
    # setting ignore it).
    os.environ.setdefault("PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_CANCELLING_TIMEOUT_SECONDS", "10")
    with prefect_test_harness(server_startup_timeout=120):
        yield
        started_by_server = servers_started_by_the_test_server()
    # Prefect 3.4.9's test server starts a temporary server of its own while it runs an automation's notification,
    # and leaves it running when it is stopped: end what it started, as the harness ends the server.
    end_processes(started_by_server)


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQLite store for one test, also set as PREFECT_WEBHOOKS_DATABASE_URL."""
    url = os.environ.get("PREFECT_WEBHOOKS_TEST_DATABASE_URL") or f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", url)
    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    get_settings.cache_clear()
    get_engine(url)
    yield url
    dispose_engines()
    get_settings.cache_clear()


def postgres_server() -> str:
    """The test PostgreSQL server's URL; without one a test fails in CI (``.ci/run`` starts it), skips elsewhere."""
    server = os.environ.get("PREFECT_WEBHOOKS_TEST_POSTGRES_URL")
    if not server:
        if os.environ.get("CI"):
            pytest.fail("PREFECT_WEBHOOKS_TEST_POSTGRES_URL is not set; .ci/run starts PostgreSQL")
        pytest.skip("no PostgreSQL server (set PREFECT_WEBHOOKS_TEST_POSTGRES_URL; scripts/test-postgres)")
    return server


_made_databases: list[tuple[str, str]] = []
"""(server URL, database name) of each database this session made: dropped when it ends."""


def _fresh_postgres_database(server_url: str) -> str:
    """A new empty database on the test PostgreSQL server; returns its URL (dropped when the session ends)."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    _made_databases.append((server_url, name))
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="session", autouse=True)
def drop_made_databases() -> Iterator[None]:
    """Each session drops the databases it made: a developer's server does not fill its disk run after run."""
    yield
    if not _made_databases:
        return
    import psycopg

    dispose_engines()
    for server_url, name in _made_databases:
        # A server a fault test started and stopped is gone, and its databases with it.
        with suppress(psycopg.Error), psycopg.connect(server_url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh store on each backend in turn (SQLite file, then a new PostgreSQL database).

    PostgreSQL comes from PREFECT_WEBHOOKS_TEST_POSTGRES_URL (``.ci/run`` starts one); in CI its absence is an error.
    """
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = _fresh_postgres_database(postgres_server())
    yield from _configured_store(url, tmp_path, monkeypatch)


@pytest.fixture
def postgres_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh PostgreSQL store (a new database), set as the configured store (mark the test ``postgres``)."""
    yield from _configured_store(_fresh_postgres_database(postgres_server()), tmp_path, monkeypatch)


def _configured_store(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", url)
    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    get_settings.cache_clear()
    get_engine(url)
    yield url
    dispose_engines()
    get_settings.cache_clear()


@pytest.fixture
def serving_gc() -> Iterator[None]:
    """The garbage collector as ``serve``'s processes tune it (``tune_gc_for_serving``), for a test that times
    delivery in its own process. Untuned, a full collection of the test process's heap (Prefect, the test server's
    client, every module the suite imported) stops the event loop for 0.22-0.25 s: a pause the delivery worker, which
    freezes its start-up heap, does not have."""
    threshold = gc.get_threshold()
    tune_gc_for_serving()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 answering 200."""
    with Receiver() as running:
        yield running
