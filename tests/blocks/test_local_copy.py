"""The local copy of saved blocks: private files, atomic rewrites, refused when others could read it."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from prefect_webhooks.blocks.local_copy import LocalCopy


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_entries_are_kept_in_a_private_file_and_replaced_atomically(tmp_path: Path) -> None:
    folder = tmp_path / "local-copy"
    copy = LocalCopy("destinations", folder, enabled=True)
    copy.update({"crm": {"shared_secret": "s3cret"}, "ads": {"shared_secret": None}})
    assert copy.read() == {"crm": {"shared_secret": "s3cret"}, "ads": {"shared_secret": None}}
    assert mode(folder) == 0o700 and mode(copy.path) == 0o600
    written = copy.path.stat().st_mtime_ns
    copy.update({"crm": {"shared_secret": "s3cret"}})  # nothing changes: the file is not rewritten
    assert copy.path.stat().st_mtime_ns == written
    copy.update({"ads": None})
    assert copy.read() == {"crm": {"shared_secret": "s3cret"}}
    copy.replace({"web": {"key_sha256": "ab"}})
    assert copy.read() == {"web": {"key_sha256": "ab"}}
    # Only the file and its lock: no temporary file is left behind.
    assert sorted(path.name for path in folder.iterdir()) == [".destinations.lock", "destinations.json"]


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file owners and modes are POSIX")
def test_a_copy_others_could_read_is_refused_naming_the_file_not_its_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = LocalCopy("destinations", tmp_path, enabled=True)
    copy.update({"crm": {"shared_secret": "s3cret-value"}})
    os.chmod(copy.path, 0o644)
    with caplog.at_level(logging.WARNING):
        assert copy.read() == {}
    assert str(copy.path) in caplog.text and "0o644" in caplog.text
    assert "s3cret-value" not in caplog.text
    # The next load rewrites it private again.
    copy.update({"crm": {"shared_secret": "s3cret-value"}})
    assert mode(copy.path) == 0o600 and copy.read() == {"crm": {"shared_secret": "s3cret-value"}}


def test_an_unreadable_copy_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    copy = LocalCopy("sources", tmp_path, enabled=True)
    copy.path.write_text("{not json")
    os.chmod(copy.path, 0o600)
    with caplog.at_level(logging.WARNING):
        assert copy.read() == {}
    assert "cannot be read" in caplog.text and str(copy.path) in caplog.text
    copy.path.write_text(json.dumps({"version": 99, "entries": {}}))
    assert copy.read() == {}


def test_turned_off_it_writes_nothing(tmp_path: Path) -> None:
    copy = LocalCopy("destinations", tmp_path / "local-copy", enabled=False)
    copy.update({"crm": {"shared_secret": "s3cret"}})
    assert not (tmp_path / "local-copy").exists() and copy.read() == {}


def test_the_setting_turns_it_off_and_home_decides_where_it_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_webhooks.settings import get_settings

    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    monkeypatch.setenv("PREFECT_WEBHOOKS_LOCAL_COPY", "false")
    get_settings.cache_clear()
    try:
        copy = LocalCopy("sources")
        assert copy.path == tmp_path / "local-copy" / "sources.json" and copy.enabled is False
    finally:
        monkeypatch.delenv("PREFECT_WEBHOOKS_LOCAL_COPY")
        get_settings.cache_clear()
