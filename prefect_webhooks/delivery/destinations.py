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
from datetime import timedelta

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.disabled import disabled_positions
from prefect_webhooks.blocks.saved import is_missing_block, load_block
from prefect_webhooks.blocks.validated import InvalidBlockError
from prefect_webhooks.delivery.batch_bodies import Batching, batching_of
from prefect_webhooks.delivery.filters import Filters, compile_filters
from prefect_webhooks.delivery.request_shape import Endpoint, endpoint_of
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing.headers import MessageSigner


class DestinationNotFound(LookupError):
    """No saved WebhookDestination block has this name."""


class InvalidDestination(ValueError):
    """A saved block that does not validate (e.g. a filter rule saved through the API with an unknown field).

    Its messages wait (they are retried) until the block is fixed; the message says what is wrong, with
    the value of each field that is not secret.
    """


@dataclass(frozen=True, slots=True)
class ResolvedDestination:
    """A destination block reduced to what sending needs."""

    name: str
    endpoints: tuple[Endpoint, ...]
    signer: MessageSigner
    filters: Filters | None = None
    batching: Batching | None = None
    disabled: tuple[Endpoint, ...] = ()
    """Endpoints the block lists as disabled: they get no requests (not in ``endpoints``)."""
    ordered: bool = False
    disable_after: timedelta | None = None


def resolve(name: str, block: WebhookDestination) -> ResolvedDestination:
    """Prepare a loaded block for sending: each endpoint ready to send to (``request_shape``), those the block
    lists as disabled apart, its signer (secrets in the clear), its compiled filters and its batching options."""
    ca_file = get_settings().delivery.tls_ca_file or None
    off = disabled_positions(block.disabled_endpoints)
    endpoints, disabled = [], []
    for position, endpoint in enumerate(block.endpoints, start=1):
        (disabled if position in off else endpoints).append(endpoint_of(endpoint, ca_file, position))
    return ResolvedDestination(name=name, endpoints=tuple(endpoints), signer=MessageSigner.for_block(block),
                               filters=compile_filters(block.filters), batching=batching_of(block),
                               disabled=tuple(disabled), ordered=block.ordered, disable_after=block.disable_after)


class DestinationCache:
    """Loads destination blocks by name and keeps each for ``ttl`` seconds."""

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = get_settings().delivery.block_cache_seconds if ttl is None else ttl
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
            block = await load_block(WebhookDestination, name)
        except Exception as exc:
            if is_missing_block(exc):
                raise DestinationNotFound(name) from None
            if isinstance(exc, InvalidBlockError):
                raise InvalidDestination(f"destination block {name!r} is invalid: {'; '.join(exc.problems)}") from None
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

    def forget(self, name: str) -> None:
        """Drop ``name`` from the cache: the next batch loads the block again (after this process saved it)."""
        self._entries.pop(name, None)

    def names_for_url(self, url: str) -> list[str]:
        """The cached destinations that post to ``url``."""
        return [name for name, (_, resolved) in self._entries.items()
                if any(endpoint.url == url for endpoint in resolved.endpoints)]
