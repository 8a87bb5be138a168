"""The destination cache never makes a batch wait for the Prefect API.

Against the session's Prefect server behind a forwarder that goes down, hangs and comes back (``tests.outages``).
"""

from __future__ import annotations

import asyncio
import logging
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefect_webhooks.blocks.local_copy import LocalCopy
from prefect_webhooks.delivery.sending.destinations import DestinationCache, DestinationNotFound, DestinationUnavailable
from prefect_webhooks.settings import get_settings
from tests.outages import switched_api
from tests.servers import save_destination

SECRET = "whsec-outage-secret-1"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PREFECT_WEBHOOKS_HOME", str(tmp_path))
    monkeypatch.setenv("PREFECT_WEBHOOKS_API_WAIT_SECONDS", "0.5")
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


async def test_while_the_api_is_down_batches_use_the_block_they_have_without_waiting(
    prefect_harness: None, home: Path
) -> None:
    await asyncio.to_thread(save_destination, "outage-stale", ["https://example.com/hook"], shared_secret=SECRET)
    with switched_api() as switch:
        cache = DestinationCache(ttl=0)  # every get is due a reload
        loaded = await cache.get("outage-stale")
        for fault in (switch.down, switch.hang):
            fault()
            started = time.monotonic()
            for _ in range(20):
                assert await cache.get("outage-stale") == loaded
            # The first get waits at most api_wait_seconds; the others not at all (the API is known to be down).
            assert time.monotonic() - started < 1.2
            switch.up()


async def test_a_process_started_during_an_outage_takes_its_blocks_from_the_local_copy(
    prefect_harness: None, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await asyncio.to_thread(save_destination, "outage-copied", ["https://example.com/hook"], shared_secret=SECRET)
    with switched_api() as switch:
        loaded = await DestinationCache().get("outage-copied")
        copy = LocalCopy("destinations")
        assert copy.path == home / "local-copy" / "destinations.json"
        assert stat.S_IMODE(copy.path.stat().st_mode) == 0o600
        assert copy.read()["outage-copied"]["shared_secret"] == SECRET  # sending needs it
        switch.down()
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            cold = await DestinationCache().get("outage-copied")
        assert time.monotonic() - started < 1.0
        assert cold.endpoints == loaded.endpoints and cold.signer == loaded.signer
        assert "outage-copied" in caplog.text and SECRET not in caplog.text


async def test_without_any_copy_the_rows_wait_instead_of_the_batch(
    prefect_harness: None, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_LOCAL_COPY", "false")
    get_settings.cache_clear()
    await asyncio.to_thread(save_destination, "outage-uncopied", ["https://example.com/hook"])
    with switched_api() as switch:
        switch.hang()
        started = time.monotonic()
        with pytest.raises(DestinationUnavailable, match="no local copy"):
            await DestinationCache().get("outage-uncopied")
        assert time.monotonic() - started < 1.2
    assert not (home / "local-copy").exists()


async def test_a_deleted_block_fails_its_messages_and_leaves_the_copy(prefect_harness: None, home: Path) -> None:
    from prefect.client.orchestration import get_client

    await asyncio.to_thread(save_destination, "outage-deleted", ["https://example.com/hook"])
    cache = DestinationCache(ttl=0)
    await cache.get("outage-deleted")
    async with get_client() as client:
        document = await client.read_block_document_by_name("outage-deleted", block_type_slug="webhook-destination")
        await client.delete_block_document(document.id)
    with pytest.raises(DestinationNotFound):
        await cache.get("outage-deleted")
    assert "outage-deleted" not in LocalCopy("destinations").read()


async def test_an_endpoint_being_disabled_gets_no_requests_until_a_later_load_says_otherwise(
    prefect_harness: None, home: Path
) -> None:
    await asyncio.to_thread(save_destination, "held-out", ["https://one.example/hook", "https://two.example/hook"])
    cache = DestinationCache(ttl=0)  # every get loads the block again
    first, second = (await cache.get("held-out")).endpoints
    cache.hold_out("held-out", first.key)
    # While the disable is being saved, every load (the block still lists the endpoint) leaves it out.
    for _ in range(3):
        loaded = await cache.get("held-out")
        assert loaded.endpoints == (second,) and loaded.disabled == (first,)
    # The save ended: a load started after it says what the block says (here it was enabled again meanwhile).
    cache.held_out_saved("held-out", saved=True)
    assert (await cache.get("held-out")).endpoints == (first, second)
    # A save that failed gives the endpoint back at once.
    cache.hold_out("held-out", second.key)
    assert (await cache.get("held-out")).endpoints == (first,)
    cache.held_out_saved("held-out", saved=False)
    assert (await cache.get("held-out")).endpoints == (first, second)


async def test_a_reload_finds_the_block_unchanged_and_a_changed_block_reaches_the_local_copy(
    prefect_harness: None, home: Path
) -> None:
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.saved import load_block

    await asyncio.to_thread(save_destination, "reloaded", ["https://example.com/hook"], shared_secret=SECRET)
    # The premise of reusing the local copy's form: two loads of an unsaved-since block are equal.
    assert await load_block(WebhookDestination, "reloaded") == await load_block(WebhookDestination, "reloaded")
    cache = DestinationCache(ttl=0)  # every get loads the block again
    await cache.get("reloaded")
    await cache.get("reloaded")
    assert LocalCopy("destinations").read()["reloaded"]["shared_secret"] == SECRET
    await asyncio.to_thread(save_destination, "reloaded", ["https://example.com/other"], shared_secret=SECRET + "-2")
    assert [endpoint.url for endpoint in (await cache.get("reloaded")).endpoints] == ["https://example.com/other"]
    copied = LocalCopy("destinations").read()["reloaded"]
    assert copied["shared_secret"] == SECRET + "-2" and copied["endpoints"][0]["url"] == "https://example.com/other"
