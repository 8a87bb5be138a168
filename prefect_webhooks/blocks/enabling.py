"""Disabling and enabling a destination's endpoints in its saved block (``disabled_endpoints``).

Delivery disables an endpoint that failed for the destination's ``disable_after``; ``prefect-webhooks endpoint
enable`` (or removing the entry in the block's form) enables it again. Each change loads the block, changes only
that list and saves it, so an edit made meanwhile to anything else in the block is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.disabled import DisabledEndpoint
from prefect_webhooks.blocks.saved import load_block, save_block, saved_documents


def _positions_of(block: WebhookDestination, url: str | None) -> list[int]:
    """The positions (from 1) of ``block``'s endpoints with ``url``, or of all its endpoints when None."""
    return [position for position, endpoint in enumerate(block.endpoints, start=1) if url in (None, endpoint.url)]


async def adisable_endpoint(name: str, url: str, reason: str, at: datetime | None = None,
                            failing_since: datetime | None = None) -> int | None:
    """Add the endpoint with ``url`` to the block's disabled endpoints and save it.

    Returns:
        Its position, or None when the block no longer has that URL or it is already disabled.
    """
    block = await load_block(WebhookDestination, name)
    disabled = {entry.position for entry in block.disabled_endpoints}
    positions = [position for position in _positions_of(block, url) if position not in disabled]
    if not positions:
        return None
    at = at or datetime.now(timezone.utc)
    if failing_since is not None and failing_since.tzinfo is None:
        failing_since = failing_since.replace(tzinfo=timezone.utc)  # the store's times are naive UTC
    block.disabled_endpoints = [*block.disabled_endpoints,
                                *(DisabledEndpoint(position=p, disabled_at=at, reason=reason,
                                                   failing_since=failing_since) for p in positions)]
    await save_block(block, name, overwrite=True)
    return positions[0]


async def aenable_endpoints(name: str, positions: Sequence[int] | None = None) -> list[DisabledEndpoint]:
    """Remove endpoints from the block's disabled endpoints (all when ``positions`` is None) and save it.

    Raises:
        ValueError: a position the destination does not have.

    Returns:
        The entries removed.
    """
    block = await load_block(WebhookDestination, name)
    for position in positions or ():
        if not 1 <= position <= len(block.endpoints):
            raise ValueError(f"destination {name!r} has no endpoint {position} (it has {len(block.endpoints)})")
    chosen = set(positions) if positions is not None else None
    removed = [entry for entry in block.disabled_endpoints if chosen is None or entry.position in chosen]
    if removed:
        block.disabled_endpoints = [entry for entry in block.disabled_endpoints if entry not in removed]
        await save_block(block, name, overwrite=True)
    return removed


async def adisable_positions(name: str, positions: Sequence[int], reason: str) -> list[int]:
    """Disable endpoints by position (a user's choice, e.g. for maintenance); returns the newly disabled ones."""
    block = await load_block(WebhookDestination, name)
    disabled = {entry.position for entry in block.disabled_endpoints}
    added = []
    for position in positions:
        if not 1 <= position <= len(block.endpoints):
            raise ValueError(f"destination {name!r} has no endpoint {position} (it has {len(block.endpoints)})")
        if position not in disabled:
            added.append(DisabledEndpoint(position=position, disabled_at=datetime.now(timezone.utc), reason=reason))
            disabled.add(position)
    if added:
        block.disabled_endpoints = [*block.disabled_endpoints, *added]
        await save_block(block, name, overwrite=True)
    return [entry.position for entry in added]


async def adestinations_with_url(url: str) -> list[str]:
    """The names of the saved destinations that have an endpoint with ``url`` (read with secrets: URLs are)."""
    documents = await saved_documents(WebhookDestination.get_block_type_slug(), include_secrets=True)
    return sorted(document.name for document in documents
                  if any(isinstance(endpoint, dict) and endpoint.get("url") == url
                         for endpoint in document.data.get("endpoints") or []))
