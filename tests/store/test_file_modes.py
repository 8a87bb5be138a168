"""The SQLite store's files: the owner's only when created, a warning for an existing store open to others."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from prefect_webhooks.store.engine.engines import dispose_engines, get_engine


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    # 022, as on most machines: files the code does not restrict come out 0644.
    before = os.umask(0o022)
    yield
    os.umask(before)
    dispose_engines()


def test_a_new_store_and_its_wal_and_shm_files_are_the_owners_only(tmp_path: Path) -> None:
    store = tmp_path / "home" / "webhooks.db"
    engine = get_engine(f"sqlite:///{store}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE written (x INTEGER)"))
        connection.execute(text("INSERT INTO written VALUES (1)"))
    files = [store, Path(f"{store}-wal"), Path(f"{store}-shm")]
    assert all(path.exists() for path in files)
    assert {path.name: oct(mode(path)) for path in files} == {path.name: "0o600" for path in files}
    assert oct(mode(store.parent)) == "0o700"


def test_an_existing_store_others_can_read_is_kept_and_named_in_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "webhooks.db"
    store.touch(mode=0o644)
    with caplog.at_level(logging.WARNING, logger="prefect_webhooks.store"):
        get_engine(f"sqlite:///{store}")
    assert oct(mode(store)) == "0o644"
    warnings = [record.getMessage() for record in caplog.records if "open to other users" in record.getMessage()]
    assert warnings == [f"the store {store} holds every message body and is open to other users of this machine "
                        f"(mode 644); to make it the owner's only: chmod 600 {store}*"]


def test_an_owner_only_store_opens_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "webhooks.db"
    store.touch(mode=0o600)
    with caplog.at_level(logging.WARNING, logger="prefect_webhooks.store"):
        get_engine(f"sqlite:///{store}")
    assert not [record for record in caplog.records if "open to other users" in record.getMessage()]
