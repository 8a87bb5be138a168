"""``prefect-webhooks endpoint``: a destination's endpoints (limits and health), enabled and disabled by hand."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from prefect_webhooks.commands.named_blocks import named_block
from prefect_webhooks.utilities.prefect_api import exit_without_prefect_api

endpoint_app = typer.Typer(help="A destination's endpoints: limits and health, enable and disable.",
                           no_args_is_help=True)
Positions = Annotated[
    list[int] | None, typer.Option("--position", help="An endpoint by position, 1 = first (repeatable).", min=1)
]


@endpoint_app.command("list")
def endpoint_list(destination: Annotated[str, typer.Argument(help="Name of the WebhookDestination block.")]) -> None:
    """Show each endpoint of a destination: rate limit, enabled or disabled, failures in a row."""
    import asyncio

    from prefect_webhooks.delivery.endpoints.admin import endpoint_views
    from prefect_webhooks.utilities.tables import table_text

    exit_without_prefect_api("endpoint list")
    with named_block("endpoint list", "WebhookDestination", destination):
        views = asyncio.run(endpoint_views(destination))
    print(table_text(["#", "url", "rate limit", "state", "failures", "failing since", "last error"], [
        (view.position, view.url, view.rate_limit, view.state, view.failures,
         f"{view.failing_since:%Y-%m-%d %H:%M:%S}" if view.failing_since else "", view.last_error or "")
        for view in views]))


@endpoint_app.command("enable")
def endpoint_enable(
    destination: Annotated[str, typer.Argument(help="Name of the WebhookDestination block.")],
    position: Positions = None,
    replay_failed: Annotated[
        bool, typer.Option("--replay", help="Also put back the messages that failed while every endpoint was off.")
    ] = False,
) -> None:
    """Enable disabled endpoints again (all of them without --position); their failure runs start afresh."""
    import asyncio

    from prefect_webhooks.delivery.endpoints.admin import aenable

    exit_without_prefect_api("endpoint enable")
    try:
        with named_block("endpoint enable", "WebhookDestination", destination):
            enabled, replayed = asyncio.run(aenable(destination, position, replay_failed))
    except ValueError as exc:
        print(f"endpoint enable: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(f"enabled endpoint(s) {enabled or 'none (none was disabled)'} of {destination}"
          + (f"; {replayed} message(s) pending again" if replay_failed else ""))


@endpoint_app.command("disable")
def endpoint_disable(
    destination: Annotated[str, typer.Argument(help="Name of the WebhookDestination block.")],
    position: Positions = None,
) -> None:
    """Disable endpoints by hand: they get no requests until enabled again."""
    import asyncio

    from prefect_webhooks.delivery.endpoints.admin import adisable

    if not position:
        raise typer.BadParameter("give at least one --position")
    exit_without_prefect_api("endpoint disable")
    try:
        with named_block("endpoint disable", "WebhookDestination", destination):
            disabled = asyncio.run(adisable(destination, position))
    except ValueError as exc:
        print(f"endpoint disable: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(f"disabled endpoint(s) {disabled or 'none (already disabled)'} of {destination}")
