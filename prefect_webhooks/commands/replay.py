"""``prefect-webhooks replay``: failed (or filtered) messages back into the outbox, by destination or endpoint URL
and time window, through the replay flow; an unknown destination or URL is refused before a run is made."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Annotated

import typer

from prefect_webhooks.commands.named_blocks import named_block
from prefect_webhooks.utilities.prefect_api import exit_without_prefect_api


def time_option(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time (naive means UTC), or a duration ago such as ``2h`` or ``7d``."""
    from prefect_webhooks.utilities.durations import past_time

    if text is None:
        return None
    try:
        return past_time(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def replay(
    destination: Annotated[str | None, typer.Argument(help="Name of the WebhookDestination block.")] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Every destination with an endpoint at this URL (instead of a destination).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only messages being attempted at or after this time: ISO 8601, or 2h, 7d ago.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Only messages being attempted before this time.")] = None,
    reason_prefix: Annotated[
        str | None, typer.Option(help="Only messages whose reason starts with this: expired, permanent or disabled.")
    ] = None,
    filtered: Annotated[
        bool, typer.Option("--filtered", help="Put back messages a filter rule dropped instead of failed ones.")
    ] = False,
) -> None:
    """Put failed messages back into the outbox with a fresh deadline (the replay flow, with progress in the UI)."""
    import asyncio

    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.blocks.enabling import adestinations_with_url
    from prefect_webhooks.delivery.sending.sender import display_url
    from prefect_webhooks.flows.replay import replay as replay_flow

    if destination is None and endpoint is None:
        raise typer.BadParameter("give a destination or --endpoint URL")
    window = {"since": time_option(since, "--since"), "until": time_option(until, "--until")}
    exit_without_prefect_api("replay")
    # An unknown destination or URL is refused before a run is made: a replay of nothing would look like success.
    if destination is not None:
        with named_block("replay", "WebhookDestination", destination):
            WebhookDestination.load(destination)
    if endpoint is not None and not asyncio.run(adestinations_with_url(endpoint)):
        print(f"replay: no saved WebhookDestination has an endpoint at {display_url(endpoint)}", file=sys.stderr)
        raise typer.Exit(1)
    count = replay_flow(destination=destination, endpoint=endpoint, reason_prefix=reason_prefix, filtered=filtered,
                        **window)
    print(f"replay: {count} message(s) are pending again")
