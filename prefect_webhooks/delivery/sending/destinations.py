"""Destinations by name: saved ``WebhookDestination`` blocks, loaded with a short cache.

Outbox rows name their destination block, so an edit to the saved block (new URL, header or secret) reaches every
batch that starts after the cache entry ages out (``block_cache_seconds``).

A block that does not exist fails its messages permanently (``permanent: destination block 'x' not found``): the
outbox cannot deliver to an unknown place and retrying for four hours would only hide the mistake; ``replay`` puts
them back once the block is saved. Any other error while loading is transient: the messages are retried.

While the Prefect API cannot be reached, delivery goes on with the blocks it has (the last loaded, else the local
copy): an edit saved during an outage reaches the batches once the API answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from prefect_webhooks.blocks.api_status import PrefectApi, PrefectApiUnavailable, prefect_api
from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.disabled import disabled_positions
from prefect_webhooks.blocks.local_copy import LocalCopy
from prefect_webhooks.blocks.saved import is_missing_block, load_block
from prefect_webhooks.blocks.validated import InvalidBlockError, describe_problems
from prefect_webhooks.delivery.sending.batch_bodies import Batching, batching_of
from prefect_webhooks.delivery.sending.filters import Filters, compile_filters
from prefect_webhooks.delivery.sending.request_shape import Endpoint, endpoint_of
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing.headers import MessageSigner

logger = logging.getLogger("prefect_webhooks.delivery")


class DestinationNotFound(LookupError):
    """No saved WebhookDestination block has this name."""


class DestinationUnavailable(RuntimeError):
    """The block could not be loaded (the Prefect API cannot be reached) and no copy of it is at hand: its
    messages wait and are retried."""


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
    each_endpoint: bool = False
    """Every endpoint gets every message on its own (``store.queue.fan_out``)."""
    only: str | None = None
    """The key of the one endpoint this copy is narrowed to (a row bound to it), or None for the whole destination."""

    @property
    def lane(self) -> tuple[str, str | None]:
        """What a batch groups messages by: the destination, and the endpoint a row is bound to."""
        return self.name, self.only

    def listed(self) -> list[Endpoint]:
        """Every endpoint the block lists, disabled ones included, in the block's order."""
        return sorted((*self.endpoints, *self.disabled), key=lambda endpoint: endpoint.position)

    def endpoint_keys(self) -> list[str]:
        """The keys of every endpoint the block lists, disabled ones included, in the block's order."""
        return [endpoint.key for endpoint in self.listed()]

    def narrowed(self, key: str) -> ResolvedDestination | None:
        """This destination with only the endpoint ``key`` (enabled or disabled), or None when the block no longer
        lists it."""
        if key not in self.endpoint_keys():
            return None
        return replace(self, endpoints=tuple(e for e in self.endpoints if e.key == key),
                       disabled=tuple(e for e in self.disabled if e.key == key), only=key)


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
                               disabled=tuple(disabled), ordered=block.ordered, disable_after=block.disable_after,
                               each_endpoint=block.each_endpoint)


# How old a cached block may be for ``DestinationCache.fresh``: a second, so a destination whose every endpoint is
# disabled is read once a second at most, not once a batch.
FRESH_SECONDS = 1.0


class DestinationCache:
    """Destination blocks by name: each loaded block is used for ``ttl`` seconds, then loaded again.

    No batch waits for the Prefect API longer than ``api_wait_seconds``, and not at all while the API is known to be
    down: a block due for reloading is reloaded in the background (one load per name) and the batch waits for it only
    that long, else it goes on with the block it has. A process that has none (started during an outage) takes it
    from the local copy (``blocks.local_copy``), which every load that changed something updates.
    """

    def __init__(self, ttl: float | None = None, *, local_copy: LocalCopy | None = None) -> None:
        self.ttl = get_settings().delivery.block_cache_seconds if ttl is None else ttl
        self.local_copy = local_copy or LocalCopy("destinations")
        self._entries: dict[str, tuple[float, ResolvedDestination]] = {}
        self._loading: dict[str, asyncio.Task[ResolvedDestination]] = {}
        self._copied: dict[str, dict[str, Any]] = {}
        """What this process last read from or wrote to the local copy, by name (it rewrites only changes)."""
        self._saved_forms: dict[str, tuple[WebhookDestination, dict[str, Any]]] = {}
        """The block last loaded under each name and its serialised form (``_saved_form``)."""
        self._generations: dict[str, int | None] = {}
        """The store's count of changes of each block, as last seen (``follow``)."""
        self._held_out: dict[str, tuple[frozenset[str], float]] = {}
        """Endpoints this process is disabling, by destination: their keys, and when the block was saved so (``inf``
        while the save is under way). Only a load started after that save replaces them with the block's word."""

    async def get(self, name: str) -> ResolvedDestination:
        """The destination named ``name``: fresh from the cache, else loaded (bounded), else the last one known.

        Raises:
            DestinationNotFound: the Prefect API answered that no block of that name is saved.
            InvalidDestination: the saved block does not validate.
            DestinationUnavailable: the API cannot be reached and neither the cache nor the local copy has it.
        """
        entry = self._entries.get(name)
        if entry is not None and time.monotonic() - entry[0] < self.ttl:
            return entry[1]
        api = prefect_api()
        loading = self._load_in_background(name, api)
        if loading is not None:
            with contextlib.suppress(PrefectApiUnavailable):
                return await api.settle(loading)
        if entry is not None:
            return entry[1]
        copied = self._from_local_copy(name)
        if copied is not None:
            return copied
        raise DestinationUnavailable(f"destination block {name!r} could not be loaded: the Prefect API cannot be "
                                     "reached and no local copy holds it")

    def _load_in_background(self, name: str, api: PrefectApi) -> asyncio.Task[ResolvedDestination] | None:
        """The running load of ``name``, or a new one; None while the API is down (a probe watches for its return)."""
        if not api.reachable:
            return None
        loading = self._loading.get(name)
        if loading is not None:
            return loading
        loading = self._loading[name] = asyncio.ensure_future(self._load(name))
        api.learn(loading)
        loading.add_done_callback(lambda _done: self._loading.pop(name, None))
        return loading

    async def _load(self, name: str) -> ResolvedDestination:
        started = time.monotonic()
        try:
            block = await load_block(WebhookDestination, name)
        except Exception as exc:
            if is_missing_block(exc):
                self._entries.pop(name, None)
                self._copy(name, None)
                raise DestinationNotFound(name) from None
            if isinstance(exc, InvalidBlockError):
                raise InvalidDestination(f"destination block {name!r} is invalid: {'; '.join(exc.problems)}") from None
            raise
        held = self._held_out.get(name)
        if held is not None and started > held[1]:
            del self._held_out[name]
        resolved = self._without_held_out(resolve(name, block))
        self._entries[name] = (time.monotonic(), resolved)
        self._copy(name, self._saved_form(name, block))
        return resolved

    def _saved_form(self, name: str, block: WebhookDestination) -> dict[str, Any]:
        """``block`` as the local copy keeps it.

        Prefect's serialiser builds the block's JSON schema once per field: 80-230 ms of the event loop per call,
        every ``block_cache_seconds``, which held every send of the process meanwhile. A reload nearly always
        returns the block unchanged, so an equal block reuses the last form.
        """
        last = self._saved_forms.get(name)
        if last is not None and last[0] == block:
            return last[1]
        data = block.model_dump(mode="json", context={"include_secrets": True})
        self._saved_forms[name] = (block, data)
        return data

    def _copy(self, name: str, data: dict[str, Any] | None) -> None:
        if self._copied.get(name) != data:
            self.local_copy.update({name: data})
            if data is None:
                self._copied.pop(name, None)
            else:
                self._copied[name] = data

    def _from_local_copy(self, name: str) -> ResolvedDestination | None:
        data = self.local_copy.read().get(name)
        if data is None:
            return None
        try:
            block = WebhookDestination.model_validate(data)
        except ValidationError as exc:
            logger.warning("the local copy of destination block %r is not usable: %s", name,
                           "; ".join(describe_problems(exc, WebhookDestination.secret_field_names())))
            return None
        self._copied[name] = data
        resolved = self._without_held_out(resolve(name, block))
        # Stale at once: it is replaced as soon as the Prefect API answers.
        self._entries[name] = (float("-inf"), resolved)
        logger.warning("destination block %r taken from the local copy: the Prefect API cannot be reached", name)
        return resolved

    async def fresh(self, name: str) -> ResolvedDestination | None:
        """The destination as saved now, loaded unless the cache's copy is under ``FRESH_SECONDS`` old; None when it
        cannot be loaded now (the API away or slow, the block gone). For a decision a stale copy would get wrong."""
        entry = self._entries.get(name)
        if entry is not None and time.monotonic() - entry[0] < FRESH_SECONDS:
            return entry[1]
        api = prefect_api()
        loading = self._load_in_background(name, api)
        if loading is None:
            return None
        try:
            return await api.settle(loading)
        except Exception:
            return None

    def remember(self, name: str, block: WebhookDestination) -> ResolvedDestination:
        """Use ``block`` for ``name`` without loading it (an unsaved block: benchmarks, embedded use)."""
        resolved = resolve(name, block)
        # An explicitly given block stays until forgotten, whatever the TTL (its age, ``now - inf``, is below any TTL).
        self._entries[name] = (float("inf"), resolved)
        return resolved

    def follow(self, name: str, generation: int | None) -> None:
        """Drop the copy of ``name`` when the store counted a change of its block this cache has not seen."""
        if name in self._generations and self._generations[name] != generation:
            self._entries.pop(name, None)
        self._generations[name] = generation

    def hold_out(self, name: str, key: str) -> None:
        """Send no more to the endpoint with ``key`` from now on, while its disable is being saved: the save takes a
        Prefect API call, and meanwhile retries due in a fraction of a second would be claimed and sent again."""
        keys, _ = self._held_out.get(name, (frozenset(), 0.0))
        self._held_out[name] = (keys | {key}, float("inf"))
        entry = self._entries.get(name)
        if entry is not None:
            self._entries[name] = (entry[0], self._without_held_out(entry[1]))

    def held_out_saved(self, name: str, *, saved: bool) -> None:
        """The disable of ``name``'s held-out endpoints was saved (the next load started from now on says what the
        block says), or its save failed (``saved=False``: they get requests again at once)."""
        if not saved:
            self._held_out.pop(name, None)
        elif name in self._held_out:
            self._held_out[name] = (self._held_out[name][0], time.monotonic())
        self.forget(name)

    def _without_held_out(self, resolved: ResolvedDestination) -> ResolvedDestination:
        held = self._held_out.get(resolved.name)
        if held is None or not any(endpoint.key in held[0] for endpoint in resolved.endpoints):
            return resolved
        return replace(resolved, endpoints=tuple(e for e in resolved.endpoints if e.key not in held[0]),
                       disabled=(*resolved.disabled, *(e for e in resolved.endpoints if e.key in held[0])))

    def forget(self, name: str) -> None:
        """Drop ``name`` from the cache: the next batch loads the block again (after this process saved it)."""
        self._entries.pop(name, None)

    def names_for_url(self, url: str) -> list[str]:
        """The cached destinations that post to ``url``."""
        return [name for name, (_, resolved) in self._entries.items()
                if any(endpoint.url == url for endpoint in resolved.endpoints)]
