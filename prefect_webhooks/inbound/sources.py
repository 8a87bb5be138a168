"""Write key → source: the registry the ingest API authenticates with, loaded from saved ``Source`` blocks.

All Source block documents are read in one API call and cached for ``block_cache_seconds``; an unknown key
triggers a reload (at most once per ``unknown_key_refresh_seconds``; a miss inside that interval waits for the next
reload) so a source saved before a request is always found.
Keys are looked up by their SHA-256 and the final match is confirmed with ``hmac.compare_digest``; only hashes are
kept, in memory and in the local copy (``blocks.local_copy``) that lets an ingest API started while the Prefect API
is down accept the keys it knew. While Prefect cannot be asked, an unknown key is answered 503, not 401.

Write keys are unique across sources. ``register_source`` (``aregister_source`` in async code) checks that before
saving; a registry that still finds two sources with one key refuses that key (both sources are named in the error,
the key never is). Every public function here has a plain form and an ``a``-prefixed async form, as Prefect's
``save``/``asave``: none returns a coroutine that, left unawaited, would silently do nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prefect.client.orchestration import get_client

from prefect_webhooks.blocks.api_status import PrefectApiUnavailable, prefect_api
from prefect_webhooks.blocks.local_copy import LocalCopy
from prefect_webhooks.blocks.saved import is_missing_block, load_block, save_block
from prefect_webhooks.blocks.source import Source
from prefect_webhooks.settings import get_settings

logger = logging.getLogger(__name__)

SOURCE_BLOCK_SLUG = Source.get_block_type_slug()


class DuplicateWriteKeyError(ValueError):
    """Two sources share a write key; the message names both sources, never the key."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"sources {first!r} and {second!r} have the same write key; write keys must be unique")
        self.sources = (first, second)


class SourcesUnavailableError(RuntimeError):
    """The Source blocks could not be read and nothing is cached yet."""


@dataclass(frozen=True)
class SourceInfo:
    """What ingestion needs to know about a source (no secret)."""

    name: str
    destinations: tuple[str, ...] = ()
    enabled: bool = True


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    info: SourceInfo


def _digest(write_key: str) -> bytes:
    return hashlib.sha256(write_key.encode()).digest()


def build_index(entries: Iterable[tuple[str, SourceInfo]]) -> tuple[dict[bytes, _Entry], list[DuplicateWriteKeyError]]:
    """Index ``(write_key, info)`` pairs by key hash; a key shared by two sources is left out and reported.

    Only the SHA-256 of each key is kept: a key is found by its hash (no key in the clear stays in memory).

    Returns:
        The index and one error per duplicated key.
    """
    return _index_digests((_digest(write_key), info) for write_key, info in entries)


def _index_digests(
    entries: Iterable[tuple[bytes, SourceInfo]],
) -> tuple[dict[bytes, _Entry], list[DuplicateWriteKeyError]]:
    index: dict[bytes, _Entry] = {}
    errors: list[DuplicateWriteKeyError] = []
    refused: set[bytes] = set()
    for digest, info in entries:
        if digest in refused:
            continue
        if digest in index:
            errors.append(DuplicateWriteKeyError(index.pop(digest).info.name, info.name))
            refused.add(digest)
            continue
        index[digest] = _Entry(digest, info)
    return index, errors


def _copied_entries(copied: dict[str, dict[str, Any]]) -> list[tuple[bytes, SourceInfo]]:
    """The sources of the local copy: (key hash, source) pairs; an entry that does not read is skipped."""
    entries = []
    for name, entry in copied.items():
        try:
            entries.append((bytes.fromhex(entry["key_sha256"]), SourceInfo(
                name=name, destinations=tuple(entry.get("destinations") or ()), enabled=bool(entry.get("enabled")))))
        except (KeyError, TypeError, ValueError):
            logger.warning("ignoring source %r of the local copy: it does not read", name)
    return entries


def _entry_from_document(name: str, data: dict[str, Any]) -> tuple[str, SourceInfo] | None:
    write_key = data.get("write_key")
    if hasattr(write_key, "get_secret_value"):
        write_key = write_key.get_secret_value()
    if not isinstance(write_key, str) or not write_key:
        return None
    info = SourceInfo(
        name=name, destinations=tuple(data.get("destinations") or ()), enabled=bool(data.get("enabled", True))
    )
    return write_key, info


def _entries(documents: Iterable[Any]) -> list[tuple[str, SourceInfo]]:
    entries = []
    for document in documents:
        if document.is_anonymous or not document.name:
            continue
        entry = _entry_from_document(document.name, dict(document.data))
        if entry is not None:
            entries.append(entry)
    return entries


def read_source_entries() -> list[tuple[str, SourceInfo]]:
    """Every saved Source block as ``(write_key, SourceInfo)``, read in one Prefect API call.

    ``aread_source_entries`` is the same for async code.
    """
    with get_client(sync_client=True) as client:
        documents = client.read_block_documents_by_type(block_type_slug=SOURCE_BLOCK_SLUG, include_secrets=True)
    return _entries(documents)


async def aread_source_entries() -> list[tuple[str, SourceInfo]]:
    """Every saved Source block as ``(write_key, SourceInfo)``, read in one Prefect API call (async)."""
    async with get_client() as client:
        documents = await client.read_block_documents_by_type(block_type_slug=SOURCE_BLOCK_SLUG, include_secrets=True)
    return _entries(documents)


def read_source(name: str) -> SourceInfo | None:
    """The saved Source block ``name`` (its enabled destinations and whether it accepts events), or None when no
    Source block has that name.

    The one way flows read a source's destinations; ``aread_source`` is the same for async code.
    """
    try:
        block = Source.load(name, _sync=True)
    except Exception as exc:
        if is_missing_block(exc):
            return None
        raise
    return SourceInfo(name=name, destinations=tuple(block.destinations), enabled=block.enabled)


async def aread_source(name: str) -> SourceInfo | None:
    """The saved Source block ``name``, or None when no Source block has that name (async ``read_source``)."""
    try:
        block = await load_block(Source, name)
    except Exception as exc:
        if is_missing_block(exc):
            return None
        raise
    return SourceInfo(name=name, destinations=tuple(block.destinations), enabled=block.enabled)


def _refuse_shared_key(name: str, source: Source, entries: Iterable[tuple[str, SourceInfo]]) -> None:
    key = source.write_key.get_secret_value()
    for other_key, info in entries:
        if info.name != name and hmac.compare_digest(other_key.encode(), key.encode()):
            raise DuplicateWriteKeyError(info.name, name)


def check_unique_write_key(name: str, source: Source) -> None:
    """Raise ``DuplicateWriteKeyError`` if another saved source (not ``name``) already uses ``source``'s key.

    ``acheck_unique_write_key`` is the same for async code.
    """
    _refuse_shared_key(name, source, read_source_entries())


async def acheck_unique_write_key(name: str, source: Source) -> None:
    """Raise ``DuplicateWriteKeyError`` if another saved source (not ``name``) already uses ``source``'s key."""
    _refuse_shared_key(name, source, await aread_source_entries())


def register_source(name: str, source: Source, *, overwrite: bool = True) -> None:
    """Save ``source`` as block ``name`` after checking its write key is not used by another source.

    Use this instead of ``Source.save`` so a duplicated key is refused before it is stored. It is a plain function
    (it returns when the block is saved), callable from scripts, notebooks and sync flows alike; async code uses
    ``aregister_source``.

    Example:
        ```python
        from prefect_webhooks.blocks.source import Source
        from prefect_webhooks.inbound.sources import register_source

        register_source("web-app", Source(write_key="wk_live_123", destinations=["crm-webhooks"]))
        ```

    Raises:
        DuplicateWriteKeyError: naming both sources.
    """
    check_unique_write_key(name, source)
    source.save(name, overwrite=overwrite, _sync=True)


async def aregister_source(name: str, source: Source, *, overwrite: bool = True) -> None:
    """``register_source`` for async code: check the write key is not another source's, then save the block.

    Example:
        ```python
        from prefect_webhooks.blocks.source import Source
        from prefect_webhooks.inbound.sources import aregister_source

        await aregister_source("web-app", Source(write_key="wk_live_123", destinations=["crm-webhooks"]))
        ```

    Raises:
        DuplicateWriteKeyError: naming both sources.
    """
    await acheck_unique_write_key(name, source)
    await save_block(source, name, overwrite=overwrite)


@dataclass
class SourceRegistry:
    """Cached write key → source lookup for the ingest API (one event loop).

    While the Prefect API cannot be reached the registry answers from what it has (the last load, or after a restart
    the local copy of the sources' key hashes): known keys are accepted, and an unknown key raises
    ``SourcesUnavailableError`` (the API answers 503 with ``Retry-After``), because it may be a source saved since.
    """

    cache_seconds: float | None = None
    unknown_key_refresh_seconds: float | None = None
    local_copy: LocalCopy | None = None
    _index: dict[bytes, _Entry] = field(default_factory=dict)
    _loaded_at: float = float("-inf")
    _current: bool = False
    """Whether the last refresh read the sources from Prefect (False: an outage, the index may lack new ones)."""
    _lock: asyncio.Lock | None = None

    def __post_init__(self) -> None:
        settings = get_settings()
        if self.cache_seconds is None:
            self.cache_seconds = settings.delivery.block_cache_seconds
        if self.unknown_key_refresh_seconds is None:
            self.unknown_key_refresh_seconds = settings.ingest.unknown_key_refresh_seconds
        if self.local_copy is None:
            self.local_copy = LocalCopy("sources")

    def load(self, entries: Iterable[tuple[str, SourceInfo]]) -> list[DuplicateWriteKeyError]:
        """Replace the cache with ``entries``; returns (and logs) the duplicate-key errors found."""
        index, errors = build_index(entries)
        for error in errors:
            logger.error("refusing a write key: %s", error)
        self._index, self._loaded_at, self._current = index, time.monotonic(), True
        return errors

    async def refresh(self) -> None:
        """Reload every Source block now (one caller at a time; others wait for its result).

        The Prefect API is given ``api_wait_seconds`` (none while it is known to be down); without an answer the
        sources known so far stay in use, read from the local copy if this process has none yet.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        started = time.monotonic()
        async with self._lock:
            if self._loaded_at >= started:
                return  # another caller refreshed while this one waited
            try:
                entries = await prefect_api().call(aread_source_entries)
            except PrefectApiUnavailable:
                self._keep_serving()
                return
            except Exception as exc:
                if self._loaded_at == float("-inf"):
                    raise SourcesUnavailableError("cannot read Source blocks from the Prefect API") from exc
                logger.warning("cannot reload Source blocks (%s); keeping the cached ones", type(exc).__name__)
                self._loaded_at = time.monotonic()
                return
            self.load(entries)
            assert self.local_copy is not None
            self.local_copy.replace({entry.info.name: {
                "key_sha256": digest.hex(), "destinations": list(entry.info.destinations),
                "enabled": entry.info.enabled} for digest, entry in self._index.items()})

    def _keep_serving(self) -> None:
        """The API did not answer: go on with the sources known so far (the local copy's on a cold start)."""
        self._current = False
        if self._loaded_at == float("-inf"):
            assert self.local_copy is not None
            copied = _copied_entries(self.local_copy.read())
            if not copied:
                raise SourcesUnavailableError("cannot read Source blocks: the Prefect API cannot be reached and no "
                                              "local copy of them is kept")
            self._index = _index_digests(copied)[0]
            logger.warning("the Prefect API cannot be reached: %d source(s) taken from the local copy %s",
                           len(self._index), self.local_copy.path)
        self._loaded_at = time.monotonic()

    def _find(self, write_key: str) -> SourceInfo | None:
        digest = _digest(write_key)
        entry = self._index.get(digest)
        if entry is not None and hmac.compare_digest(entry.digest, digest):
            return entry.info
        return None

    async def lookup(self, write_key: str) -> SourceInfo | None:
        """The source a write key belongs to, or None; reloads when stale or (rate-limited) on a miss.

        A miss inside the rate limit waits for the next allowed reload instead of answering from the stale cache:
        a source saved just before the request must not be refused (the client would drop the batch on a 401).
        Waiting also slows down anyone guessing keys.

        Raises:
            SourcesUnavailableError: the key is not among the sources known, and Prefect cannot be asked now.
        """
        age = time.monotonic() - self._loaded_at
        if age > self.cache_seconds:
            await self.refresh()
            found = self._find(write_key)
        else:
            found = self._find(write_key)
            if found is None:
                wait = self.unknown_key_refresh_seconds - age
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.refresh()
                found = self._find(write_key)
        if found is None and not self._current:
            raise SourcesUnavailableError("the write key is not among the sources known while the Prefect API cannot "
                                          "be reached; retry later")
        return found
