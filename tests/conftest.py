"""Fixtures shared by every test: one Prefect test server per session, a fresh store per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness

from prefect_webhooks.settings import get_settings
from prefect_webhooks.store import dispose_engines, get_engine
from tests.receivers import Receiver


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A real Prefect API (temporary SQLite database), started once per session (~9 s)."""
    with prefect_test_harness(server_startup_timeout=120):
        yield


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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 answering 200."""
    with Receiver() as running:
        yield running
