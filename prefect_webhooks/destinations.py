"""Destinations by name: saved ``WebhookDestination`` blocks, loaded with a short cache.

Outbox rows name their destination block, so an edit to the saved block (new URL, header or secret) reaches every
batch that starts after the cache entry ages out (``block_cache_seconds``).

A block that does not exist fails its messages permanently (``permanent: destination block 'x' not found``): the
outbox cannot deliver to an unknown place and retrying for four hours would only hide the mistake; ``replay`` puts
them back once the block is saved. Any other error while loading (Prefect API unreachable…) is transient: the
messages are retried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prefect.exceptions import ObjectNotFound

from prefect_webhooks.blocks import WebhookDestination
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing import SIGNATURE_HEADER

USER_AGENT = "prefect-webhooks/1.0"


class DestinationNotFound(LookupError):
    """No saved WebhookDestination block has this name."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One URL ready to post to: the headers every request carries (static ones included)."""

    url: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class ResolvedDestination:
    """A destination block reduced to what sending needs."""

    name: str
    endpoints: tuple[Endpoint, ...]
    secret: str | None


def resolve(name: str, block: WebhookDestination) -> ResolvedDestination:
    """Prepare a loaded block for sending: fixed headers per endpoint, the secret in the clear."""
    endpoints = []
    for endpoint in block.endpoints:
        headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json"}
        headers.update(endpoint.header_values())
        headers.pop(SIGNATURE_HEADER, None)
        endpoints.append(Endpoint(url=endpoint.url, headers=headers))
    return ResolvedDestination(name=name, endpoints=tuple(endpoints), secret=block.secret())


def _is_not_found(exc: BaseException) -> bool:
    if isinstance(exc, ObjectNotFound):
        return True
    # Block.aload wraps a missing document in a ValueError ("Unable to find block document named …").
    return isinstance(exc, ValueError) and "Unable to find block document" in str(exc)


class DestinationCache:
    """Loads destination blocks by name and keeps each for ``ttl`` seconds."""

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = get_settings().block_cache_seconds if ttl is None else ttl
        self._entries: dict[str, tuple[float, ResolvedDestination]] = {}

    async def get(self, name: str) -> ResolvedDestination:
        """The destination named ``name``, from the cache while fresh.

        Raises:
            DestinationNotFound: no block of that name is saved.
        """
        entry = self._entries.get(name)
        if entry is not None and (entry[0] == float("inf") or time.monotonic() - entry[0] < self.ttl):
            return entry[1]
        try:
            block = await WebhookDestination.aload(name)
        except Exception as exc:
            if _is_not_found(exc):
                raise DestinationNotFound(name) from None
            raise
        resolved = resolve(name, block)
        self._entries[name] = (time.monotonic(), resolved)
        return resolved

    def remember(self, name: str, block: WebhookDestination) -> ResolvedDestination:
        """Use ``block`` for ``name`` without loading it (an unsaved block: benchmarks, embedded use)."""
        resolved = resolve(name, block)
        # An explicitly given block stays until forgotten, whatever the TTL.
        self._entries[name] = (float("inf"), resolved)
        return resolved

    def names_for_url(self, url: str) -> list[str]:
        """The cached destinations that post to ``url``."""
        return [name for name, (_, resolved) in self._entries.items()
                if any(endpoint.url == url for endpoint in resolved.endpoints)]

    def forget(self, name: str | None = None) -> None:
        """Drop one cached destination (or all), so the next batch reads the block again."""
        if name is None:
            self._entries.clear()
        else:
            self._entries.pop(name, None)
