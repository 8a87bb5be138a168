"""What ``prefect-webhooks endpoint`` shows and does: a destination's endpoints with their limits and health, and
enabling or disabling them (the block's ``disabled_endpoints`` and the store's health rows together)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.enabling import adisable_positions, aenable_endpoints
from prefect_webhooks.blocks.saved import load_block
from prefect_webhooks.delivery.endpoints.stats import artifact_key
from prefect_webhooks.delivery.sending.sender import display_url
from prefect_webhooks.messages.outcomes import DISABLED_REASON
from prefect_webhooks.store.endpoints.destination_changes import note_destination_changed
from prefect_webhooks.store.endpoints.states import read_states, reset_health, url_key
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.replay import replay_failed


@dataclass(frozen=True)
class EndpointView:
    """One endpoint as ``endpoint list`` shows it."""

    position: int
    url: str
    rate_limit: str
    state: str
    failures: int
    failing_since: datetime | None
    last_error: str | None
    disabled_reason: str | None = None
    paused_until: datetime | None = None
    artifact_key: str = ""
    """The key of its ``deliver`` runs' table artifacts: the Prefect UI lists its runs under it."""


async def endpoint_views(name: str) -> list[EndpointView]:
    """The endpoints of destination ``name`` with their limit, whether they are enabled, and their failure run."""
    block = await load_block(WebhookDestination, name)
    return views_of(name, block, await asyncio.to_thread(read_states, get_engine(), [name]))


def views_of(name: str, block: WebhookDestination, states: dict[tuple[str, str], Any]) -> list[EndpointView]:
    """The endpoints of ``block``, saved as ``name``, with the store's health ``states`` (``read_states``)."""
    disabled = {entry.position: entry for entry in block.disabled_endpoints}
    views = []
    for position, endpoint in enumerate(block.endpoints, start=1):
        row = states.get((name, url_key(endpoint.url)))
        limit = f"{endpoint.rate_limit:g}/s (burst {endpoint.rate_limit_burst})" if endpoint.rate_limit else "none"
        entry = disabled.get(position)
        state = f"disabled {entry.disabled_at:%Y-%m-%d %H:%M} UTC" if entry else "enabled"
        # Disabling ends the store's failure run (the batch already claimed may start another): for a disabled
        # endpoint, the run that disabled it is the one to show, and the block keeps when it began.
        failing_since = (entry.failing_since if entry else None) or (row.failing_since if row else None)
        paused = row.paused_until if row and row.paused_until > time.time() else None
        paused_until = datetime.fromtimestamp(paused, timezone.utc).replace(tzinfo=None) if paused else None
        views.append(EndpointView(position, display_url(endpoint.url), limit, state, row.failures if row else 0,
                                  failing_since, row.last_error if row else None, entry.reason if entry else None,
                                  paused_until, artifact_key(name, endpoint.url)))
    return views


async def aenable(name: str, positions: Sequence[int] | None, replay: bool) -> tuple[list[int], int]:
    """Enable endpoints of ``name`` (all disabled ones when ``positions`` is None), forget their failure runs and,
    with ``replay``, put back the messages that failed because every endpoint was disabled.

    Returns:
        The positions enabled, and how many messages were put back.
    """
    removed = await aenable_endpoints(name, positions)
    if removed:
        note_destination_changed(get_engine(), name)
    block = await load_block(WebhookDestination, name)
    keys = [url_key(block.endpoints[entry.position - 1].url) for entry in removed]
    if keys:
        reset_health(get_engine(), name, keys)
    replayed = 0
    if replay and removed:
        since = min(entry.disabled_at for entry in removed)
        replayed = replay_failed(name, reason_prefix=DISABLED_REASON.rstrip(":"), since=since)
    return [entry.position for entry in removed], replayed


async def adisable(name: str, positions: Sequence[int]) -> list[int]:
    """Disable endpoints of ``name`` by position (by hand); returns the ones newly disabled."""
    disabled = await adisable_positions(name, positions, "disabled by hand (prefect-webhooks endpoint disable)")
    if disabled:
        note_destination_changed(get_engine(), name)
    return disabled
