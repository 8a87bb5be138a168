"""store_call: a store call retried while the store is unreachable, with a growing pause between tries."""

import asyncio
import itertools
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from prefect_webhooks.delivery.pacing.context import store_call
from prefect_webhooks.settings import get_settings


@pytest.fixture
def retry_for_seconds(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PREFECT_WEBHOOKS_STORE_RETRY_SECONDS", "2.5")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def test_an_unreachable_store_is_tried_again_after_a_growing_pause(tmp_path: Path, retry_for_seconds) -> None:
    # A SQLite file in a folder that does not exist: the store cannot be opened, as during a restart.
    unreachable = create_engine(f"sqlite:///{tmp_path / 'missing' / 'webhooks.db'}")
    tries: list[float] = []

    def read_one() -> int:
        tries.append(time.monotonic())
        with unreachable.connect() as connection:
            return connection.execute(text("SELECT 1")).scalar_one()

    started = time.monotonic()
    with pytest.raises(OperationalError):
        asyncio.run(store_call(retry_for_seconds, read_one))
    # Pauses of 0.2, 0.4 and 0.8 s fit in 2.5 s, the next (1.6 s) does not: four tries, then the error (a loaded
    # machine makes a pause longer, never shorter; three tries would take over a second each to leave fewer).
    assert len(tries) == 4, f"{len(tries)} tries in {time.monotonic() - started:.2f} s"
    pauses = [later - earlier for earlier, later in itertools.pairwise(tries)]
    assert all(pause >= least for pause, least in zip(pauses, (0.19, 0.39, 0.79), strict=True)), pauses


def test_a_store_that_comes_back_answers_the_call(tmp_path: Path, retry_for_seconds) -> None:
    folder = tmp_path / "later"
    store = create_engine(f"sqlite:///{folder / 'webhooks.db'}")
    tries = 0

    def read_one() -> int:
        nonlocal tries
        tries += 1
        if tries == 2:
            folder.mkdir()  # the store is back for the second try
        with store.connect() as connection:
            return connection.execute(text("SELECT 1")).scalar_one()

    assert asyncio.run(store_call(retry_for_seconds, read_one)) == 1
    assert tries == 2
