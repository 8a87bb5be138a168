"""The write key → source registry: hashing, uniqueness, caching and reloading from saved Source blocks."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
import uuid
from pathlib import Path

import httpx
import pytest

from prefect_webhooks.blocks.saved import load_block, save_block
from prefect_webhooks.blocks.source import Source
from prefect_webhooks.inbound import sources
from prefect_webhooks.inbound.sources import (
    DuplicateWriteKeyError,
    SourceInfo,
    SourceRegistry,
    aread_source,
    aread_source_entries,
    aregister_source,
    build_index,
    check_unique_write_key,
    read_source,
    read_source_entries,
    register_source,
)
from prefect_webhooks.settings import get_settings
from tests.outages import switched_api
from tests.servers import ingest_api_process


def test_build_index_refuses_a_shared_key_naming_both_sources_not_the_key() -> None:
    index, errors = build_index(
        [("k1", SourceInfo("a")), ("shared-key", SourceInfo("b")), ("shared-key", SourceInfo("c"))]
    )
    assert len(index) == 1
    assert len(errors) == 1 and errors[0].sources == ("b", "c")
    assert "'b'" in str(errors[0]) and "'c'" in str(errors[0]) and "shared-key" not in str(errors[0])


async def test_registry_lookup_from_loaded_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [("key-a", SourceInfo("a", ("crm",))), ("key-b", SourceInfo("b", enabled=False))]

    async def saved_sources() -> list[tuple[str, SourceInfo]]:
        return entries

    # A miss reloads; here the "saved" sources are the same ones.
    monkeypatch.setattr(sources, "aread_source_entries", saved_sources)
    registry = SourceRegistry(cache_seconds=3600, unknown_key_refresh_seconds=0)
    registry.load(entries)
    assert await registry.lookup("key-a") == SourceInfo("a", ("crm",))
    assert (await registry.lookup("key-b")).enabled is False
    assert await registry.lookup("key-") is None
    assert await registry.lookup("key-a ") is None


async def test_registry_loads_saved_sources_and_sees_new_ones(prefect_harness: None) -> None:
    name, key = f"reg-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    registry = SourceRegistry(cache_seconds=3600, unknown_key_refresh_seconds=0)
    await registry.refresh()
    assert await registry.lookup(key) is None
    await save_block(Source(write_key=key, destinations=["crm", "bi"]), name)
    # An unknown key triggers a reload, so a source saved after start works at once.
    assert await registry.lookup(key) == SourceInfo(name, ("crm", "bi"), True)


async def test_unknown_key_reloads_are_rate_limited(prefect_harness: None, monkeypatch: pytest.MonkeyPatch) -> None:
    name, key = f"rate-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    registry = SourceRegistry(cache_seconds=3600, unknown_key_refresh_seconds=1.0)
    await registry.refresh()
    refreshed = time.monotonic()
    read_at: list[float] = []
    real_read = sources.aread_source_entries

    async def counting_read() -> list[tuple[str, SourceInfo]]:
        read_at.append(time.monotonic())
        return await real_read()

    monkeypatch.setattr(sources, "aread_source_entries", counting_read)
    await save_block(Source(write_key=key), name)
    started = time.monotonic()
    # Ten lookups of unknown keys at once, one of them just saved: one reload, after the rate limit, finds it.
    found = await asyncio.gather(registry.lookup(key), *(registry.lookup(f"nobody-{i}") for i in range(9)))
    waited = time.monotonic() - started
    assert found[0].name == name and found[1:] == [None] * 9
    assert len(read_at) == 1
    # Counted from the last reload, not from the lookups: saving the block can take a second on a loaded machine,
    # and then the reload is due at once (a run beside a CPU hog saw 0.16 s when this was measured from the lookups).
    assert read_at[0] - refreshed > 0.9, "a reload came sooner than the rate limit allows"
    assert waited < 5, "a miss inside the rate limit waits for the next reload, not longer"


async def test_read_source_entries_reads_secrets_in_one_call(prefect_harness: None) -> None:
    name, key = f"read-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await save_block(Source(write_key=key, destinations=["x"], enabled=False), name)
    entries = dict((info.name, (write_key, info)) for write_key, info in await aread_source_entries())
    assert entries[name] == (key, SourceInfo(name, ("x",), False))
    # The plain form reads the same, from sync code.
    assert await asyncio.to_thread(read_source_entries) == await aread_source_entries()


async def test_read_source_gives_destinations_and_enabled_or_none_when_no_block(prefect_harness: None) -> None:
    name, missing = f"one-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    await save_block(Source(write_key=uuid.uuid4().hex, destinations=["a", "b"], enabled=False), name)
    assert await aread_source(name) == SourceInfo(name, ("a", "b"), False)
    assert await aread_source(missing) is None
    # The plain form reads the same, from sync code.
    assert await asyncio.to_thread(read_source, name) == SourceInfo(name, ("a", "b"), False)
    assert await asyncio.to_thread(read_source, missing) is None


async def test_aregister_source_refuses_a_key_used_by_another_source(prefect_harness: None) -> None:
    key = uuid.uuid4().hex
    first, second = f"first-{uuid.uuid4().hex[:6]}", f"second-{uuid.uuid4().hex[:6]}"
    await aregister_source(first, Source(write_key=key))
    with pytest.raises(DuplicateWriteKeyError) as caught:
        await aregister_source(second, Source(write_key=key))
    assert first in str(caught.value) and second in str(caught.value) and key not in str(caught.value)
    # Saving the same source again under its own name is fine.
    await aregister_source(first, Source(write_key=key, destinations=["crm"]))
    assert (await load_block(Source, first)).destinations == ["crm"]


def test_register_source_called_plainly_saves_and_checks(prefect_harness: None) -> None:
    # Called as the README shows it, without await: it must save (a coroutine left unawaited would save nothing).
    key = uuid.uuid4().hex
    first, second = f"plain-{uuid.uuid4().hex[:6]}", f"plain2-{uuid.uuid4().hex[:6]}"
    assert register_source(first, Source(write_key=key, destinations=["crm"])) is None
    assert Source.load(first, _sync=True).destinations == ["crm"]
    with pytest.raises(DuplicateWriteKeyError):
        register_source(second, Source(write_key=key))
    with pytest.raises(DuplicateWriteKeyError):
        check_unique_write_key(second, Source(write_key=key))


async def test_register_source_works_inside_a_running_event_loop(prefect_harness: None) -> None:
    # e.g. a notebook cell, or sync code called from async code: still a plain call that saves.
    name = f"in-loop-{uuid.uuid4().hex[:6]}"
    register_source(name, Source(write_key=uuid.uuid4().hex))
    assert (await load_block(Source, name)).write_key.get_secret_value()


def test_no_public_function_returns_an_unawaited_coroutine() -> None:
    # Every public coroutine function of the module has a plain twin without the "a" prefix.
    public_async = [name for name, value in vars(sources).items()
                    if inspect.iscoroutinefunction(value) and not name.startswith("_")
                    and getattr(value, "__module__", None) == sources.__name__]
    assert public_async and all(name.startswith("a") and callable(getattr(sources, name[1:], None))
                                and not inspect.iscoroutinefunction(getattr(sources, name[1:]))
                                for name in public_async), public_async


async def test_registry_refuses_a_duplicated_key_saved_around_the_check(prefect_harness: None) -> None:
    key = uuid.uuid4().hex
    await save_block(Source(write_key=key), f"dup1-{uuid.uuid4().hex[:6]}")
    await save_block(Source(write_key=key), f"dup2-{uuid.uuid4().hex[:6]}")
    registry = SourceRegistry(cache_seconds=3600, unknown_key_refresh_seconds=0.1)
    await registry.refresh()
    assert await registry.lookup(key) is None


# --- while the Prefect API cannot be reached --------------------------------------------------------------------


async def test_a_refresh_keeps_a_local_copy_of_key_hashes_never_keys(prefect_harness: None, store_url: str) -> None:
    key = f"wk_copy_{uuid.uuid4().hex}"
    await aregister_source(f"copied-{key[-8:]}", Source(write_key=key, destinations=["crm"]))
    registry = SourceRegistry(cache_seconds=0)
    await registry.refresh()
    copy = registry.local_copy
    assert copy is not None and copy.path.parent.name == "local-copy"
    written = copy.path.read_bytes()
    assert key.encode() not in written
    assert hashlib.sha256(key.encode()).hexdigest().encode() in written


async def test_during_an_outage_known_keys_pass_and_unknown_ones_are_asked_again_later(
    prefect_harness: None, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_API_PROBE_SECONDS", "0.2")
    get_settings.cache_clear()
    key = f"wk_outage_{uuid.uuid4().hex}"
    await aregister_source(f"outage-{key[-8:]}", Source(write_key=key, destinations=["crm"]))
    with switched_api() as switch:
        warm = SourceRegistry(cache_seconds=0, unknown_key_refresh_seconds=0)
        assert (await warm.lookup(key)).destinations == ("crm",)
        assert await warm.lookup("wk_never_saved") is None  # Prefect answered: really unknown (401)
        switch.down()
        # A warm registry and one started during the outage (from the local copy) answer alike, within a second.
        cold = SourceRegistry(cache_seconds=0, unknown_key_refresh_seconds=0)
        started = time.monotonic()
        for registry in (warm, cold):
            assert (await registry.lookup(key)).destinations == ("crm",)
            with pytest.raises(sources.SourcesUnavailableError, match="retry later"):
                await registry.lookup("wk_saved_since_perhaps")
        assert time.monotonic() - started < 3
        # Once the probe sees Prefect again, an unknown key is unknown for good (401).
        switch.up()
        await asyncio.sleep(1)
        assert await SourceRegistry(cache_seconds=0).lookup("wk_never_saved") is None


async def test_an_ingest_api_started_during_an_outage_answers_known_keys_200_and_unknown_503(
    prefect_harness: None, store_url: str, tmp_path: Path
) -> None:
    key = f"wk_api_{uuid.uuid4().hex}"
    await aregister_source(f"api-{key[-8:]}", Source(write_key=key, destinations=["crm"]))
    await SourceRegistry(cache_seconds=0).refresh()  # another ingest process of this host read the sources once
    call = {"batch": [{"type": "track", "userId": "u1", "event": "Outage", "messageId": uuid.uuid4().hex}]}
    with switched_api() as switch:
        switch.down()
        with ingest_api_process(store_url, prefect_api_url=switch.url,
                                env={"PREFECT_WEBHOOKS_HOME": str(tmp_path)}) as server:
            async with httpx.AsyncClient(timeout=30) as http:
                known = await http.post(f"{server.url}/v1/batch", json=call, auth=(key, ""))
                unknown = await http.post(f"{server.url}/v1/batch", json=call, auth=("wk_not_known_here", ""))
    assert known.status_code == 200, known.text
    assert unknown.status_code == 503 and unknown.json()["code"] == "sources_unavailable"
    assert int(unknown.headers["Retry-After"]) >= 1
