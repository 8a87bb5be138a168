"""``prefect-webhooks messages``: look a message up, queued or kept, with every attempt ("we never received X"),
and send it again.

Reads the store only (``store.log.lookups``; ``resend`` puts messages back into its queue): no Prefect server needed,
and no store is created; one an earlier release wrote is upgraded first (``commands.opened_store``).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prefect_webhooks.commands.opened_store import opened_store
from prefect_webhooks.commands.replay import time_option

if TYPE_CHECKING:
    from prefect_webhooks.store.log.lookups import StoredMessage

messages_app = typer.Typer(help="Look messages up, queued or kept, with every attempt; send them again.",
                           no_args_is_help=True)
STATES = ("pending", "delivered", "filtered", "failed")


def _store_connection(command: str) -> Any:
    return opened_store(command).connect()


@messages_app.command("list")
def messages_list(
    destination: Annotated[str | None, typer.Option(help="Only messages of this destination block.")] = None,
    user: Annotated[str | None, typer.Option(help="Only messages about this user (userId or anonymousId).")] = None,
    message_id: Annotated[str | None, typer.Option("--message-id", help="Only messages with this messageId.")] = None,
    state: Annotated[
        list[str] | None, typer.Option(help=f"Only messages in this state ({', '.join(STATES)}; repeatable).")
    ] = None,
    since: Annotated[str | None, typer.Option(help="Only from this time on: ISO 8601, or 2h, 7d ago.")] = None,
    until: Annotated[str | None, typer.Option(help="Only before this time.")] = None,
    reason_prefix: Annotated[str | None, typer.Option(help="Only messages whose reason starts with this.")] = None,
    endpoint: Annotated[str | None, typer.Option(help="Only messages with an attempt to this URL (or below).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.", min=1)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (with bodies and attempts).")] = False,
) -> None:
    """List messages, newest first: a queued one by when it was stored, the others by when they got there."""
    from prefect_webhooks.store.log.lookups import MessageQuery, message_document, time_text
    from prefect_webhooks.store.log.message_search import SCAN_LIMIT, Refinement, search_messages
    from prefect_webhooks.utilities.tables import table_text

    unknown = sorted(set(state or ()) - set(STATES))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: a state is one of {', '.join(STATES)}", param_hint="--state")
    with _store_connection("messages list") as connection:
        query = MessageQuery(message_id=message_id, user_id=user, destination=destination, states=state,
                             since=time_option(since, "--since"), until=time_option(until, "--until"))
        page = search_messages(connection, query, Refinement(reason_prefix, endpoint), limit=limit)
    found = page.messages
    if page.resume_at is not None and len(found) < limit:
        print(f"messages list: read the newest {SCAN_LIMIT:,} messages the other filters match; narrow the search "
              "with --destination, --since or --until to find older ones", file=sys.stderr)
    if as_json:
        print(json.dumps([message_document(message) for message in found], indent=2))
        return
    print(table_text(["id", "state", "destination", "type", "user", "messageId", "at", "attempts", "reason"], [
        (m.id, m.state, m.destination, m.message_type, m.user_id or "", m.message_id or "", time_text(m.at),
         m.attempts, m.reason or "") for m in found]))


@messages_app.command("show")
def messages_show(
    reference: Annotated[str, typer.Argument(help="The message's id (as in `messages list`) or its messageId.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    request: Annotated[bool, typer.Option("--request", help=(
        "Also print the request as it is sent to each endpoint now (loads the destination block from the Prefect "
        "API): method, URL, headers with secrets masked, signatures, body."))] = False,
) -> None:
    """Show one message: its state and reason, its body, and every attempt with the receiver's status and answer."""
    from prefect_webhooks.store.engine.engines import store_key
    from prefect_webhooks.store.log.lookups import MessageQuery, find_messages, message_document
    from prefect_webhooks.utilities.tables import table_text

    with _store_connection("messages show") as connection:
        found = find_messages(connection, MessageQuery(ids=[int(reference)]), limit=1) if reference.isdigit() else []
        found = found or find_messages(connection, MessageQuery(message_id=reference), limit=20)
        key = store_key(connection.engine)
    if not found:
        print(f"messages show: no message with id or messageId {reference!r} is queued or kept", file=sys.stderr)
        raise typer.Exit(1)
    for message in found:
        document = message_document(message)
        if request:
            document["requests"] = _requests_as_sent(message, key)
        if as_json:
            print(json.dumps(document, indent=2))
            continue
        for name in ("id", "state", "reason", "destination", "source", "type", "messageId", "userId", "attempts",
                     "created_at", "first_attempt_at", "next_attempt_at", "finished_at"):
            if name in document:
                print(f"{name}: {document[name] if document[name] is not None else ''}")
        print("body: " + (json.dumps(document["body"]) if document["body"] is not None else "(purged)"))
        print(table_text(["#", "attempted at", "url", "status", "latency ms", "error", "outcome"], [
            (number, t["attempted_at"], t["url"], t["status_code"] or "", t["latency_ms"], t["error"] or "",
             t["outcome"]) for number, t in enumerate(document["tries"], 1)]) if document["tries"] else "no attempt")
        for number, attempt in enumerate(document["tries"], 1):
            if attempt["response"]:
                print(f"answer to attempt {number}: {attempt['response']}")
        for shown in document.get("requests", []):
            print(f"\n{shown}")


def _requests_as_sent(message: StoredMessage, key: str) -> list[str]:
    """The requests ``message`` makes now (its destination block as saved, its own id), secrets masked."""
    from prefect_webhooks.blocks.destination import WebhookDestination
    from prefect_webhooks.commands.named_blocks import named_block
    from prefect_webhooks.delivery.endpoints.preview import stored_message_requests

    if message.body is None:
        return stored_message_requests(None, None, message.id, key)
    with named_block("messages show", "WebhookDestination", message.destination):
        block = WebhookDestination.load(message.destination)
    return stored_message_requests(block, message.body, message.id, key, message.endpoint)


@messages_app.command("resend")
def messages_resend(
    ids: Annotated[list[int], typer.Argument(help="The messages' ids (as in `messages list`).")],
) -> None:
    """Send delivered or failed messages again, while they are kept: each goes back into the queue with its id (the
    receiver sees the same webhook id), due now, signed with the destination's current secret when it is sent, and
    its new attempt is added to those it had. Exits 1 when any id could not be sent again, saying why."""
    from prefect_webhooks.store.queue.replay import RESENT, resend_messages

    outcomes = resend_messages(ids, engine=opened_store("messages resend"))
    for number, outcome in outcomes.items():
        print(f"{number}: {outcome}", file=sys.stdout if outcome == RESENT else sys.stderr)
    if any(outcome != RESENT for outcome in outcomes.values()):
        raise typer.Exit(1)
