"""``prefect-webhooks messages``: look a message up, queued or kept, with every attempt ("we never received X").

Reads the store only (``store.lookups``): no Prefect server needed, and nothing is created.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from prefect_webhooks.commands.replay import time_option

if TYPE_CHECKING:
    from prefect_webhooks.store.lookups import StoredMessage

messages_app = typer.Typer(help="Look messages up, queued or kept, with every attempt.", no_args_is_help=True)
STATES = ("pending", "delivered", "filtered", "failed")


def _store_connection(command: str) -> Any:
    from prefect_webhooks.store.engines import StoreNotFound, open_existing_store

    try:
        return open_existing_store().connect()
    except StoreNotFound as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


def _time(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="milliseconds") if value else ""


def _document(message: StoredMessage, *, with_body: bool) -> dict[str, Any]:
    document: dict[str, Any] = {
        "id": message.id, "state": message.state, "destination": message.destination, "source": message.source,
        "type": message.message_type, "messageId": message.message_id, "userId": message.user_id,
        "reason": message.reason, "attempts": message.attempts, "created_at": _time(message.created_at),
        "first_attempt_at": _time(message.first_attempt_at),
        ("next_attempt_at" if message.state == "pending" else "finished_at"): _time(message.at),
    }
    if with_body:
        document["body"] = None if message.body is None else json.loads(message.body)
        document["tries"] = [{"attempted_at": _time(attempt.attempted_at), "url": attempt.url,
                              "status_code": attempt.status_code, "latency_ms": round(attempt.latency_ms, 1),
                              "error": attempt.error, "outcome": attempt.outcome} for attempt in message.tries]
    return document


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
    limit: Annotated[int, typer.Option(help="At most this many, newest first.", min=1)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (with bodies and attempts).")] = False,
) -> None:
    """List messages, newest first: a queued one by when it was stored, the others by when they got there."""
    from prefect_webhooks.store.lookups import MessageQuery, find_messages
    from prefect_webhooks.utilities.tables import table_text

    unknown = sorted(set(state or ()) - set(STATES))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: a state is one of {', '.join(STATES)}", param_hint="--state")
    with _store_connection("messages list") as connection:
        query = MessageQuery(message_id=message_id, user_id=user, destination=destination, states=state,
                             since=time_option(since, "--since"), until=time_option(until, "--until"))
        found = find_messages(connection, query, limit=limit)
    if as_json:
        print(json.dumps([_document(message, with_body=True) for message in found], indent=2))
        return
    print(table_text(["id", "state", "destination", "type", "user", "messageId", "at", "attempts", "reason"], [
        (m.id, m.state, m.destination, m.message_type, m.user_id or "", m.message_id or "", _time(m.at), m.attempts,
         m.reason or "") for m in found]))


@messages_app.command("show")
def messages_show(
    reference: Annotated[str, typer.Argument(help="The message's id (as in `messages list`) or its messageId.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one message: its state and reason, its body, and every attempt with the receiver's status."""
    from prefect_webhooks.store.lookups import MessageQuery, find_messages
    from prefect_webhooks.utilities.tables import table_text

    with _store_connection("messages show") as connection:
        found = find_messages(connection, MessageQuery(ids=[int(reference)]), limit=1) if reference.isdigit() else []
        found = found or find_messages(connection, MessageQuery(message_id=reference), limit=20)
    if not found:
        print(f"messages show: no message with id or messageId {reference!r} is queued or kept", file=sys.stderr)
        raise typer.Exit(1)
    for message in found:
        document = _document(message, with_body=True)
        if as_json:
            print(json.dumps(document, indent=2))
            continue
        for name in ("id", "state", "reason", "destination", "source", "type", "messageId", "userId", "attempts",
                     "created_at", "first_attempt_at", "next_attempt_at", "finished_at"):
            if name in document:
                print(f"{name}: {document[name] if document[name] is not None else ''}")
        print("body: " + (json.dumps(document["body"]) if document["body"] is not None else "(purged)"))
        print(table_text(["attempted at", "url", "status", "latency ms", "error", "outcome"], [
            (t["attempted_at"], t["url"], t["status_code"] or "", t["latency_ms"], t["error"] or "", t["outcome"])
            for t in document["tries"]]) if document["tries"] else "no attempt")
